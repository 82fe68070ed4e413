"""Prometheus metrics of a stage worker. Labels are stage names and fixed vocabularies only."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, start_http_server

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


@dataclass(frozen=True)
class _Families:
    processed: Counter
    errors: Counter
    dlq: Counter
    retries: Counter
    queue_depth: Gauge
    queue_depth_peak: Gauge
    queue_bound: Gauge
    paused: Gauge
    pauses: Counter
    in_flight: Gauge
    service: Histogram
    queue_wait: Histogram
    commits: Counter
    lag: Gauge
    dozes: Counter
    unrung: Counter


def _families(registry: CollectorRegistry) -> _Families:
    s = ("stage",)
    return _Families(
        processed=Counter("llmpipe_records_processed", "records finished, by outcome", s + ("outcome",), registry=registry),
        errors=Counter("llmpipe_errors", "record failures, by error class", s + ("error_class",), registry=registry),
        dlq=Counter("llmpipe_dlq_records", "records sent to the DLQ", s + ("error_class",), registry=registry),
        retries=Counter("llmpipe_retries", "processing retries of transient failures", s, registry=registry),
        queue_depth=Gauge("llmpipe_queue_depth", "records in the in-process queue", s, registry=registry),
        queue_depth_peak=Gauge("llmpipe_queue_depth_peak", "highest queue depth seen", s, registry=registry),
        queue_bound=Gauge("llmpipe_queue_bound", "configured queue bound", s, registry=registry),
        paused=Gauge("llmpipe_paused", "1 while the worker has paused its partitions", s, registry=registry),
        pauses=Counter("llmpipe_pauses", "times the worker paused for backpressure", s, registry=registry),
        in_flight=Gauge("llmpipe_in_flight", "records taken from the queue, not yet done", s, registry=registry),
        service=Histogram("llmpipe_service_seconds", "processing time per record", s, buckets=_LATENCY_BUCKETS,
                          registry=registry),
        queue_wait=Histogram("llmpipe_queue_seconds", "record timestamp to processing start", s,
                             buckets=_LATENCY_BUCKETS, registry=registry),
        commits=Counter("llmpipe_offset_commits", "offset commits", s, registry=registry),
        lag=Gauge("llmpipe_consumer_lag", "highwater minus position (approximate on the embedded broker)",
                  s + ("partition",), registry=registry),
        dozes=Counter("llmpipe_doorbell_dozes", "doorbell dozes of the consumer, by how they ended (rung, timeout)",
                      s + ("ended",), registry=registry),
        unrung=Counter("llmpipe_doorbell_unrung", "fetches whose records came without a ring: a producer outside "
                       "the doorbell (runtime/wakeup/doorbell.py, step 5)", s, registry=registry),
    )


_BY_REGISTRY: dict[int, _Families] = {}


class StageMetrics:
    """The metric children of one stage; families are shared per registry (one process, many stages)."""

    def __init__(self, stage: str, registry: CollectorRegistry = REGISTRY) -> None:
        fam = _BY_REGISTRY.get(id(registry))
        if fam is None:
            fam = _BY_REGISTRY[id(registry)] = _families(registry)
        self.stage = stage
        self.f = fam
        self.queue_depth = fam.queue_depth.labels(stage)
        self.queue_depth_peak = fam.queue_depth_peak.labels(stage)
        self.queue_bound = fam.queue_bound.labels(stage)
        self.paused = fam.paused.labels(stage)
        self.pauses = fam.pauses.labels(stage)
        self.in_flight = fam.in_flight.labels(stage)
        self.service = fam.service.labels(stage)
        self.queue_wait = fam.queue_wait.labels(stage)
        self.retries = fam.retries.labels(stage)
        self.commits = fam.commits.labels(stage)
        self.unrung = fam.unrung.labels(stage)
        self._peak = 0

    def processed(self, outcome: str, n: int = 1) -> None:
        self.f.processed.labels(self.stage, outcome).inc(n)

    def error(self, error_class: str) -> None:
        self.f.errors.labels(self.stage, error_class).inc()

    def dead_lettered(self, error_class: str) -> None:
        self.f.dlq.labels(self.stage, error_class).inc()

    def depth(self, n: int) -> None:
        self.queue_depth.set(n)
        if n > self._peak:
            self._peak = n
            self.queue_depth_peak.set(n)

    def dozed(self, rang: bool) -> None:
        self.f.dozes.labels(self.stage, "rung" if rang else "timeout").inc()

    def lag(self, partition: int, value: int) -> None:
        self.f.lag.labels(self.stage, str(partition)).set(value)


def serve_metrics(port: int, host: str = "127.0.0.1") -> int:
    """Expose the process registry over HTTP on host:port (0 = any free port); returns the port."""
    server, _thread = start_http_server(port, addr=host)
    return server.server_address[1]


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank percentile of `values` (None when empty), rounded to 0.01."""
    if not values:
        return None
    s = sorted(values)
    k = min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))
    return round(s[k], 2)
