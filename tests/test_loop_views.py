"""The loop's warehouse views and report sections in chDB through the real migrations: feedback_joined,
training_candidates, the --from-feedback export, experiments and RL operations, each checked against
a computation from the raw rows (no broker: rows inserted as the sink would)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.paths import ROOT

SCRIPT = r"""
import json, sys
from pipeline.config.feedback import FeedbackSettings
from pipeline.contracts import Evidence, Feedback, Response
from pipeline.training.samples import TenantScope, feedback_export_rows, feedback_selector
from pipeline.stores import warehouse_rows as rows
from pipeline.stores.sql_gateway import analyst_query
from pipeline.stores.warehouse import Warehouse

w = Warehouse("chdb://" + sys.argv[1])
w.migrate()
base = dict(tenant_id="acme", status="ok", answered_by="postprocess", cache="miss", episode_id="ep-1")
answers = [
    Response(request_id="r-adapter", adapter="support-lora", deployment="local-vllm", route="support",
             actor_revision="smol@sha256:aa+support-lora@r1", prompt_token_ids=[1, 2, 3], token_ids=[7, 8],
             logprobs=[-0.5, -0.25], **base),
    Response(request_id="r-base", deployment="local-vllm", route="simple", actor_revision="smol@sha256:aa", **base),
    Response(request_id="r-hit", route="simple", **{**base, "cache": "hit"}),
    Response(request_id="r-other", actor_revision="smol@sha256:aa", **{**base, "tenant_id": "other"}),
]
w.insert("requests", rows.REQUESTS_COLUMNS, [rows.request_row(r) for r in answers])
w.insert("decisions", rows.DECISIONS_COLUMNS, [rows.decision_row(e) for e in [
    Evidence(request_id="r-adapter", tenant_id="acme", stage="generate", decision="stop",
             revisions={"model": "smol@sha256:aa", "adapter": "r1", "tokenizer": "tok@1", "chat_template": "tpl@1"}),
    Evidence(request_id="r-adapter", tenant_id="acme", stage="route", decision="support", policy_version="route-v7"),
]])
feedback = [
    Feedback(feedback_id="down", request_id="r-adapter", metric="thumbs_up", value=False, tenant_id="acme"),
    Feedback(feedback_id="down", request_id="r-adapter", metric="thumbs_up", value=False, tenant_id="acme"),
    Feedback(feedback_id="up", request_id="r-base", metric="thumbs_up", value=True, tenant_id="acme"),
    Feedback(feedback_id="stolen", request_id="r-other", metric="thumbs_up", value=False, tenant_id="acme"),
    Feedback(feedback_id="ep", episode_id="ep-1", metric="task_success", value=True, tenant_id="acme"),
    Feedback(feedback_id="hit", request_id="r-hit", metric="rating", value=0.5, tenant_id="acme"),
]
w.insert("feedback", rows.FEEDBACK_COLUMNS, [rows.feedback_row(f) for f in feedback])
q = lambda sql, p=None: analyst_query(w, sql, p or {})
out = {}
res = q("SELECT feedback_id, request_id, adapter, actor_revision, route_policy_version, cache FROM feedback_joined "
        "ORDER BY feedback_id, request_id")
out["joined"] = [list(r) for r in res.rows]
res = q("SELECT count() FROM feedback_joined WHERE metric = 'thumbs_up' AND value_float = 0 "
        "AND adapter = 'support-lora' AND actor_revision = 'smol@sha256:aa+support-lora@r1'")
out["down_by_adapter_and_actor"] = res.rows[0][0]
res = q("SELECT feedback_id, request_id, generated_token_ids, logprobs, tokenizer_revision, chat_template_revision "
        "FROM training_candidates ORDER BY feedback_id, request_id")
out["candidates"] = [list(r) for r in res.rows]
s = FeedbackSettings()
for sel in ("thumbs_up<=0", "thumbs_up", "task_success"):
    cols, rs = feedback_export_rows(q, *feedback_selector(sel, s), tenants=TenantScope.of(["acme"]))
    out[sel] = [dict(zip(cols, r)) for r in rs]
