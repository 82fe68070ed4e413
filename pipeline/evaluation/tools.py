"""`llmpipe tool-eval`: how often tool narrowing keeps the tools a conversation needs.

A case offers 40 tools of a catalog and names the tool(s) a correct assistant calls next; it counts
as kept when every needed tool is among the narrowed candidates. Cases are parsed by the front
door's own body parser, so a case the door would refuse fails here too.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from pipeline.contracts.request import Tool
from pipeline.ingress.openai_body import chat_body
from pipeline.runtime.serve.metrics import percentile
from pipeline.stages.route.tools import ToolNarrower


@dataclass
class Case:
    id: str
    kind: str
    lang: str
    body: dict[str, Any]
    needs: list[str]


def read_catalog(path: Path) -> dict[str, dict]:
    tools = orjson.loads(path.read_bytes())["tools"]
    return {t["function"]["name"]: t for t in tools}


def read_cases(path: Path, catalog: dict[str, dict]) -> list[Case]:
    cases = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        row = orjson.loads(line)
        unknown = [t for t in row["offered"] if t not in catalog]
        if unknown:
            raise ValueError(f"{path}:{n}: offered tools not in the catalog: {unknown}")
        body = {"messages": row["messages"], "tools": [catalog[t] for t in row["offered"]]}
        cases.append(Case(row["id"], row.get("kind", ""), row.get("lang", ""), body, list(row["needs"])))
    return cases


def evaluate(narrower: ToolNarrower, cases: list[Case], k: int) -> dict[str, Any]:
    kept_all = 0
    by: dict[str, dict[str, list[int]]] = {"kind": defaultdict(lambda: [0, 0]), "lang": defaultdict(lambda: [0, 0])}
    missed: list[dict[str, Any]] = []
    ms: list[float] = []
    for case in cases:
        body = chat_body(case.body)
        t0 = time.perf_counter()
        result = narrower.narrow(body.tools, body.messages, k, body.tool_choice)
        ms.append((time.perf_counter() - t0) * 1000)
        ok = all(n in result.kept for n in case.needs)
        kept_all += ok
        for dim, value in (("kind", case.kind), ("lang", case.lang)):
            by[dim][value][0] += ok
            by[dim][value][1] += 1
        if not ok:
            missed.append({"id": case.id, "needs": case.needs, "kept": result.kept[:k],
                           "rank": {n: sorted(result.scores, key=lambda x: -result.scores[x]).index(n) + 1
                                    for n in case.needs if n in result.scores}})
    return {
        "cases": len(cases), "k": k, "recall": round(kept_all / len(cases), 4) if cases else None,
        "by_kind": {k_: round(a / b, 3) for k_, (a, b) in sorted(by["kind"].items())},
        "by_lang": {k_: round(a / b, 3) for k_, (a, b) in sorted(by["lang"].items())},
        "ms_p50": round(percentile(ms, 50), 2) if ms else None, "ms_p95": round(percentile(ms, 95), 2) if ms else None,
        "missed": missed,
    }


def tool_models(catalog: dict[str, dict]) -> list[Tool]:
    return [Tool.model_validate(t) for t in catalog.values()]
