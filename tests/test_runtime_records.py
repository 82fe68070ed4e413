"""The record protocol on a real broker: DLQ paths, deadlines, answers and evidence."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from pipeline.app.assemble import topology_for
from pipeline.app.launch import stage_worker
from pipeline.contracts import DlqRecord, Evidence, Response
from pipeline.ingress import Client
from pipeline.runtime.codec import decode
from pipeline.runtime.topics import TopicNames
from tests.stages import Answer
from tests.support.kafka import (
    create_topics,
    read_topic,
    read_until_quiet,
    settings_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


async def test_poison_records_land_in_dlq_and_the_stage_goes_on(broker, prefix, tmp_path):
    s = settings_for(tmp_path, prefix, broker.bootstrap, [{"name": "answer", "class": "tests.stages:Answer"}])
    await create_topics(s)
    names = TopicNames(prefix)
    async with stage_worker(s, topology_for(s), "answer", broker.bootstrap), \
            Client(broker.bootstrap, topic_prefix=prefix) as client:
        not_json = b"\xff\xfe this is { not json"
        good = client.build("fine")
        invalid = orjson.loads(client.build("x").model_dump_json())
        invalid["body"]["messages"] = "not-a-list"  # schema-invalid, but request_id and reply_to readable
        explode = client.build("please explode")
        p = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
        await p.start()
        try:
            await p.send_and_wait(names.requests, not_json, key=b"k1", headers=[("request_id", b"raw-1")])
            await p.send_and_wait(names.requests, orjson.dumps(invalid), key=invalid["request_id"].encode())
        finally:
            await p.stop()
        f_invalid = client._pending.setdefault(invalid["request_id"], asyncio.get_running_loop().create_future())
        explode_resp, good_resp = await asyncio.gather(client.request(explode, 60), client.request(good, 60))
        invalid_resp = await client.wait(invalid["request_id"], f_invalid, 60)

    assert good_resp.status == "ok" and good_resp.text == "FINE"
    assert explode_resp.status == "error" and explode_resp.error_class == "test_explosion"
    assert invalid_resp.status == "error" and invalid_resp.error_class == "schema_invalid"

    dlq = [decode(r.value, DlqRecord) for r in await read_topic(broker.bootstrap, names.dlq, 3)]
    by_class = {d.error_class: d for d in dlq}
    assert set(by_class) == {"undecodable", "schema_invalid", "test_explosion"}
    assert by_class["undecodable"].original_value() == not_json
    assert by_class["undecodable"].original_key() == b"k1"
    assert ("request_id", "cmF3LTE=") in by_class["undecodable"].headers  # base64 of raw-1
    assert orjson.loads(by_class["schema_invalid"].original_value()) == invalid
    assert "body.messages" in by_class["schema_invalid"].error
    assert "not-a-list" not in by_class["schema_invalid"].error  # values are not echoed
    assert by_class["test_explosion"].attempts == s.runtime.max_attempts
    assert orjson.loads(by_class["test_explosion"].original_value())["request_id"] == explode.request_id


async def test_a_record_past_its_deadline_is_answered_and_never_processed(broker, prefix, tmp_path):
    s = settings_for(tmp_path, prefix, broker.bootstrap, [{"name": "answer", "class": "tests.stages:Answer"}])
    await create_topics(s)
    names = TopicNames(prefix)
    async with Client(broker.bootstrap, topic_prefix=prefix) as client:
        late = client.build("too late", deadline_ms=int(time.time() * 1000) - 1000)
        fut = await client.submit(late)  # published before any worker runs
        before = Answer.processed
        async with stage_worker(s, topology_for(s), "answer", broker.bootstrap):
            resp = await client.wait(late.request_id, fut, 60)
            on_time = await client.request(client.build("on time"), 60)
    assert resp.status == "deadline_exceeded" and resp.error_class == "deadline_exceeded"
    assert on_time.status == "ok"
    assert Answer.processed == before + 1  # only the on-time request reached the stage
    evidence = [decode(r.value, Evidence) for r in await read_topic(broker.bootstrap, names.evidence, 2)]
    late_ev = [e for e in evidence if e.request_id == late.request_id]
    assert [e.decision for e in late_ev] == ["deadline_exceeded"]
    responses = [decode(r.value, Response) for r in await read_topic(broker.bootstrap, names.responses, 2)]
    assert sorted(r.status.value for r in responses) == ["deadline_exceeded", "ok"]


async def test_a_request_published_by_another_kafka_client_is_answered(broker, prefix, tmp_path):
    """confluent-kafka (librdkafka) as the producer: the wire contract as other people's code uses it."""
    from confluent_kafka import Producer

    s = settings_for(tmp_path, prefix, broker.bootstrap, [{"name": "answer", "class": "tests.stages:Answer"}])
    await create_topics(s)
    names = TopicNames(prefix)
    async with stage_worker(s, topology_for(s), "answer", broker.bootstrap), \
            Client(broker.bootstrap, topic_prefix=prefix) as client:
        doc = client.build("from librdkafka")
        fut = client._pending.setdefault(doc.request_id, asyncio.get_running_loop().create_future())
        value = orjson.dumps({"schema": "request/v1", "request_id": doc.request_id, "deadline_ms": doc.deadline_ms,
                              "reply_to": {"topic": names.responses, "partition": client.reply_partition},
                              "body": {"messages": [{"role": "user", "content": "from librdkafka"}]}})
        errors = []
        p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "enable.idempotence": False})
        p.produce(names.requests, value, key=doc.request_id.encode(), headers=[("request_id", doc.request_id.encode())],
                  on_delivery=lambda err, msg: errors.append(err))
        await asyncio.to_thread(p.flush, 30)
        assert errors == [None]
        resp = await client.wait(doc.request_id, fut, 60)
    assert resp.status == "ok" and resp.text == "FROM LIBRDKAFKA"


