"""RolloutStream (pipeline/training/stream.py): staleness, group assembly and the commit point without a
broker; then on the embedded broker, an actor switch, a trainer killed with kill -9 and restarted,
and the consumption records in the warehouse's report."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from aiokafka import TopicPartition

from pipeline.contracts import Rollout
from pipeline.contracts.actor import ActorActivated
from pipeline.runtime.codec import encode
from pipeline.training.samples import TenantScope
from pipeline.training.stream import OffsetBook, staleness, weights_revision
from pipeline.training.stream import RolloutStream as _RolloutStream
from tests.support.kafka import create_topics, settings_for
from tests.support.paths import ROOT
from tests.support.procs import Sink
from tests.support.waits import wait_until

TP = TopicPartition("llmpipe.rollouts", 0)
LAB = TenantScope.of(["lab"])


def RolloutStream(*args, tenants: TenantScope = LAB, **kw) -> _RolloutStream:  # the class, for tenant lab
    return _RolloutStream(*args, tenants=tenants, **kw)


def sample(request_id: str, i: int, n: int, actor: str = "smol@sha256:aa+actor@r1", created_ms: int = 0,
           tenant: str = "lab") -> Rollout:
    return Rollout(sample_id=f"{request_id}:{i}", group_id=f"g-{request_id}", request_id=request_id, tenant_id=tenant,
                   actor_revision=actor, temperature=1.0, top_p=1.0, max_tokens=8, prompt_token_ids=[1, 2],
                   generated_token_ids=[3], logprobs=[-0.1], finish_reason="stop", score=0.5,
                   batch_context=orjson.dumps({"n": n}).decode(), **({"created_ms": created_ms} if created_ms else {}))


def test_weights_revision_and_staleness_count_activations_behind_the_active_one():
    assert weights_revision("smol@sha256:aa+actor@r2") == "r2"
    assert weights_revision("smol@sha256:aa") is None
    assert weights_revision("smol@sha256:aa+support-lora@r1") is None  # a LoRA adapter is not the actor
    history = ["r1", "r2", None, "r3"]  # a rollback to the base model, then r3
    assert [staleness(history, r) for r in ("r3", None, "r2", "r1", "r9")] == [0, 1, 2, 3, 4]
    assert staleness(["r1", "r2", "r1"], "r1") == 0  # re-activated: its last activation counts
    assert staleness([], None) == 0 and staleness([], "r1") == 0


def test_the_commit_point_stops_at_the_first_offset_still_pending():
    book = OffsetBook()
    for off in range(5):
        book.consumed(TP, off)
    assert book.advanced() == {}  # 0 is pending: nothing to commit
    book.done(TP, 1)
    book.done(TP, 2)
    assert book.advanced() == {}
    book.done(TP, 0)
    assert book.advanced() == {TP: 3}
    assert book.advanced() == {}  # it moved only once
    book.done(TP, 4)
    book.done(TP, 3)
    assert book.advanced() == {TP: 5}


def test_groups_complete_at_n_samples_and_stale_ones_are_dropped_or_flagged():
    s = RolloutStream("unused:9092", max_staleness=0)
    s.book.apply(ActorActivated(revision="r1", previous=None))
    s.book.apply(ActorActivated(revision="r2", previous="r1"))
    records = [sample("a", 0, 2), sample("b", 0, 2, actor="smol@sha256:aa+actor@r2"), sample("a", 1, 2),
               sample("a", 1, 2), sample("b", 1, 2, actor="smol@sha256:aa+actor@r2")]
    for off, r in enumerate(records):
        s._take(TP, off, encode(r), now_ms=r.created_ms + 25)
    s._release()
    assert [g.request_id for g, _ in s._ready] == ["b"]  # a (r1) is one activation behind r2: dropped
    assert s.dropped == {"smol@sha256:aa+actor@r1": 2}
    (g, p) = s._ready[0]
    assert [x.sample_id for x in g.samples] == ["b:0", "b:1"] and g.staleness == 0 and not g.stale
    assert p.ages_ms == [25.0, 25.0]
    # a's offsets (0, 2, and the duplicate at 3) are done; b's (1, 4) wait for the trainer's ack
    assert s.offsets.advanced() == {TP: 1}

    flag = RolloutStream("unused:9092", max_staleness=0, stale="flag")
    flag.book.apply(ActorActivated(revision="r1", previous=None))
    flag.book.apply(ActorActivated(revision="r2", previous="r1"))
    for off, r in enumerate(records[:3]):
        flag._take(TP, off, encode(r), now_ms=0)
    flag._release()
    assert [(g.request_id, g.stale, g.staleness) for g, _ in flag._ready] == [("a", True, 1)]


def test_a_stream_reads_only_its_tenants_and_needs_them_named():
    s = RolloutStream("unused:9092")
    # mallory's samples, one of them under lab's request id: skipped, done, counted; never in a group
    for off, r in enumerate([sample("a", 0, 2, tenant="mallory"), sample("a", 0, 2), sample("m", 0, 1, tenant="mallory"),
                             sample("a", 1, 2)]):
        s._take(TP, off, encode(r), now_ms=0)
    s._release()
    assert [(g.request_id, [x.tenant_id for x in g.samples]) for g, _ in s._ready] == [("a", ["lab", "lab"])]
    assert s.other_tenants == 2
    both = RolloutStream("unused:9092", tenants=TenantScope.of(["lab", "mallory"]))
    for off, r in enumerate([sample("a", 0, 1, tenant="mallory"), sample("a", 0, 1)]):
        both._take(TP, off, encode(r), now_ms=0)
    both._release()
    # one request id in two tenants is two groups
    assert sorted(g.samples[0].tenant_id for g, _ in both._ready) == ["lab", "mallory"]
    with pytest.raises(TypeError):
        _RolloutStream("unused:9092")  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="--all-tenants"):
        TenantScope.of([])
    with pytest.raises(ValueError, match="not both"):
        TenantScope.of(["lab"], all_tenants=True)


def test_an_unreadable_record_is_skipped_and_counts_as_done():
    s = RolloutStream("unused:9092")
    s._take(TP, 0, b"{not json", now_ms=0)
    assert s.unreadable == 1 and s.offsets.advanced() == {TP: 1}


def test_a_complete_group_waits_behind_an_incomplete_one_of_its_partition():
    s = RolloutStream("unused:9092", partial_timeout_s=60)
    other = TopicPartition("llmpipe.rollouts", 1)
    s._take(TP, 0, encode(sample("slow", 0, 2)), now_ms=0)  # half a group at offset 0
    s._take(TP, 1, encode(sample("quick", 0, 1)), now_ms=0)  # complete, after it
    s._take(other, 0, encode(sample("elsewhere", 0, 1)), now_ms=0)  # complete, another partition
    s._release()
    assert [g.request_id for g, _ in s._ready] == ["elsewhere"]  # quick is held: yielding it could not be committed
    s._take(TP, 2, encode(sample("slow", 1, 2)), now_ms=0)
    s._release()
    assert [g.request_id for g, _ in s._ready] == ["elsewhere", "slow", "quick"]  # in offset order
    expired = RolloutStream("unused:9092", partial_timeout_s=0)
    expired._take(TP, 0, encode(sample("never", 0, 3)), now_ms=0)
    expired._take(TP, 1, encode(sample("quick", 0, 1)), now_ms=0)
    expired._expire()
    expired._release()
    assert expired.incomplete == 1 and [g.request_id for g, _ in expired._ready] == ["quick"]


async def test_batches_are_acknowledged_in_the_order_they_were_yielded():
    from pipeline.training.stream import Batch

    s = RolloutStream("unused:9092")
    s.consumer = s.producer = object()  # ack refuses before it touches either
    s._unacked = ["first", "second"]
    with pytest.raises(ValueError, match="in the order they were yielded"):
        await s.ack(Batch(batch_id="second", groups=[], idle_ms=0))


# ---- on the embedded broker --------------------------------------------------------------------


def _follow(tmp_path, settings, name: str, *args: str) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / f"{name}.out"
    env = {**os.environ, "LLMPIPE_BOOTSTRAP": settings.bootstrap, "LLMPIPE_TOPIC_PREFIX": settings.topic_prefix,
           "LLMPIPE_DATA_DIR": str(tmp_path)}
    with open(out, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "rollouts", "follow", "--json", "--tenant", "lab",
                                 *args],
                                cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
    return proc, out


def _acked(out: Path) -> list[dict]:
    return [orjson.loads(line) for line in out.read_bytes().splitlines() if line.startswith(b'{"acked"')]


async def _publish(bootstrap: str, topic: str, records: list, partition: int | None = 0) -> None:
    from aiokafka import AIOKafkaProducer

    p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await p.start()
    try:
        for r in records:
            key = getattr(r, "request_id", None) or f"actor:{getattr(r, 'revision', '')}"
            await p.send_and_wait(topic, encode(r), key=key.encode(), partition=partition)
    finally:
        await p.stop()


@pytest.mark.integration
async def test_a_killed_trainer_repeats_and_loses_no_acknowledged_group_and_stale_ones_are_dropped(
        broker, prefix, tmp_path):
    from pipeline.analysis.report import query_text
    from pipeline.runtime.topics import TopicNames

    s = settings_for(tmp_path, prefix, broker.bootstrap, [])
    await create_topics(s)
    names = TopicNames(prefix)
    sink = Sink(s, tmp_path)
    r1, r2, r3 = ("smol@sha256:aa+actor@" + r for r in ("r1", "r2", "r3"))
    try:
        await sink.ready()
        await _publish(broker.bootstrap, names("control"), [ActorActivated(revision="r1", previous=None)], None)
        # partition 0: a0 a1, then half of `late`, then a2 a3 (held behind `late` until it completes)
        first = [*(sample(g, i, 2, r1) for g in ("a0", "a1") for i in range(2)), sample("late", 0, 2, r1),
                 *(sample(g, i, 2, r1) for g in ("a2", "a3") for i in range(2))]
        await _publish(broker.bootstrap, names("rollouts"), first)
        run1, out1 = _follow(tmp_path, s, "run1", "--batch-groups", "1", "--max-staleness", "5")
        await wait_until(lambda: len(_acked(out1)) >= 2 or run1.poll() is not None, 120, "two batches acknowledged")
        await asyncio.sleep(2)  # a2 and a3 are complete and in the trainer: only `late` holds them back
        run1.kill()  # kill -9
        run1.wait()
        assert [b["groups"] for b in _acked(out1)] == [["a0"], ["a1"]], out1.read_text()

        await _publish(broker.bootstrap, names("rollouts"), [sample("late", 1, 2, r1)])
        run2, out2 = _follow(tmp_path, s, "run2", "--batch-groups", "1", "--max-staleness", "5", "--max-batches", "3")
        assert run2.wait(120) == 0, out2.read_text()
        assert [b["groups"] for b in _acked(out2)] == [["late"], ["a2"], ["a3"]]  # nothing acknowledged comes back

        # the actor moves on twice: r1 is now two activations behind r3
        await _publish(broker.bootstrap, names("control"), [ActorActivated(revision="r2", previous="r1"),
                                                            ActorActivated(revision="r3", previous="r2")], None)
        await _publish(broker.bootstrap, names("rollouts"), [
            *(sample("old", i, 2, r1) for i in range(2)), *(sample("prev", i, 2, r2) for i in range(2)),
            *(sample("new", i, 2, r3) for i in range(2))])
        run3, out3 = _follow(tmp_path, s, "run3", "--batch-groups", "2", "--max-staleness", "1", "--max-batches", "1")
        assert run3.wait(120) == 0, out3.read_text()
        (batch,) = _acked(out3)
        assert batch["groups"] == ["prev", "new"] and batch["dropped"] == {r1: 2}

        rows = await wait_until(lambda: sink.query("SELECT sum(samples), count() FROM rollout_consumption FINAL")[0][1]
                                >= 6 and sink.query(query_text("rl_operations"), {"since": "2000-01-01 00:00:00"}),
                                60, "the consumption records in the warehouse")
        (ops,) = rows
        cols = ["rollout_samples", "generated_tokens", "generated_tokens_per_s", "samples_requested",
                "sample_completion_rate", "consumed_samples", "queue_age_p50_ms", "queue_age_p95_ms",
                "trainer_idle_share", "stale_dropped", "stale_flagged"]
        ops = dict(zip(cols, ops))
        assert ops["consumed_samples"] == 14 and ops["stale_dropped"] == 2
        assert ops["queue_age_p95_ms"] >= ops["queue_age_p50_ms"] > 0 and 0 < ops["trainer_idle_share"] < 1
    finally:
        sink.stop()