print(json.dumps(out, default=str))
"""


def test_feedback_joins_its_answer_by_adapter_and_actor_and_becomes_a_training_candidate(tmp_path):
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "wh")], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)  # chDB: one directory per process
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["joined"] == [
        ["down", "r-adapter", "support-lora", "smol@sha256:aa+support-lora@r1", "route-v7", "miss"],
        ["ep", "r-adapter", "support-lora", "smol@sha256:aa+support-lora@r1", "route-v7", "miss"],
        ["ep", "r-base", "", "smol@sha256:aa", "", "miss"],
        ["ep", "r-hit", "", "", "", "hit"],
        ["hit", "r-hit", "", "", "", "hit"],
        ["up", "r-base", "", "smol@sha256:aa", "", "miss"],
    ]  # "down" once (one feedback_id), "stolen" nowhere (another tenant's request)
    assert out["down_by_adapter_and_actor"] == 1
    # served, generated answers only (no cache hit), token ids where recorded
    assert [c[:2] for c in out["candidates"]] == [["down", "r-adapter"], ["ep", "r-adapter"], ["ep", "r-base"],
                                                  ["up", "r-base"]]
    assert out["candidates"][0][2:] == [[7, 8], [-0.5, -0.25], "tok@1", "tpl@1"]
    (down,) = out["thumbs_up<=0"]
    assert (down["sample_id"], down["score"], down["generated_token_ids"], down["prompt_token_ids"]) == \
        ("r-adapter", 0.0, [7, 8], [1, 2, 3])
    assert down["actor_revision"] == "smol@sha256:aa+support-lora@r1" and down["group_id"] == "ep-1"
    assert down["prompt_dataset_revision"] == "feedback:thumbs_up" and down["chat_template_revision"] == "tpl@1"
    assert out["thumbs_up"] == []  # the thumbs-up answer recorded no token ids: nothing to train on
    assert [r["sample_id"] for r in out["task_success"]] == ["r-adapter"]


EXPERIMENT_SCRIPT = r"""
import json, random, sys
from datetime import datetime, timezone
from pipeline.contracts import Feedback, Response
from pipeline.analysis.report import query_text
from pipeline.stages.route.experiments import Experiment, assign
from pipeline.stores import warehouse_rows as rows
from pipeline.stores.sql_gateway import analyst_query
from pipeline.stores.warehouse import Warehouse

w = Warehouse("chdb://" + sys.argv[1])
w.migrate()
exp = Experiment(name="tone", route="simple", variants=[{"name": "a", "weight": 1}, {"name": "b", "weight": 1}])
rng = random.Random(7)
answers, feedback = [], []
for i in range(200):
    ep = f"ep-{i % 40}"
    v = assign(exp, ep, f"r{i}").variant.name
    answers.append(Response(request_id=f"r{i}", tenant_id="acme", status="ok", answered_by="postprocess", cache="miss",
                            route="simple", experiment="tone", variant=v, episode_id=ep, cost_usd=0.001 * (i % 7),
                            created_ms=1_700_000_000_000, finished_ms=1_700_000_000_000 + 100 * (i % 13)))
    if i % 3 == 0:
        feedback.append(Feedback(request_id=f"r{i}", metric="rating", value=round(rng.random() * (1.3 if v == "b" else 1), 3),
                                 tenant_id="acme"))
for e in range(40):
    feedback.append(Feedback(episode_id=f"ep-{e}", metric="task_success", value=rng.random() < 0.6, tenant_id="acme"))
w.insert("requests", rows.REQUESTS_COLUMNS, [rows.request_row(r) for r in answers])
w.insert("feedback", rows.FEEDBACK_COLUMNS, [rows.feedback_row(f) for f in feedback])
res = analyst_query(w, query_text("experiment_variants"), {"since": "2000-01-01 00:00:00.000"})
raw = {"answers": [[a.request_id, a.variant, a.episode_id, a.cost_usd] for a in answers],
       "feedback": [[f.request_id, f.episode_id, f.metric, float(f.value)] for f in feedback]}
print(json.dumps({"columns": res.columns, "rows": [list(r) for r in res.rows], "raw": raw}, default=str))
"""


def test_the_per_variant_feedback_query_matches_a_computation_from_the_raw_rows(tmp_path):
    import math
    import statistics

    run = subprocess.run([sys.executable, "-c", EXPERIMENT_SCRIPT, str(tmp_path / "wh")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    got = {(r["variant"], r["metric"]): r for r in (dict(zip(out["columns"], row)) for row in out["rows"])}
    variant_of = {rid: v for rid, v, _, _ in out["raw"]["answers"]}
    requests_of_episode: dict[str, list[str]] = {}
    for rid, _, ep, _ in out["raw"]["answers"]:
        requests_of_episode.setdefault(ep, []).append(rid)
    values: dict[tuple[str, str], list[float]] = {}
    for rid, ep, metric, value in out["raw"]["feedback"]:
        targets = [rid] if rid else requests_of_episode[ep]  # episode feedback counts for each of its requests
        for t in targets:
            values.setdefault((variant_of[t], metric), []).append(value)
    assert set(got) == set(values) and {v for v, _ in got} == {"a", "b"}
    for key, vals in values.items():
        row, mean = got[key], statistics.fmean(vals)
        half = 1.96 * statistics.stdev(vals) / math.sqrt(len(vals))
        assert row["feedback"] == len(vals)
        assert abs(row["mean"] - mean) < 1e-4 and abs(row["ci95_low"] - (mean - half)) < 1e-4, (key, row, mean, half)
        assert abs(row["ci95_high"] - (mean + half)) < 1e-4
        n_requests = sum(1 for v in variant_of.values() if v == key[0])
        assert row["requests"] == n_requests
        cost = [c for _, v, _, c in out["raw"]["answers"] if v == key[0]]
        assert abs(row["total_cost_usd"] - sum(cost)) < 1e-6


RL_SCRIPT = r"""
import json, sys
from pipeline.contracts import Response, Rollout, RolloutConsumption, WeightEvent
from pipeline.analysis.report import query_text
from pipeline.stores import warehouse_rows as rows
from pipeline.stores.sql_gateway import analyst_query
from pipeline.stores.warehouse import Warehouse

