"""The analyst report: the shipped queries in schemas/clickhouse/queries/ run over a time window,
assembled into one document with the pipeline's bottleneck named. Every number comes from one of
those queries, so an analyst can rerun any section with `llmpipe sql --file … --param since=…`."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipeline.contracts.resources import clickhouse_migrations_dir
from pipeline.stores.sql_gateway import jsonable

Query = Callable[[str, dict[str, Any]], Any]  # (sql, parameters) -> result with .columns and .rows


@dataclass(frozen=True)
class Section:
    name: str  # the query file's stem
    title: str
    meaning: str  # what the numbers mean, for the reader


SECTIONS = [
    Section("offered_rate", "Offered load", "requests created in the window and their rate (requests/s)"),
    Section("stage_latency", "Stages: queue and service time",
            "per stage: records decided, time waiting in the stage's queue and being processed (ms), and "
            "records/s over the window"),
    Section("stage_capacity", "Stages: measured capacity (bottleneck first)",
            "what each stage completes per second while busy, × its workers; divided by the share of requests "
            "that visit it, the request rate it can carry. The first row limits the pipeline"),
    Section("request_latency", "Latency callers saw",
            "TTFT: time to the first token; TPOT: time per further output token; E2E: creation to answer (ms)"),
    Section("stream_latency", "Streaming: what callers saw vs the engine",
            "streamed answers: front door receive to first text chunk and the gaps between chunks, beside the "
            "engine's TTFT and time per token for the same requests (ms); disconnected callers were cancelled"),
    Section("cache_by_domain", "Cache by domain",
            "hits are served from the cache; shadow hits are looked up and not served; the false-hit estimate "
            "is the share of shadow hits whose cached answer disagreed with the model's"),
    Section("cache_feedback", "Callers on cached answers",
            "boolean feedback on answers the cache served vs on generated answers, per domain: a false-hit "
            "signal from callers, beside the shadow estimate above"),
    Section("route_mix", "Routes and cost", "requests, tokens and cost (USD) per route"),
    Section("experiment_variants", "Experiments",
            "per variant: requests, episodes, cost and latency, and each numeric feedback metric's mean with "
            "its 95 % confidence interval"),
    Section("feedback_by", "Feedback by what made the answer",
            "numeric feedback by route, adapter, actor revision, deployment, cache status, route policy and "
            "variant: count, mean (boolean: share of true), 95 % half-width"),
    Section("rejections", "Rejections and errors", "requests not answered ok: why, and which stage answered"),
    Section("retries_fallbacks", "Retries and fallbacks",
            "generations that needed more than one engine attempt, the latency that added, the prompt tokens "
            "sent again"),
    Section("tool_calls", "Tool calls", "calls the answers carried, by tool, tenant and route"),
    Section("tool_checks", "Tool decisions",
            "requests whose tools route narrowed (offered and kept on average); requests refused for a tool "
            "their key may not offer (mask's; the door's 403s publish nothing); calls found invalid or "
            "refused before they left; deployments skipped for serving no tool calls"),
    Section("models", "Requested vs executed model", "the model a caller asked for and the model that ran it"),
    Section("stack_events", "Stack events",
            "the embedded broker restarted (requests in flight then got no pipeline answer: their callers got "
            "503 or 504 from the door) or a worker process was restarted, with its exit code; newest first"),
    Section("rl_operations", "RL operations",
            "rollout samples and generated tokens/s, sample completion rate, and what trainers consumed: queue "
            "age p50/p95 (ms), trainer idle share, stale samples dropped or flagged"),
    Section("rollouts_by_revision", "Rollouts by actor revision",
            "samples made, mean score, consumed and dropped as stale, and seconds from the revision going active "
            "to its first sample"),
]


def queries_dir() -> Path:
    return clickhouse_migrations_dir() / "queries"


def sql_from_file(path: Path) -> str:
    """A query file's statement: its `--` comment lines document it and are left out."""
    return "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("--")).strip()


def query_text(name: str) -> str:
    return sql_from_file(queries_dir() / f"{name}.sql")


def _finite(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v  # quantiles of nothing are nan


def run_query(query: Query, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    res = query(sql, params)
    return [dict(zip(res.columns, (_finite(v) for v in jsonable(list(r))))) for r in res.rows]


def since_param(since: datetime) -> str:
    """The `since` parameter of the shipped queries: UTC, as ClickHouse parses a DateTime64(3)."""
    return since.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def bottleneck(capacity: list[dict[str, Any]], offered: dict[str, Any] | None) -> dict[str, Any] | None:
    """The stage with the least request capacity, and how close the offered rate came to it."""
    rows = [r for r in capacity if r.get("request_capacity_rps") is not None]
    if not rows:
        return None
    worst = min(rows, key=lambda r: r["request_capacity_rps"])
    rate = (offered or {}).get("offered_rps") or 0.0
    cap = worst["request_capacity_rps"]
    return {"stage": worst["stage"], "pipeline_capacity_rps": cap, "offered_rps": rate,
            "utilisation": round(rate / cap, 4) if cap else None,
            "headroom_rps": round(cap - rate, 2)}


def build_report(query: Query, since: datetime) -> dict[str, Any]:
    params = {"since": since_param(since)}
    doc: dict[str, Any] = {"since": params["since"], "sections": {}}
    for sec in SECTIONS:
        doc["sections"][sec.name] = run_query(query, query_text(sec.name), params)
    offered = doc["sections"]["offered_rate"]
    doc["bottleneck"] = bottleneck(doc["sections"]["stage_capacity"], offered[0] if offered else None)
    return doc


def bottleneck_sentence(b: dict[str, Any] | None) -> str:
    if b is None:
        return "No stage decisions in this window: nothing to measure yet."
    util = b["utilisation"]
    load = "" if util is None else f" The offered {b['offered_rps']} req/s is {util:.0%} of it"
    load += (": the pipeline is saturated." if util is not None and util >= 1 else
             f" ({b['headroom_rps']} req/s of headroom)." if util is not None else ".")
    return (f"Bottleneck: {b['stage']} — the pipeline can carry about {b['pipeline_capacity_rps']} requests/s "
            f"as measured.{load}")