async def test_an_output_too_large_for_its_topic_is_answered_and_the_stage_goes_on(broker, prefix, tmp_path):
    """A document that grows past the record limit used to be retried forever, pinning its slot and
    its offset; now it is one `too_large` answer with evidence, and later records flow."""
    s = settings_for(tmp_path, prefix, broker.bootstrap,
                     [{"name": "grow", "class": "tests.stages:Grow", "policy": {"pad_bytes": 9 << 20}},
                      {"name": "answer", "class": "tests.stages:Answer"}])
    await create_topics(s)
    names = TopicNames(prefix)
    topo = topology_for(s)
    async with stage_worker(s, topo, "grow", broker.bootstrap), stage_worker(s, topo, "answer", broker.bootstrap), \
            Client(broker.bootstrap, topic_prefix=prefix) as client:
        big, small = client.build("please grow"), client.build("stay small")
        big_resp, small_resp = await asyncio.gather(client.request(big, 60), client.request(small, 60))
        after = await client.request(client.build("after it"), 60)
    assert big_resp.status == "error" and big_resp.error_class == "too_large", big_resp
    assert "grew to" in big_resp.reason and "stage grow" in big_resp.reason
    assert small_resp.status == "ok" and after.status == "ok" and after.text == "AFTER IT"
    evidence = [decode(r.value, Evidence) for r in await read_topic(broker.bootstrap, names.evidence, 6)]
    assert [(e.stage, e.decision, e.reason) for e in evidence if e.request_id == big.request_id
            and e.decision == "error"] == [("grow", "error", "too_large")]
    answers = [decode(r.value, Response) for r in await read_topic(broker.bootstrap, names.responses, 3)]
    assert sum(r.request_id == big.request_id for r in answers) == 1  # one terminal answer


