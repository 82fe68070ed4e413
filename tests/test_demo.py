"""`llmpipe demo` end to end on a small cut of the bundled traffic (every category, two lines each):
the stack starts, every request gets the answer its category promises, the report is printed and
written as HTML, nothing raw of the PII lines reaches the warehouse, and the stack stops."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from pipeline.report import SECTIONS, queries_dir
from tests.support.cli import last_json, llmpipe
from tests.support.paths import ROOT

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
    cats = doc["categories"]
    assert doc["requests"] == len(lines) and set(cats) == {line["note"].split(":")[0] for line in lines}
    for ok in ("support", "pii", "image", "general", "shadow", "near-miss", "idempotency"):
        assert set(cats[ok]["statuses"]) == {"200"}, (ok, cats[ok])
    assert cats["hostile"]["statuses"].keys() <= {"413", "422"} and cats["hostile"]["codes"]
    assert cats["invalid"]["statuses"] == {"422": 2} and cats["unknown API key"]["statuses"] == {"401": 1}
    report = doc["report"]
    assert report["bottleneck"] and report["bottleneck"]["stage"] in {s["stage"] for s in
                                                                       report["sections"]["stage_capacity"]}
    assert report["sections"]["offered_rate"][0]["requests"] == sum(
        c["requests"] for k, c in cats.items() if k not in ("invalid", "unknown API key"))
    html = Path(doc["report_html"]).read_text()
    assert "Bottleneck:" in html
    assert not (tmp_path / "demo" / "stack.json").exists(), "the demo stops its stack"
    # the printed numbers are the shipped queries' (run now on the warehouse the stopped stack left)
    for sec in SECTIONS:
        res = llmpipe("sql", "--file", str(queries_dir() / f"{sec.name}.sql"), "--param", f"since={report['since']}",
                      "--format", "json", data_dir=tmp_path / "demo")
        assert res.returncode == 0, res.stderr
        rows = [{k: (None if v != v else v) for k, v in r.items()} for r in last_json(res)]  # nan -> None
        assert rows == report["sections"][sec.name], sec.name
    # the warehouse (readable directly now the stack is down) holds no raw PII from the demo lines
    dump = llmpipe("sql", "SELECT * FROM decisions", "--format", "json", data_dir=tmp_path / "demo").stdout
    dump += llmpipe("sql", "SELECT * FROM requests", "--format", "json", data_dir=tmp_path / "demo").stdout
    assert len(dump) > 1000 and "@example.com" not in dump and "4111 1111" not in dump
