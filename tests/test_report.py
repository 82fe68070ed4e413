"""`llmpipe report` on a running stack: it names the deliberately slow stage as the bottleneck, and
every number in it equals what the shipped query returns through `llmpipe sql --file`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from pipeline.report import SECTIONS, queries_dir
from tests.support.cli import last_json, llmpipe

pytestmark = pytest.mark.integration

CONFIG = Path(__file__).parent / "fixtures" / "slow_middle.yaml"


def test_report_names_the_slow_stage_and_matches_the_shipped_queries(tmp_path):
    up = llmpipe("up", "--detach", "--config", str(CONFIG), "--json", data_dir=tmp_path)
    assert up.returncode == 0, up.stderr
    try:
        traffic = tmp_path / "t.jsonl"
        n = 60
        traffic.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"}]}) + "\n"
                                   for i in range(n)))
        load = llmpipe("load", "--file", str(traffic), "--rate", "20", "--json", data_dir=tmp_path, timeout=300)
        assert load.returncode == 0, load.stderr
        assert last_json(load)["by_status"] == {"ok": n}
        deadline = time.monotonic() + 60
        while True:  # the sink writes in batches
            doc = last_json(llmpipe("report", "--since", "1h", "--html", str(tmp_path / "r.html"), "--json",
                                    data_dir=tmp_path))
            if doc["sections"]["offered_rate"][0]["requests"] == n and \
                    {r["stage"] for r in doc["sections"]["stage_capacity"]} == {"first", "slow", "answer"} and \
                    all(r["records"] == n for r in doc["sections"]["stage_capacity"]):
                break
            assert time.monotonic() < deadline, doc
            time.sleep(1)
        b = doc["bottleneck"]
        cap = {r["stage"]: r for r in doc["sections"]["stage_capacity"]}
        assert b["stage"] == "slow", cap
        # 40 ms per record, one at a time: 25/s at most (sleep overshoot and bookkeeping make it a bit less)
        assert 15 <= cap["slow"]["capacity_rps"] <= 25.5, cap["slow"]
        assert min(cap["first"]["request_capacity_rps"], cap["answer"]["request_capacity_rps"]) > 3 * b[
            "pipeline_capacity_rps"]
        assert 0 < b["utilisation"] and b["offered_rps"] == doc["sections"]["offered_rate"][0]["offered_rps"]
        # every section equals its shipped query, run by an analyst with the same `since`
        for sec in SECTIONS:
            res = llmpipe("sql", "--file", str(queries_dir() / f"{sec.name}.sql"), "--param", f"since={doc['since']}",
                          "--format", "json", data_dir=tmp_path)
            assert res.returncode == 0, res.stderr
            rows = [{k: (None if v != v else v) for k, v in r.items()} for r in last_json(res)]  # nan -> None
            assert rows == doc["sections"][sec.name], sec.name
        html = (tmp_path / "r.html").read_text()
        assert "Bottleneck: slow" in html and "<svg" in html and "<script" not in html
        text = llmpipe("report", "--since", "1h", data_dir=tmp_path)
        assert text.returncode == 0 and "Bottleneck: slow" in text.stdout
    finally:
        assert llmpipe("down", data_dir=tmp_path, timeout=180).returncode == 0
