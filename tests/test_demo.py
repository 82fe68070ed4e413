"""`llmpipe demo` end to end on a small cut of the bundled traffic (every category, two lines each):
the stack starts, every request gets the answer its category promises (the summary counted against
the traffic file), the report's numbers are the raw warehouse rows' (tests/support/report_check.py),
it is written as HTML, nothing raw of the PII lines reaches the warehouse, and the stack stops."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from tests.support.cli import last_json, llmpipe
from tests.support.paths import ROOT
from tests.support.report_check import (
    RAW_DECISIONS,
    RAW_REQUESTS,
    expected_sections,
    mismatches,
)
from tests.support.warehouse import sql

pytestmark = pytest.mark.integration


def small_traffic(path: Path) -> list[dict]:
    per_cat: dict[str, list[dict]] = defaultdict(list)
    for raw in (ROOT / "examples" / "demo_traffic.jsonl").read_text().splitlines():
        line = json.loads(raw)
        cat = line["note"].split(":")[0]
        if len(per_cat[cat]) < (3 if cat in ("idempotency", "hostile") else 2):
            per_cat[cat].append(line)
    lines = [line for cat in per_cat.values() for line in cat]
    path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
    return lines


def test_demo_runs_end_to_end_and_stops(tmp_path):
    lines = small_traffic(tmp_path / "small.jsonl")
    res = llmpipe("demo", "--traffic", str(tmp_path / "small.jsonl"), "--config", str(ROOT / "examples" / "demo.yaml"),
                  "--rate", "6", "--json", data_dir=tmp_path / "demo", timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = last_json(res)
    assert not (tmp_path / "demo" / "stack.json").exists(), "the demo stops its stack"
    # the printed summary against the traffic file it replayed: every line once, per category
    per_cat = Counter(line["note"].split(":")[0] for line in lines)
    cats = doc["categories"]
    assert doc["requests"] == len(lines) and {k: c["requests"] for k, c in cats.items()} == per_cat
    assert sum(doc["statuses"].values()) == len(lines)
    assert doc["statuses"] == dict(sum((Counter(c["statuses"]) for c in cats.values()), Counter()))
    for ok in ("support", "pii", "image", "general", "shadow", "near-miss", "idempotency"):
        assert set(cats[ok]["statuses"]) == {"200"}, (ok, cats[ok])
    assert cats["hostile"]["statuses"].keys() <= {"413", "422"} and cats["hostile"]["codes"]
    assert cats["invalid"]["statuses"] == {"422": 2} and cats["unknown API key"]["statuses"] == {"401": 1}
    lat = doc["latency_ok_ms"]
    assert 0 < lat["p50"] <= lat["p95"] <= lat["p99"], lat

    # the printed report against the raw rows the stopped stack left (chDB, read directly now)
    decisions = sql(tmp_path / "demo", RAW_DECISIONS)
    requests = sql(tmp_path / "demo", RAW_REQUESTS)
    report = doc["report"]
    sec = report["sections"]
    reached = len(lines) - per_cat["invalid"] - per_cat["unknown API key"]  # the door refuses those itself
    assert len(requests) == reached == sec["offered_rate"][0]["requests"]
    assert sum(r["status"] == "ok" for r in requests) == doc["statuses"]["200"] == sec["request_latency"][0]["ok"]
    want = expected_sections(decisions, requests)
    bad = mismatches(sec, want)
    assert not bad, "the report disagrees with the raw rows:\n" + "\n".join(bad)
    assert report["bottleneck"]["stage"] == min(want["stage_capacity"], key=lambda s: want["stage_capacity"][s][
        "request_capacity_rps"][0])
    html = Path(doc["report_html"]).read_text()
    assert f"Bottleneck: {report['bottleneck']['stage']}" in html
    # the warehouse holds no raw PII from the demo lines
    dump = json.dumps(sql(tmp_path / "demo", "SELECT * FROM decisions"), ensure_ascii=False)
    dump += json.dumps(sql(tmp_path / "demo", "SELECT * FROM requests"), ensure_ascii=False)
    assert len(dump) > 1000 and "@example.com" not in dump and "4111 1111" not in dump
