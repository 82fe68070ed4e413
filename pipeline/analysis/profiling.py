"""`llmpipe profile --stage generate`: a torch-profiler trace of the engine under a fixed traffic
shape, with the profiler's own cost measured against a control run of the same traffic.

Protocol (one engine, one process, nothing else changes between the runs):
  1. start the engine with vLLM's torch profiler configured (it runs inside the engine core);
  2. warm up for `warmup_s` (first batches, allocator growth), not measured;
  3. control: `seconds` of closed-loop traffic (`concurrency` clients, fixed prompts) unprofiled;
  4. profiled: the same traffic for the same time between start_profile and stop_profile;
  5. overhead = 1 - profiled output tokens/s ÷ control output tokens/s;
  6. the trace file (Chrome trace JSON, gzip) lands in DATA_DIR/profiles/<run_id>/ and one row in
     `profile_runs` describes the run (model, runtime, hardware, traffic, both runs, top ops).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from pipeline.contracts.profile import ProfileRun
from pipeline.engines.chat_engine import Sampling
from pipeline.engines.hardware import hardware
from pipeline.engines.provenance import runtime_versions

PROMPTS = ["What is the capital of France?", "Write one sentence about the sea.", "List three fruits.",
           "How do I reset my password?", "영업시간이 어떻게 되나요?", "Explain what a cache is.",
           "Say hello in Spanish.", "Name a famous painter."]


@dataclass
class Window:
    """Closed-loop traffic over one window: what the engine completed in it."""

    requests: int = 0
    tokens_out: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> dict[str, float]:
        lat = sorted(self.latencies_ms)
        return {"requests": float(self.requests), "tokens_out": float(self.tokens_out),
                "tokens_per_s": round(self.tokens_out / self.seconds, 2) if self.seconds else 0.0,
                "requests_per_s": round(self.requests / self.seconds, 3) if self.seconds else 0.0,
                "latency_p50_ms": round(lat[len(lat) // 2], 1) if lat else 0.0,
                "seconds": round(self.seconds, 2)}


async def closed_loop(engine, seconds: float, concurrency: int, sampling: Sampling) -> Window:
    """`concurrency` clients each sending the next prompt as soon as the last is answered; only
    requests finished inside the window count (their tokens too)."""
    w = Window()
    start = time.perf_counter()
    end = start + seconds

    async def client(i: int) -> None:
        n = i
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            g = await engine.generate([{"role": "user", "content": PROMPTS[n % len(PROMPTS)]}], sampling)
            n += concurrency
            if time.perf_counter() <= end:
                w.requests += 1
                w.tokens_out += g.tokens_out
                w.latencies_ms.append((time.perf_counter() - t0) * 1000)

    await asyncio.gather(*(client(i) for i in range(concurrency)))
    w.seconds = seconds
    return w


def top_ops(trace: Path, n: int = 15) -> list[tuple[str, float, int]]:
    """The trace's CPU ops by total duration (ms) and call count: what the engine spent time in."""
    opener = gzip.open if trace.suffix == ".gz" else open
    with opener(trace, "rt") as f:
        events = json.load(f).get("traceEvents", [])
    total: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for ev in events:
        if ev.get("ph") == "X" and ev.get("cat") in ("cpu_op", "user_annotation", "kernel"):
            total[ev["name"]] += float(ev.get("dur", 0)) / 1000
            calls[ev["name"]] += 1
    ranked = sorted(total.items(), key=lambda kv: -kv[1])[:n]
    return [(name, round(ms, 3), calls[name]) for name, ms in ranked]


def newest_trace(directory: Path, since: float) -> Path:
    files = [p for p in directory.rglob("*") if p.is_file() and p.stat().st_mtime >= since and
             (p.name.endswith(".json") or p.name.endswith(".json.gz"))]
    if not files:
        raise RuntimeError(f"the profiler wrote no trace under {directory}")
    return max(files, key=lambda p: p.stat().st_size)


async def profile_generate(settings, *, seconds: float, warmup_s: float, concurrency: int,
                           max_tokens: int, say=lambda msg: None) -> ProfileRun:
    from pipeline.engines.model_prep import resolve
    from pipeline.engines.vllm_engine import VllmEngine

    run_id = uuid.uuid4().hex[:12]
    out_dir = settings.resolved_data_dir() / "profiles" / run_id
    out_dir.mkdir(parents=True, exist_ok=True)
    model_dir, revision = await asyncio.to_thread(resolve, settings.resolved_data_dir(), settings.engine.model_dir,
                                                  settings.engine.dtype)
    es = settings.engine
    say(f"starting the engine ({model_dir.name}, revision {revision}) with the torch profiler configured")
    engine = await VllmEngine(model_dir, revision=revision, cache_dir=settings.resolved_data_dir() / "cache",
                              dtype=es.dtype, max_model_len=es.max_model_len, max_num_seqs=es.max_num_seqs,
                              profiler_dir=out_dir).start()
    sampling = Sampling(max_tokens=max_tokens, temperature=0.0)
    started = datetime.now(UTC)
    try:
        say(f"warm-up {warmup_s:.0f}s")
        await closed_loop(engine, warmup_s, concurrency, sampling)
        say(f"control run {seconds:.0f}s (no profiler)")
        control = await closed_loop(engine, seconds, concurrency, sampling)
        say(f"profiled run {seconds:.0f}s")
        t_mark = time.time() - 1
        await engine.start_profile()
        profiled = await closed_loop(engine, seconds, concurrency, sampling)
        await engine.stop_profile()
        trace = await asyncio.to_thread(newest_trace, out_dir, t_mark)
        ops = await asyncio.to_thread(top_ops, trace)
    finally:
        await engine.stop()
    c, p = control.summary(), profiled.summary()
    overhead = 100 * (1 - p["tokens_per_s"] / c["tokens_per_s"]) if c["tokens_per_s"] else 0.0
    return ProfileRun(
        run_id=run_id, stage="generate", started=started, seconds=seconds, warmup_s=warmup_s,
        model=model_dir.name, model_revision=revision, runtime=runtime_versions() | {"engine": "vllm AsyncLLM v1",
                                                                                     "dtype": es.dtype},
        hardware=hardware(), traffic={"concurrency": float(concurrency), "max_tokens": float(max_tokens),
                                      "prompts": float(len(PROMPTS)), "temperature": 0.0},
        control=c, profiled=p, overhead_pct=round(overhead, 2), trace_path=str(trace), top_ops=ops)
