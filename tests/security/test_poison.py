"""Issue 35, finding 3: poison `reply_to`s on every partition of `requests`, against the running stack.

A record's reply_to may name only the stack's `responses` topic and a partition it has. Before the
fix, a partition the topic lacks made aiokafka 0.14's producer raise `AssertionError:
Unrecognized partition` while the salvaged error answer was sent, and the worker retried that
batch forever: each such record pinned one of mask's 16 processors and its partition's commit
(re-sending its dead letter at every try), so 16 of them stopped mask; a topic of the sender's
choosing (admit's state, `requests`) had mask write the answer there for them.

Here every poison record must be answered exactly once with an error on `responses` (on the
record's key, never the partition it asked for) and dead-lettered, nothing may be written for them
to the topics they named, and ordinary requests on every partition must be answered meanwhile.
"""

from __future__ import annotations

import base64
import time
import uuid
from pathlib import Path

import orjson
import pytest

from pipeline.runtime.topics import TopicNames
from pipeline.runtime.wakeup.doorbell import producer_class
from tests.support.kafka import read_until_quiet

pytestmark = pytest.mark.integration


def _poison(names: TopicNames, run: str, p: int, alice: str) -> dict[str, bytes]:
    """The issue's bare record, and the same reply_tos on otherwise valid documents."""
    replies: dict[str, object] = {
        "far": {"topic": names.responses, "partition": 99999},
        "huge": {"topic": names.responses, "partition": 2**31},
        "negative": {"topic": names.responses, "partition": -1},
        "requests": {"topic": names.requests, "partition": 0},
        "state": {"topic": names("admit.state"), "partition": 0},
        "other": {"topic": "some.other.topic", "partition": 0},
        "scalar": "llmpipe.responses",
    }
    out: dict[str, bytes] = {}
    for kind, reply in replies.items():
        rid = f"{run}-bare-{kind}-{p}"
        out[rid] = orjson.dumps({"request_id": rid, "reply_to": reply})
        rid = f"{run}-doc-{kind}-{p}"
        out[rid] = orjson.dumps({**_doc(rid, alice, f"poison {kind} {p}"), "reply_to": reply})
    return out


def _doc(rid: str, api_key: str, prompt: str) -> dict:
    return {"schema": "request/v1", "request_id": rid, "api_key": api_key, "deadline_ms": int(time.time() * 1000) + 120_000,
            "body": {"messages": [{"role": "user", "content": prompt}]}}


async def _read_when(bootstrap: str, topic: str, done, timeout: float) -> list:
    """Every record of `topic` (read until none came for 2 s: a second answer to one request would
    come within that), read again until `done(records)` holds or `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        records = await read_until_quiet(bootstrap, topic, quiet_s=2.0, timeout=60)
        if done(records) or time.monotonic() > deadline:
            return records


async def test_poison_reply_tos_on_every_partition_are_refused_and_mask_keeps_serving(review_stack):
    info = review_stack.info
    names, bootstrap = TopicNames(info["topic_prefix"]), info["bootstrap"]
    run = f"p{uuid.uuid4().hex[:8]}"
    cls, extra = producer_class(Path(info["doorbell_dir"]) if info.get("doorbell_dir") else None)
    producer = cls(bootstrap_servers=bootstrap, acks="all", **extra)  # rings mask like any producer of the stack
    await producer.start()
    try:
        partitions = sorted(await producer.partitions_for(names.requests))
        assert len(partitions) > 1
        poison: dict[str, bytes] = {}
        for p in partitions:  # the poison first, on every partition: then an ordinary request on each
            for rid, value in _poison(names, run, p, review_stack.keys["alice"]).items():
                poison[rid] = value
                await producer.send_and_wait(names.requests, value, key=rid.encode(), partition=p)
        ordinary = {}
        for p in partitions:
            rid = f"{run}-ok-{p}"
            doc = {**_doc(rid, review_stack.keys["alice"], f"an ordinary question {rid}"),
                   "reply_to": {"topic": names.responses, "partition": p}}
            ordinary[rid] = p
            await producer.send_and_wait(names.requests, orjson.dumps(doc), key=rid.encode(), partition=p)
    finally:
        await producer.stop()

    def answered(records: list) -> bool:
        seen = {orjson.loads(r.value)["request_id"] for r in records}
        return seen >= set(poison) | set(ordinary)

    responses = await _read_when(bootstrap, names.responses, answered, timeout=180)
    answers: dict[str, list] = {}
    for r in responses:
        body = orjson.loads(r.value)
        if body["request_id"].startswith(run):
            answers.setdefault(body["request_id"], []).append((r.partition, body))
    missing = (set(poison) | set(ordinary)) - set(answers)
    assert not missing, f"{len(missing)} requests never answered, e.g. {sorted(missing)[:5]}"

    for rid, p in ordinary.items():  # mask served every partition of `requests` meanwhile
        (partition, body), = answers[rid]
        assert body["status"] == "ok" and partition == p, body
    for rid in poison:
        assert len(answers[rid]) == 1, (rid, answers[rid])  # once, never retried
        partition, body = answers[rid][0]
        assert body["status"] == "error" and body["answered_by"] == "mask", body
        kind = rid.split("-")[2]
        if rid.split("-")[1] == "doc" and kind not in ("negative", "scalar"):
            assert body["error_class"] == "invalid_reply_to" and "reply_to names" in body["reason"], body
        if kind in ("far", "huge"):
            assert partition < 99999  # on the key's partition, not the one it asked for

    dead = {_dead_id(r.value) for r in await _read_when(bootstrap, names.dlq, lambda recs: set(poison) <= {
        _dead_id(r.value) for r in recs}, timeout=60)}
    assert set(poison) <= dead, sorted(set(poison) - dead)[:5]

    # nothing was written for the senders to the topics they named (the only `requests` records
    # that hold their ids are the ones this test published)
    named = [r for t in (names("admit.state"), names.requests) for r in await read_until_quiet(bootstrap, t, 2.0, 60)]
    hits: dict[str, int] = {}
    for r in named:
        for rid in poison:
            if r.value and rid.encode() in r.value:
                hits[f"{r.topic}:{rid}"] = hits.get(f"{r.topic}:{rid}", 0) + 1
    assert not [k for k in hits if k.startswith(names("admit.state"))], hits
    assert all(hits.get(f"{names.requests}:{rid}") == 1 for rid in poison), hits


def _dead_id(value: bytes) -> str | None:
    """The request_id of the record a dead letter keeps (this test's records are all JSON)."""
    try:
        return orjson.loads(base64.b64decode(orjson.loads(value)["value_b64"])).get("request_id")
    except (ValueError, KeyError, AttributeError):
        return None