async def test_a_request_cancelled_before_a_stage_is_answered_there_and_never_processed(broker, prefix, tmp_path):
    s = settings_for(tmp_path, prefix, broker.bootstrap,
                     [{"name": "slow", "class": "tests.stages:Sleep", "policy": {"sleep_ms": 1500, "forward": True}},
                      {"name": "answer", "class": "tests.stages:Answer"}])
    await create_topics(s)
    names = TopicNames(prefix)
    topo = topology_for(s)
    async with stage_worker(s, topo, "slow", broker.bootstrap), stage_worker(s, topo, "answer", broker.bootstrap), \
            Client(broker.bootstrap, topic_prefix=prefix) as client:
        kept, withdrawn = client.build("keep me"), client.build("withdraw me")
        before = Answer.processed
        futs = [await client.submit(withdrawn), await client.submit(kept)][::-1]
        await asyncio.sleep(0.5)  # the withdrawn one is being processed by `slow`
        await client.cancel(withdrawn.request_id, "operator")
        kept_resp = await client.wait(kept.request_id, futs[0], 60)
        resp = await client.wait(withdrawn.request_id, futs[1], 60)
    assert kept_resp.status == "ok" and kept_resp.text == "KEEP ME"
    assert resp.status == "cancelled" and resp.error_class == "cancelled" and resp.answered_by == "answer"
    assert Answer.processed == before + 1  # the withdrawn request never reached the stage's code
    evidence = [decode(r.value, Evidence) for r in await read_topic(broker.bootstrap, names.evidence, 4)]
    mine = [(e.stage, e.decision, e.reason) for e in evidence if e.request_id == withdrawn.request_id]
    assert mine == [("slow", "slept", ""), ("answer", "cancelled", "withdrawn before stage answer (operator)")]


async def test_a_reply_to_the_stage_may_not_write_to_is_answered_once_and_never_followed(broker, prefix, tmp_path):
    """Issue 35, finding 3, on the real producer: aiokafka 0.14 asserts a partition is in its
    metadata (AssertionError "Unrecognized partition"), and the salvaged answer of a bare record
    with partition 99999 was retried forever, pinning a processor and the partition's commit (and
    re-sending its dead letter each time). A foreign topic had the stage write there for the sender."""
    s = settings_for(tmp_path, prefix, broker.bootstrap, [{"name": "answer", "class": "tests.stages:Answer"}])
    await create_topics(s)
    names = TopicNames(prefix)
    async with stage_worker(s, topology_for(s), "answer", broker.bootstrap), \
            Client(broker.bootstrap, topic_prefix=prefix) as client:
        def doc(rid: str, reply: object) -> bytes:
            obj = orjson.loads(client.build("poison", request_id=rid).model_dump_json(by_alias=True))
            return orjson.dumps({**obj, "reply_to": reply})

        poison = {
            "bare-far": orjson.dumps({"request_id": "bare-far", "reply_to": {"topic": names.responses, "partition": 99999}}),
            "doc-far": doc("doc-far", {"topic": names.responses, "partition": 99999}),
            "doc-state": doc("doc-state", {"topic": names("admit.state"), "partition": 0}),
            "doc-requests": doc("doc-requests", {"topic": names.requests, "partition": 0}),
        }
        p = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
        await p.start()
        try:
            for rid, value in poison.items():
                await p.send_and_wait(names.requests, value, key=rid.encode())
        finally:
            await p.stop()
        after = await client.request(client.build("after the poison"), 60)
        answers = [decode(r.value, Response) for r in await read_topic(broker.bootstrap, names.responses, len(poison) + 1)]
        dlq = [decode(r.value, DlqRecord) for r in await read_until_quiet(broker.bootstrap, names.dlq, quiet_s=1.5, timeout=30)]
    assert after.status == "ok" and after.text == "AFTER THE POISON"
    mine = {r.request_id: r for r in answers if r.request_id in poison}
    assert set(mine) == set(poison)
    for rid in ("doc-far", "doc-state", "doc-requests"):
        assert mine[rid].status == "error" and mine[rid].error_class == "invalid_reply_to", mine[rid]
    assert mine["bare-far"].status == "error" and mine["bare-far"].error_class == "schema_invalid"
    assert sorted(d.request_id or orjson.loads(d.original_value())["request_id"] for d in dlq) == sorted(poison)
    state = await read_until_quiet(broker.bootstrap, names("admit.state"), quiet_s=1.0, timeout=5)
    requests = await read_until_quiet(broker.bootstrap, names.requests, quiet_s=1.0, timeout=10)
    assert state == [] and len(requests) == len(poison) + 1  # nothing written for the sender
