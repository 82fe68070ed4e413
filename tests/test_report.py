"""`llmpipe report` on a running stack: it names the deliberately slow stage as the bottleneck, and
its numbers are the ones this test computes itself from what it sent and from the raw warehouse
rows (tests/support/report_check.py): a wrong shipped query fails here."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.support.cli import last_json, llmpipe
from tests.support.report_check import (
    RAW_DECISIONS,
    RAW_REQUESTS,
    expected_sections,
    mismatches,
)
from tests.support.warehouse import rows_when

pytestmark = pytest.mark.integration

CONFIG = Path(__file__).parent / "fixtures" / "slow_middle.yaml"
STAGES = ("first", "slow", "answer")


def test_report_names_the_slow_stage_and_its_numbers_are_the_raw_rows(tmp_path):
    up = llmpipe("up", "--detach", "--config", str(CONFIG), "--json", data_dir=tmp_path)
    assert up.returncode == 0, up.stderr
    try:
        traffic = tmp_path / "t.jsonl"
        n, rate = 60, 20
        traffic.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"}]}) + "\n"
                                   for i in range(n)))
        load = llmpipe("load", "--file", str(traffic), "--rate", str(rate), "--json", data_dir=tmp_path, timeout=300)
        assert load.returncode == 0, load.stderr
        assert last_json(load)["by_status"] == {"ok": n}
        # the sink writes in batches: wait for every raw row the traffic makes, then ask for the report once
        decisions = rows_when(tmp_path, RAW_DECISIONS, lambda rows: Counter(
            r["stage"] for r in rows if r["step"] == 0) == {s: n for s in STAGES}, 90)
        requests = rows_when(tmp_path, RAW_REQUESTS, lambda rows: len(rows) == n, 90)
        doc = last_json(llmpipe("report", "--since", "1h", "--html", str(tmp_path / "r.html"), "--json",
                                data_dir=tmp_path))
        sec = doc["sections"]

        # what was sent: n requests, each through the three stages, all ok, paced at `rate`
        assert sec["offered_rate"][0]["requests"] == n and sec["request_latency"][0]["ok"] == n
        assert {r["stage"]: r["records"] for r in sec["stage_latency"]} == {s: n for s in STAGES}
        assert (n - 1) / rate * 0.95 <= sec["offered_rate"][0]["window_s"] <= 3 * (n - 1) / rate
        assert sec["offered_rate"][0]["offered_rps"] <= rate * 1.05
        assert sec["rejections"] == [] and sec["retries_fallbacks"][0]["generated"] == 0  # no generate stage
        # every number the raw rows determine, computed here without the shipped queries
        want = expected_sections(decisions, requests)
        bad = mismatches(sec, want)
        assert not bad, "the report disagrees with the raw rows:\n" + "\n".join(bad)

        b = doc["bottleneck"]
        cap = {r["stage"]: r for r in sec["stage_capacity"]}
        assert b["stage"] == "slow" == min(want["stage_capacity"], key=lambda s: want["stage_capacity"][s][
            "request_capacity_rps"][0]), cap
        # 40 ms per record, one at a time: 25/s at most (sleep overshoot and bookkeeping make it a bit less)
        assert 15 <= cap["slow"]["capacity_rps"] <= 25.5, cap["slow"]
        assert min(cap["first"]["request_capacity_rps"], cap["answer"]["request_capacity_rps"]) > 3 * b[
            "pipeline_capacity_rps"]
        assert b["pipeline_capacity_rps"] == cap["slow"]["request_capacity_rps"]
        assert b["offered_rps"] == sec["offered_rate"][0]["offered_rps"]
        assert b["utilisation"] == round(b["offered_rps"] / b["pipeline_capacity_rps"], 4) > 0

        html = (tmp_path / "r.html").read_text()
        assert "Bottleneck: slow" in html and "<svg" in html and "<script" not in html
        text = llmpipe("report", "--since", "1h", data_dir=tmp_path)
        assert text.returncode == 0 and "Bottleneck: slow" in text.stdout
    finally:
        assert llmpipe("down", data_dir=tmp_path, timeout=180).returncode == 0
