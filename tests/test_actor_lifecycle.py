"""The actor weight lifecycle's logic without infrastructure: the barrier, rollback targets,
validation checks, and one replica's reports (load and generate are plain async functions here;
tests/test_actor_serving.py runs the same lifecycle on the stack with real vLLM)."""

from __future__ import annotations

import asyncio

from pipeline.contracts.actor import (
    ActorActivated,
    ActorPrepared,
    ActorRejected,
    ActorReplicaReport,
    ActorSpec,
    ValidationPrompt,
)
from pipeline.engines.chat_engine import EngineError, Generation
from pipeline.registries.actor import ActorBook, validation_failure
from pipeline.stages.generate.actor import ActorReplica

SHA = "a" * 64


def spec(rev: str, checks=()) -> ActorSpec:
    return ActorSpec(revision=rev, path=f"/adapters/{rev}", sha256=SHA, rank=8, validation=list(checks))


def test_barrier_needs_every_replica_validated_and_none_rejected():
    book = ActorBook()
    assert book.barrier("r2", 2) == (False, "revision r2 was never prepared")
    book.apply(ActorPrepared(spec=spec("r2")))
    book.apply(ActorReplicaReport(revision="r2", replica="g1", state="loaded"))
    assert book.barrier("r2", 2) == (False, "0 of 2 replicas validated")
    book.apply(ActorReplicaReport(revision="r2", replica="g1", state="validated"))
    assert book.barrier("r2", 2) == (False, "1 of 2 replicas validated")
    book.apply(ActorReplicaReport(revision="r2", replica="g2", state="validated"))
    assert book.barrier("r2", 2)[0]
    book.apply(ActorReplicaReport(revision="r2", replica="g3", state="rejected"))
    assert book.barrier("r2", 2) == (False, "rejected by g3")


def test_activate_returns_only_once_every_replica_applied_the_activation():
    """The barrier's second half: validated is not switched. A replica that has not yet read the
    activation still samples the previous revision (a clean clone's run saw one request served so)."""
    book = ActorBook()
    book.apply(ActorPrepared(spec=spec("r2")))
    for g in ("g1", "g2"):
        book.apply(ActorReplicaReport(revision="r2", replica=g, state="validated"))
    book.apply(ActorActivated(revision="r2", previous=None, reason="2 replicas validated"))
    assert book.switched("r2", 2) == (False, "0 of 2 replicas switched")
    book.apply(ActorReplicaReport(revision="r2", replica="g1", state="active"))
    assert book.switched("r2", 2) == (False, "1 of 2 replicas switched")
    book.apply(ActorReplicaReport(revision="r2", replica="g2", state="active"))
    assert book.switched("r2", 2) == (True, "2 replicas switched")


def test_rollback_goes_to_the_last_good_revision():
    book = ActorBook()
    for rev in ("r1", "r2", "r3"):
        book.apply(ActorPrepared(spec=spec(rev)))
    assert book.rollback_target() is None
    book.apply(ActorActivated(revision="r1"))
    book.apply(ActorActivated(revision="r2", previous="r1"))
    assert book.rollback_target() == "r1"
    book.apply(ActorActivated(revision="r3", previous="r2"))
    book.apply(ActorRejected(revision="r2", reason="bad"))
    assert book.rollback_target() == "r1"  # r2 was rejected meanwhile


def test_validation_matches_exact_prefix_and_regex():
    assert validation_failure(ValidationPrompt(prompt="p", expected="Paris"), " Paris ") is None
    assert "expected exact" in validation_failure(ValidationPrompt(prompt="p", expected="Paris"), "Lyon")
    assert validation_failure(ValidationPrompt(prompt="p", expected="The", match="prefix"), "The end") is None
    assert validation_failure(ValidationPrompt(prompt="p", expected=r"\d+", match="regex"), "It is 4") is None


async def test_a_replica_reports_through_validation_and_drains_the_old_revision():
    reports: list[tuple[str, str]] = []
    answers = {"r1": "one", "r2": "two"}

    async def publish(rep, ev):
        assert (rep.revision, rep.state) == (ev.revision, ev.transition) and ev.kind == "actor"
        reports.append((rep.revision, rep.state))

    async def load(adapter):
        if adapter.revision == "broken":
            raise EngineError("adapter_unavailable", "checksum mismatch")
        return 12.5

    async def generate(msgs, sampling, adapter):
        assert sampling.temperature == 0.0
        return Generation(text=answers.get(adapter.revision, "?"), prompt_token_ids=[1], token_ids=[2],
                          logprobs=None, finish_reason="stop", ttft_ms=1.0)

    r = ActorReplica("g1", publish)
    r.attach(load, generate)
    ok = ValidationPrompt(prompt="which?", expected="one")
    r.apply(ActorPrepared(spec=spec("r1", [ok])))
    r.apply(ActorPrepared(spec=spec("r2", [ok])))  # r2 answers "two": fails its check
    r.apply(ActorPrepared(spec=spec("broken")))
    await r.drain_tasks()
    assert reports.count(("r1", "validated")) == 1 and ("r1", "loaded") in reports
    assert ("r2", "rejected") in reports and ("r2", "validated") not in reports
    assert ("broken", "rejected") in reports and ("broken", "loaded") not in reports

    r.apply(ActorActivated(revision="r1"))
    await r.drain_tasks()
    assert r.current().revision == "r1" and ("r1", "active") in reports
    r.book.apply(ActorPrepared(spec=spec("r3")))  # recorded only: not loaded by this call
    with r.serving("r1"):  # a request still running on r1 when r3 becomes active
        r.apply(ActorActivated(revision="r3", previous="r1"))
        await r.drain_tasks()
        assert r.current().revision == "r3"
        assert ("r1", "draining") in reports and ("r1", "retired") not in reports
    await asyncio.sleep(0)
    await r.drain_tasks()
    assert reports[-1] == ("r1", "retired")


async def test_a_busy_engine_does_not_reject_a_revision(monkeypatch):
    """A validation prompt that fails to run for a retryable reason (the engine stalled for the
    watchdog's window, as on a 2-core host running two engines) is run again; a revision is rejected
    only when its answer is wrong, a non-retryable error occurs, or every run failed."""
    from pipeline.stages.generate import actor as actor_mod

    monkeypatch.setattr(actor_mod, "VALIDATION_BACKOFF_S", 0.0)
    reports: list[tuple[str, str, str]] = []
    failures = {"stalled-once": ["timeout"], "always-stalled": ["timeout"] * 5, "refused": ["invalid_request"]}
    calls: dict[str, int] = {}

    async def publish(rep, ev):
        reports.append((rep.revision, rep.state, rep.detail))

    async def load(adapter):
        return 1.0

    async def generate(msgs, sampling, adapter):
        rev = adapter.revision
        calls[rev] = calls.get(rev, 0) + 1
        if failures.get(rev):
            raise EngineError(failures[rev].pop(0), "the engine produced no output for 30 s")
        return Generation(text="one", prompt_token_ids=[1], token_ids=[2], logprobs=None, finish_reason="stop",
                          ttft_ms=1.0)

    r = ActorReplica("g1", publish)
    r.attach(load, generate)
    ok = ValidationPrompt(prompt="which?", expected="one")
    for rev in failures:
        r.apply(ActorPrepared(spec=spec(rev, [ok])))
    await r.drain_tasks()
    state = {rev: st for rev, st, _ in reports if st in ("validated", "rejected")}
    assert state == {"stalled-once": "validated", "always-stalled": "rejected", "refused": "rejected"}
    assert calls == {"stalled-once": 2, "always-stalled": actor_mod.VALIDATION_RUNS, "refused": 1}
