"""Feedback joined to what it is about, in chDB through the real migrations: feedback_joined,
training_candidates and the --from-feedback export (no broker: rows inserted as the sink would)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT

SCRIPT = r"""
import json, sys
from pipeline.config.feedback import FeedbackSettings
from pipeline.contracts import Evidence, Feedback, Response
from pipeline.rollouts import feedback_export_rows, feedback_selector
from pipeline.stores import warehouse_rows as rows
from pipeline.stores.sql_gateway import analyst_query
from pipeline.stores.warehouse import Warehouse

w = Warehouse("chdb://" + sys.argv[1])
w.migrate()
base = dict(tenant_id="acme", status="ok", answered_by="postprocess", cache="miss", episode_id="ep-1")
answers = [
    Response(request_id="r-adapter", adapter="support-lora@r1", deployment="local-vllm", route="support",
             actor_revision="smol@sha256:aa+support-lora@r1", prompt_token_ids=[1, 2, 3], token_ids=[7, 8],
             logprobs=[-0.5, -0.25], **base),
    Response(request_id="r-base", deployment="local-vllm", route="simple", actor_revision="smol@sha256:aa", **base),
    Response(request_id="r-hit", route="simple", **{**base, "cache": "hit"}),
    Response(request_id="r-other", actor_revision="smol@sha256:aa", **{**base, "tenant_id": "other"}),
]
w.insert("requests", rows.REQUESTS_COLUMNS, [rows.request_row(r) for r in answers])
w.insert("decisions", rows.DECISIONS_COLUMNS, [rows.decision_row(e) for e in [
    Evidence(request_id="r-adapter", stage="generate", decision="stop",
             revisions={"model": "smol@sha256:aa", "adapter": "r1", "tokenizer": "tok@1", "chat_template": "tpl@1"}),
    Evidence(request_id="r-adapter", stage="route", decision="support", policy_version="route-v7"),
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
        "AND adapter = 'support-lora@r1' AND actor_revision = 'smol@sha256:aa+support-lora@r1'")
out["down_by_adapter_and_actor"] = res.rows[0][0]
res = q("SELECT feedback_id, request_id, generated_token_ids, logprobs, tokenizer_revision, chat_template_revision "
        "FROM training_candidates ORDER BY feedback_id, request_id")
out["candidates"] = [list(r) for r in res.rows]
s = FeedbackSettings()
for sel in ("thumbs_up<=0", "thumbs_up", "task_success"):
    cols, rs = feedback_export_rows(q, *feedback_selector(sel, s))
    out[sel] = [dict(zip(cols, r)) for r in rs]
print(json.dumps(out, default=str))
"""


def test_feedback_joins_its_answer_by_adapter_and_actor_and_becomes_a_training_candidate(tmp_path):
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "wh")], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)  # chDB: one directory per process
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["joined"] == [
        ["down", "r-adapter", "support-lora@r1", "smol@sha256:aa+support-lora@r1", "route-v7", "miss"],
        ["ep", "r-adapter", "support-lora@r1", "smol@sha256:aa+support-lora@r1", "route-v7", "miss"],
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
