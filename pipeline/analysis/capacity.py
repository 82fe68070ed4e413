"""Capacity arithmetic for operators: how many workers, partitions and engine replicas a request
rate needs, from measured cost per request of each stage.

A stage worker is one process on about one core. A stage that spends `ms` of a worker per request
visit, visited by a `share` of requests, needs rate x share x ms / 1000 cores at full use; the plan
keeps each worker at `utilization` (0.7: headroom for bursts and rebalances). A consumer group uses
at most one worker per partition, so a stage's input topic needs at least as many partitions as it
has workers; with today's partitions the stage tops out at partitions x utilization / (share x s).
The limiting stage is the one that tops out first. Stages chained in one worker (docs/design.md,
"Stage chains") are planned as one: their costs add up in the chain's worker, whose group scales on
the first stage's partitions. Engine replicas: rate x output tokens per
request / tokens per second of one replica (its measured continuous-batching throughput).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class StageCost:
    stage: str
    ms_per_visit: float  # worker time (CPU, or busy time) per request that reaches the stage
    share: float = 1.0  # share of requests that reach it (cache hits skip generate, text skips vision)
    partitions: int | None = None  # partitions of its input topic today (None: not a consumer group here)


@dataclass(frozen=True)
class StagePlan:
    stage: str
    ms_per_request: float
    workers: int
    partitions_now: int | None
    partitions_needed: int | None
    top_rps_now: float | None  # the rate this stage carries with today's partitions, one worker each


@dataclass
class Plan:
    rate: float
    utilization: float
    stages: list[StagePlan]
    limiting_stage: str | None
    top_rps_now: float | None
    cores: float
    engine_replicas: int | None = None
    notes: list[str] = field(default_factory=list)


def plan(rate: float, costs: list[StageCost], *, utilization: float = 0.7, engine_tok_s: float | None = None,
         tokens_per_request: float | None = None) -> Plan:
    if rate <= 0:
        raise ValueError("the rate must be positive")
    if not 0 < utilization <= 1:
        raise ValueError("utilization must be in (0, 1]")
    rows = []
    for c in costs:
        if c.ms_per_visit < 0 or not 0 <= c.share <= 1:
            raise ValueError(f"stage {c.stage}: cost must be >= 0 and share in [0, 1]")
        per_request_s = c.share * c.ms_per_visit / 1000
        workers = max(1, math.ceil(rate * per_request_s / utilization - 1e-9))
        top = (c.partitions * utilization / per_request_s if per_request_s > 0 else math.inf) \
            if c.partitions is not None else None
        rows.append(StagePlan(c.stage, round(per_request_s * 1000, 3), workers, c.partitions,
                              None if c.partitions is None else max(c.partitions, workers),
                              None if top is None else (round(top, 1) if math.isfinite(top) else None)))
    grouped = [r for r in rows if r.top_rps_now is not None]
    limiting = min(grouped, key=lambda r: r.top_rps_now) if grouped else None  # type: ignore[arg-type,return-value]
    out = Plan(rate, utilization, rows, limiting.stage if limiting else None,
               limiting.top_rps_now if limiting else None,
               round(sum(r.workers for r in rows), 1))
    if engine_tok_s is not None:
        if engine_tok_s <= 0 or not tokens_per_request or tokens_per_request <= 0:
            raise ValueError("engine replicas need a positive --engine-tok-s and tokens per request")
        out.engine_replicas = max(1, math.ceil(rate * tokens_per_request / engine_tok_s - 1e-9))
    for r in rows:
        if r.partitions_now is not None and r.partitions_needed and r.partitions_needed > r.partitions_now:
            out.notes.append(f"stage.{r.stage}: {r.workers} workers need {r.partitions_needed} partitions "
                             f"(today {r.partitions_now}); raise them before the rate arrives: adding partitions "
                             f"moves keys, so a keyed stage's state must be restored")
    return out


def costs_from_bench(result: dict, system: str, partitions: dict[str, int]) -> list[StageCost]:
    """CPU ms per request per process from a bench/peer_bench.py result (its last stdout line): the
    system's highest rate that kept up (else its highest rate)."""
    rows = (result.get("systems") or {}).get(system) or []
    if not rows:
        raise ValueError(f"the bench result has no rows for system {system!r}")
    kept = [r for r in rows if r.get("kept_up")] or rows
    row = max(kept, key=lambda r: r["rate"])
    ok = row.get("ok") or 0
    if ok <= 0:
        raise ValueError(f"system {system!r} answered nothing at {row['rate']} req/s")
    costs = []
    for owner, cpu_s in row["cpu_s_by_process"].items():
        if owner == "mock upstream":
            continue
        costs.append(StageCost(owner, 1000 * cpu_s / ok, 1.0, partitions.get(owner)))
    return sorted(costs, key=lambda c: -c.ms_per_visit)


def costs_from_capacity(rows: list[dict], partitions: dict[str, int]) -> list[StageCost]:
    """Busy ms per visit from the warehouse's stage_capacity query (a worker's time, not only CPU)."""
    out = []
    for r in rows:
        per_worker = r.get("capacity_per_worker_rps")
        if not per_worker:
            continue
        out.append(StageCost(r["stage"], 1000 / per_worker, min(1.0, float(r.get("visit_share") or 1.0)),
                             partitions.get(r["stage"])))
    return out


def chain_costs(costs: list[StageCost], chains: dict[str, list[str]]) -> list[StageCost]:
    """Per-stage costs folded into their chains' workers (`chains`: first stage -> its stages): a chain
    costs the sum of its stages' worker time per request and is named `mask+cache`."""
    by_stage = {c.stage: c for c in costs}
    out = []
    for head, members in chains.items():
        present = [by_stage[m] for m in members if m in by_stage]
        if not present:
            continue
        ms = sum(c.share * c.ms_per_visit for c in present)
        partitions = by_stage[head].partitions if head in by_stage else present[0].partitions
        out.append(StageCost("+".join(c.stage for c in present), ms, 1.0, partitions))
    grouped = {m for members in chains.values() for m in members}
    return out + [c for c in costs if c.stage not in grouped]