w = Warehouse("chdb://" + sys.argv[1])
w.migrate()
T0 = 1_700_000_000_000
samples = []
for g in range(6):
    actor = "smol@sha256:aa+actor@r1" if g < 3 else "smol@sha256:aa+actor@r2"
    for i in range(4 if g != 5 else 3):  # the last group lost a sample
        samples.append(Rollout(sample_id=f"q{g}:{i}", group_id=f"g{g}", request_id=f"q{g}", actor_revision=actor,
                               temperature=1.0, top_p=1.0, max_tokens=8, prompt_token_ids=[1], generated_token_ids=[2] * (g + 1),
                               logprobs=[-0.1] * (g + 1), finish_reason="stop", score=g / 10, created_ms=T0 + 1000 * g))
w.insert("rollouts", rows.ROLLOUTS_COLUMNS, [rows.rollout_row(r) for r in samples])
w.insert("requests", rows.REQUESTS_COLUMNS, [rows.request_row(Response(
    request_id=f"q{g}", status="ok", answered_by="postprocess", samples_requested=4, finished_ms=T0 + 1000 * g))
    for g in range(7)])  # q6 asked for 4 and got none
w.insert("weight_events", rows.WEIGHT_EVENTS_COLUMNS, [rows.weight_event_row(WeightEvent(
    replica="g1", kind="actor", name="actor", revision="r2", transition="active", at_ms=T0 + 2500))])
w.insert("rollout_consumption", rows.CONSUMPTION_COLUMNS, [rows.consumption_row(c) for c in [
    RolloutConsumption(batch_id="b1", trainer="t", groups=2, samples=8, idle_ms=300, busy_ms=700,
                       queue_age_ms=[10, 20, 30, 40, 50, 60, 70, 80], samples_by_revision={"smol@sha256:aa+actor@r1": 8},
                       acked_ms=T0 + 9000),
    RolloutConsumption(batch_id="b2", trainer="t", groups=2, samples=8, idle_ms=100, busy_ms=900,
                       queue_age_ms=[100] * 8, samples_by_revision={"smol@sha256:aa+actor@r2": 8},
                       dropped_by_revision={"smol@sha256:aa+actor@r1": 4}, acked_ms=T0 + 9500),
]])
out = {}
for name in ("rl_operations", "rollouts_by_revision"):
    res = analyst_query(w, query_text(name), {"since": "2000-01-01 00:00:00.000"})
    out[name] = [dict(zip(res.columns, r)) for r in res.rows]
print(json.dumps(out, default=str))
"""


def test_rl_operations_match_the_raw_rows(tmp_path):
    run = subprocess.run([sys.executable, "-c", RL_SCRIPT, str(tmp_path / "wh")], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    (ops,) = out["rl_operations"]
    tokens = sum((g + 1) * (4 if g != 5 else 3) for g in range(6))
    assert ops["rollout_samples"] == 23 and ops["generated_tokens"] == tokens
    assert ops["generated_tokens_per_s"] == round(tokens / 5.0, 1)  # samples made over 5 s
    assert ops["samples_requested"] == 28 and ops["sample_completion_rate"] == round(23 / 28, 4)
    assert ops["consumed_samples"] == 16 and ops["trainer_idle_share"] == 0.2  # 400 of 2000 ms
    assert 60 <= ops["queue_age_p50_ms"] <= 100 and ops["queue_age_p95_ms"] == 100.0
    assert ops["stale_dropped"] == 4
    by = {r["actor_revision"]: r for r in out["rollouts_by_revision"]}
    r1, r2 = by["smol@sha256:aa+actor@r1"], by["smol@sha256:aa+actor@r2"]
    assert (r1["samples"], r1["consumed"], r1["dropped_stale"]) == (12, 8, 4)
    assert (r2["samples"], r2["consumed"]) == (11, 8)
    assert r2["activate_to_first_sample_s"] == 0.5 and r1["activate_to_first_sample_s"] is None
