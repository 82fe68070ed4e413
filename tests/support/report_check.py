"""The analyst report's numbers, computed here from raw warehouse rows without the shipped queries
(schemas/clickhouse/queries/): what tests compare `llmpipe report --json` with, so a wrong query
fails them. Quantiles are checked as brackets (between the two nearest ranks of the raw values):
ClickHouse's `quantile` interpolates, any correct quantile lies there."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

# raw rows, every one (the tests' stacks are fresh: the report's `since` keeps them all); FINAL
# only folds a record the sink wrote twice
RAW_DECISIONS = ("SELECT request_id, stage, step, decision, scores, worker, replay_id, started, finished, queue_ms, "
                 "service_ms FROM decisions FINAL")
RAW_REQUESTS = ("SELECT request_id, status, error_class, answered_by, route, model, requested_model, cache, "
                "tokens_in, tokens_out, cost_usd, ttft_ms, tpot_ms, e2e_ms, created, finished, replay_id "
                "FROM requests FINAL")


@dataclass(frozen=True)
class Between:
    """A quantile of `values`: any value between its two nearest ranks (None for no values)."""

    lo: float | None
    hi: float | None

    @classmethod
    def of(cls, values: list[float], q: float) -> Between:
        s = sorted(values)
        if not s:
            return cls(None, None)
        pos = q * (len(s) - 1)
        return cls(s[math.floor(pos)], s[math.ceil(pos)])


def _ms(ts: str) -> float:
    return datetime.fromisoformat(ts).timestamp() * 1000


def _busy_ms(rows: list[dict[str, Any]]) -> float:
    """One worker's busy time: the union of its records' [started, finished] (a record starting
    exactly when the previous ones ended continues the busy period), each period at least its
    longest service time."""
    total, period = 0.0, None  # period: [start, end, longest service]
    for r in sorted(rows, key=lambda r: (_ms(r["started"]), _ms(r["finished"]))):
        s, f = _ms(r["started"]), _ms(r["finished"])
        if period is not None and s <= period[1]:
            period[1], period[2] = max(period[1], f), max(period[2], r["service_ms"])
            continue
        if period is not None:
            total += max(period[1] - period[0], period[2])
        period = [s, f, r["service_ms"]]
    if period is not None:
        total += max(period[1] - period[0], period[2])
    return total


def expected_sections(decisions: list[dict[str, Any]], requests: list[dict[str, Any]]) -> dict[str, Any]:
    """What each section must say about these raw rows, keyed as `mismatches` reads it."""
    reqs = [r for r in requests if r["replay_id"] == ""]
    final = [d for d in decisions if d["replay_id"] == "" and d["step"] == 0 and "." not in d["stage"]]
    by_stage: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for d in final:
        by_stage[d["stage"]].append(d)
    want: dict[str, Any] = {}

    created = [_ms(r["created"]) for r in reqs]
    window = (max(created) - min(created)) / 1000 if created else 0.0
    want["offered_rate"] = {"requests": len(reqs), "window_s": (window, 3),
                            "offered_rps": (len(reqs) / max(window, 0.001), 3)}

    want["stage_latency"] = {}
    want["stage_capacity"] = {}
    for stage, rows in by_stage.items():
        span = (max(_ms(r["finished"]) for r in rows) - min(_ms(r["started"]) for r in rows)) / 1000
        lat = {"records": len(rows), "workers": len({r["worker"] for r in rows}),
               "throughput_rps": (len(rows) / max(span, 0.001), 2)}
        for col in ("queue", "service"):
            for q in (50, 95):
                lat[f"{col}_p{q}_ms"] = (Between.of([r[f"{col}_ms"] for r in rows], q / 100), 2)
        want["stage_latency"][stage] = lat
        per_worker: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in rows:
            per_worker[r["worker"]].append(r)
        busy = {w: _busy_ms(rs) for w, rs in per_worker.items()}
        capacity = sum(len(per_worker[w]) * 1000 / busy[w] for w in per_worker)
        share = len(rows) / max(len(reqs), 1)
        want["stage_capacity"][stage] = {
            "workers": len(per_worker), "records": len(rows), "busy_s": (sum(busy.values()) / 1000, 3),
            "capacity_per_worker_rps": (capacity / len(per_worker), 2), "capacity_rps": (capacity, 2),
            "visit_share": (share, 4), "request_capacity_rps": (capacity / max(share, 0.0001), 2)}

    ok = [r for r in reqs if r["status"] == "ok"]
    lat = {"ok": len(ok), "generated": sum(r["ttft_ms"] is not None for r in ok)}
    for col, qs in (("ttft", (50, 95)), ("tpot", (50, 95)), ("e2e", (50, 95, 99))):
        values = [r[f"{col}_ms"] for r in ok if r[f"{col}_ms"] is not None]
        for q in qs:
            lat[f"{col}_p{q}_ms"] = (Between.of(values, q / 100), 1)
    want["request_latency"] = lat

    gen = by_stage.get("generate", [])
    retried = [d for d in gen if d["scores"].get("attempts", 0) > 1]
    want["retries_fallbacks"] = {"generated": len(gen), "retried": len(retried),
                                 "recovered": sum(d["decision"] == "generated" for d in retried),
                                 "failed": sum(d["decision"] == "failed" for d in gen)}

    want["rejections"] = Counter((r["status"], r["error_class"], r["answered_by"]) for r in reqs if r["status"] != "ok")

    routes: dict[str, dict[str, Any]] = defaultdict(lambda: {"requests": 0, "ok": 0, "total_tokens_in": 0,
                                                             "total_tokens_out": 0, "cost": 0.0})
    for r in reqs:
        name = r["route"] or ("(cache hit)" if r["cache"] == "hit" else "(refused before route)")
        m = routes[name]
        m["requests"] += 1
        m["ok"] += r["status"] == "ok"
        m["total_tokens_in"] += r["tokens_in"]
        m["total_tokens_out"] += r["tokens_out"]
        m["cost"] += r["cost_usd"]
    want["route_mix"] = {name: {"requests": m["requests"], "ok": m["ok"], "total_tokens_in": m["total_tokens_in"],
                                "total_tokens_out": m["total_tokens_out"], "total_cost_usd": (m["cost"], 6),
                                "share": (m["requests"] / len(reqs), 4)} for name, m in routes.items()}

    want["models"] = Counter((r["requested_model"] or "(none)",
                              r["model"] or ("(cache hit)" if r["cache"] == "hit" else "(not run)")) for r in reqs)
    return want


def _agrees(got: Any, want: Any) -> bool:
    if not isinstance(want, tuple):
        return got == want
    value, decimals = want
    slack = 1.01 * 10 ** -decimals  # the report rounds; a float a hair from .5 may round either way
    if isinstance(value, Between):
        if value.lo is None:
            return got is None
        return got is not None and value.lo - slack <= got <= value.hi + slack
    return got is not None and abs(got - value) <= slack


def _rows_vs(where: str, got: dict[Any, dict[str, Any]], want: dict[Any, dict[str, Any]]) -> list[str]:
    if set(got) != set(want):
        return [f"{where}: rows {sorted(got, key=str)} != {sorted(want, key=str)}"]
    return [f"{where}[{k}].{col}: report {got[k].get(col)!r}, raw rows {exp!r}"
            for k, cols in want.items() for col, exp in cols.items() if not _agrees(got[k].get(col), exp)]


def mismatches(sections: dict[str, list[dict[str, Any]]], want: dict[str, Any]) -> list[str]:
    """Every number of the report's sections that the raw rows contradict, as readable lines."""
    out = _rows_vs("offered_rate", {0: sections["offered_rate"][0]}, {0: want["offered_rate"]})
    out += _rows_vs("stage_latency", {r["stage"]: r for r in sections["stage_latency"]}, want["stage_latency"])
    out += _rows_vs("stage_capacity", {r["stage"]: r for r in sections["stage_capacity"]}, want["stage_capacity"])
    out += _rows_vs("request_latency", {0: sections["request_latency"][0]}, {0: want["request_latency"]})
    out += _rows_vs("retries_fallbacks", {0: sections["retries_fallbacks"][0]}, {0: want["retries_fallbacks"]})
    rejections = Counter({(r["status"], r["error_class"], r["answered_by"]): r["requests"] for r in sections["rejections"]})
    if rejections != want["rejections"]:
        out.append(f"rejections: report {dict(rejections)}, raw rows {dict(want['rejections'])}")
    out += _rows_vs("route_mix", {r["route_name"]: r for r in sections["route_mix"]}, want["route_mix"])
    models = Counter({(r["requested"], r["executed"]): r["requests"] for r in sections["models"]})
    if models != want["models"]:
        out.append(f"models: report {dict(models)}, raw rows {dict(want['models'])}")
    return out
