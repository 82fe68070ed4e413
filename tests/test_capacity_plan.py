"""`llmpipe plan`: workers, partitions, replicas and the limiting stage from measured costs (pure)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from pipeline.analysis.capacity import (
    StageCost,
    chain_costs,
    costs_from_bench,
    costs_from_capacity,
    plan,
)


def test_workers_are_cores_at_the_planned_utilization():
    p = plan(100, [StageCost("mask", 10.0, 1.0, 6), StageCost("cache", 4.0, 1.0, 6)], utilization=0.5)
    by = {r.stage: r for r in p.stages}
    assert by["mask"].workers == 2  # 100/s x 10 ms = 1 core, at 50 % busy = 2 workers
    assert by["cache"].workers == 1  # 0.4 core -> 0.8 -> 1
    assert p.cores == 3


def test_the_limiting_stage_tops_out_first_with_todays_partitions():
    p = plan(10_000, [StageCost("mask", 10.0, 1.0, 6), StageCost("generate", 2.0, 0.5, 6),
                      StageCost("cache", 5.0, 1.0, 12)], utilization=0.7)
    by = {r.stage: r for r in p.stages}
    assert by["mask"].top_rps_now == pytest.approx(420.0)  # 6 workers x 0.7 / 0.010 s
    assert by["cache"].top_rps_now == pytest.approx(1680.0)
    assert by["generate"].top_rps_now == pytest.approx(4200.0)  # half the requests reach it
    assert p.limiting_stage == "mask" and p.top_rps_now == pytest.approx(420.0)
    assert by["mask"].workers == 143 and by["mask"].partitions_needed == 143  # ceil(100 cores / 0.7)
    assert any("stage.mask" in n and "143 partitions" in n for n in p.notes)


def test_engine_replicas_from_output_tokens():
    p = plan(100, [StageCost("generate", 1.0)], engine_tok_s=5000, tokens_per_request=200)
    assert p.engine_replicas == 4
    with pytest.raises(ValueError):
        plan(100, [StageCost("generate", 1.0)], engine_tok_s=0, tokens_per_request=200)


@pytest.mark.parametrize("rate,util", [(0, 0.7), (-1, 0.7), (10, 0), (10, 1.5)])
def test_nonsense_is_refused(rate, util):
    with pytest.raises(ValueError):
        plan(rate, [StageCost("mask", 1.0)], utilization=util)


def bench_result() -> dict:
    def row(rate, ok, kept, mask_s):
        return {"rate": rate, "ok": ok, "kept_up": kept,
                "cpu_s_by_process": {"mask": mask_s, "broker": 1.0, "mock upstream": 9.0}}

    return {"systems": {"product": [row(10, 200, True, 2.0), row(40, 800, True, 4.0), row(80, 900, False, 9.0)]}}


def test_bench_costs_come_from_the_highest_rate_that_kept_up():
    costs = {c.stage: c for c in costs_from_bench(bench_result(), "product", {"mask": 6})}
    assert set(costs) == {"mask", "broker"}  # the mock's CPU is nobody's
    assert costs["mask"].ms_per_visit == pytest.approx(5.0)  # 4 s / 800 requests at 40 req/s
    assert costs["mask"].partitions == 6 and costs["broker"].partitions is None
    with pytest.raises(ValueError):
        costs_from_bench(bench_result(), "gateway", {})


def test_warehouse_costs_are_busy_time_per_visit():
    rows = [{"stage": "generate", "capacity_per_worker_rps": 50.0, "visit_share": 0.25},
            {"stage": "idle", "capacity_per_worker_rps": None, "visit_share": 1.0}]
    (c,) = costs_from_capacity(rows, {"generate": 6})
    assert c.ms_per_visit == pytest.approx(20.0) and c.share == 0.25 and c.partitions == 6


def test_chained_stages_are_planned_as_their_chains_worker():
    costs = [StageCost("mask", 10.0, 1.0, 6), StageCost("cache", 4.0, 0.5, 6), StageCost("route", 1.0, 1.0, 6),
             StageCost("generate", 8.0, 0.25, 6), StageCost("sink", 0.5, 1.0, 6)]
    folded = chain_costs(costs, {"mask": ["mask", "cache"], "route": ["route"], "generate": ["generate", "postprocess"]})
    by = {c.stage: c for c in folded}
    assert set(by) == {"mask+cache", "route", "generate", "sink"}
    assert by["mask+cache"].ms_per_visit == pytest.approx(12.0) and by["mask+cache"].share == 1.0
    assert by["generate"].ms_per_visit == pytest.approx(2.0) and by["generate"].partitions == 6
    # one worker group, so one row with its partitions: 100 req/s x 12 ms at 0.6 busy = 2 workers
    (row,) = [r for r in plan(100, folded, utilization=0.6).stages if r.stage == "mask+cache"]
    assert row.workers == 2 and row.top_rps_now == pytest.approx(300.0)


def test_the_cli_prints_a_plan_from_a_bench_result(tmp_path):
    from pipeline.cli.app import app

    f = tmp_path / "bench.txt"
    f.write_text("some table\n" + json.dumps(bench_result()) + "\n")
    r = CliRunner().invoke(app, ["plan", "--rate", "10000", "--from", str(f), "--json", "--data-dir", str(tmp_path),
                                 "--gpu-tok-s", "20000", "--tokens-per-request", "100"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output.strip().splitlines()[-1])
    assert doc["limiting_stage"] == "mask" and doc["engine_replicas"] == 50
    by = {s["stage"]: s for s in doc["stages"]}
    assert by["mask"]["workers"] == 72  # 10,000/s x 5 ms = 50 cores / 0.7
    r = CliRunner().invoke(app, ["plan", "--rate", "10", "--from", str(f), "--system", "nope",
                                 "--data-dir", str(tmp_path)])
    assert r.exit_code != 0 and "nope" in r.output
