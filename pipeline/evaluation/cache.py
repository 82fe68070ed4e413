"""`llmpipe cache-eval`: precision, recall and false hits of the semantic cache on labelled pairs.

For each pair: write `a` as a fresh entry (its own data_version, so pairs never see each other),
look up `b` (tenant_b or the same tenant) in the same domain, and compare hit/miss to the label.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from pipeline.contracts import RequestDoc
from pipeline.contracts.request import RequestContext
from pipeline.runtime.serve.metrics import percentile
from pipeline.stages.cache.semantic import SemanticCache

DEFAULT_TENANT = "eval-tenant"


@dataclass
class Pair:
    a: str
    b: str
    label: str
    domain: str
    tenant_a: str
    tenant_b: str
    kind: str = ""  # the set's kind of pair (paraphrase, negation, cross_tenant, volatile, ...)


def read_pairs(path: Path) -> list[Pair]:
    pairs = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            o = orjson.loads(line)
            if o["label"] not in ("same", "different"):
                raise ValueError(f"label must be same|different, got {o['label']!r}")
            ta = o.get("tenant_a") or DEFAULT_TENANT
            pairs.append(Pair(o["a"], o["b"], o["label"], o.get("domain") or "faq", ta, o.get("tenant_b") or ta,
                              str(o.get("kind") or "")))
        except (orjson.JSONDecodeError, KeyError, ValueError, TypeError) as exc:
            raise ValueError(f"{path}:{n}: {exc}") from None
    return pairs


def _doc(text: str, tenant: str, domain: str, version: str, rid: str) -> RequestDoc:
    return RequestDoc(request_id=rid, tenant_id=tenant, body={"messages": [{"role": "user", "content": text}]},
                      context=RequestContext(domain=domain, data_version=version))


def _scores(rows: list[dict[str, Any]]) -> dict[str, Any]:
    tp = sum(r["hit"] and r["label"] == "same" for r in rows)
    fp = sum(r["hit"] and r["label"] == "different" for r in rows)
    same = sum(r["label"] == "same" for r in rows)
    lat = [r["lookup_ms"] for r in rows]
    return {
        "pairs": len(rows), "same": same, "different": len(rows) - same, "hits": tp + fp,
        "precision": round(tp / (tp + fp), 4) if tp + fp else None,
        "recall": round(tp / same, 4) if same else None,
        "false_hits": fp,
        "lookup_ms": {"p50": percentile(lat, 50), "p95": percentile(lat, 95)},
    }


def evaluate(cache: SemanticCache, pairs: list[Pair], on_pair: Callable[[], None] | None = None) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for i, p in enumerate(pairs):
        version = f"eval-pair-{i}"
        put = cache.put_record(_doc(p.a, p.tenant_a, p.domain, version, f"a{i}"), f"answer to pair {i}")
        if put is not None:
            cache.apply(put)
        t0 = time.perf_counter()
        [lk] = cache.lookup_many([_doc(p.b, p.tenant_b, p.domain, version, f"b{i}")])
        ms = (time.perf_counter() - t0) * 1000
        sec = lk.section
        rows.append({"label": p.label, "domain": p.domain, "kind": p.kind, "hit": sec.decision == "hit",
                     "similarity": sec.similarity, "verifier_p": sec.verifier_p,
                     "gate": sec.gate, "reason": sec.reason, "written": put is not None, "lookup_ms": round(ms, 2)})
        if on_pair:
            on_pair()
    by_domain: dict[str, list] = defaultdict(list)
    by_kind: dict[str, list] = defaultdict(list)
    for r in rows:
        by_domain[r["domain"]].append(r)
        by_kind[r["kind"] or "unlabelled"].append(r)
    overall = _scores(rows)
    # the two false hits that are never acceptable, whatever the precision
    overall["cross_tenant_hits"] = sum(r["hit"] for r in by_kind.get("cross_tenant", []))
    overall["volatile_hits"] = sum(r["hit"] for r in by_kind.get("volatile", []))
    return {
        "overall": overall,
        "by_domain": {d: _scores(rs) for d, rs in sorted(by_domain.items())},
        "by_kind": {k: _scores(rs) for k, rs in sorted(by_kind.items())},
        "verifier": cache.verifier.revision if cache.verifier else "off",
        "pairs": [{k: r[k] for k in ("kind", "label", "hit", "similarity", "verifier_p", "gate", "reason")}
                  for r in rows],
    }
