-- One row per `llmpipe profile` run: what was profiled, under which traffic, and what profiling
-- itself cost (measured against a control run without the profiler). The trace file lies next to
-- the warehouse, named by `trace_path`.
CREATE TABLE IF NOT EXISTS profile_runs
(
    run_id              String,
    stage               LowCardinality(String),
    started             DateTime64(3, 'UTC'),
    seconds             Float64,
    warmup_s            Float64,
    model               String,
    model_revision      String,
    runtime             Map(String, String),
    hardware            Map(String, String),
    traffic             Map(String, Float64),
    control             Map(String, Float64),
    profiled            Map(String, Float64),
    overhead_pct        Float64,
    trace_path          String,
    top_ops             Array(Tuple(name String, self_cpu_ms Float64, calls UInt64)),
    inserted            DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(inserted)
ORDER BY (run_id);
