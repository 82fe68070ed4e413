"""Stage chains (docs/design.md, "Stage chains"): consecutive stages with the same partition key in one
worker, a forward to the next stage of the chain handed over in memory. On the session broker with
the test stages: each stage still decides alone and writes its own evidence and timing; nothing is
produced to a chained stage's input topic; a failure inside the chain dead-letters the document as
that stage would have read it; a record produced straight to a chained stage's topic (a jump from
elsewhere) enters the chain there; the topology refuses a chain across a key change."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaProducer

from pipeline.app.assemble import topology_for
from pipeline.app.launch import stage_worker
from pipeline.config.settings import Settings, StageSpec
from pipeline.contracts import DlqRecord, Evidence, RequestDoc
from pipeline.ingress import Client
from pipeline.runtime.codec import decode, encode
from pipeline.runtime.errors import TopologyError
from pipeline.runtime.topics import TopicNames
from tests.support.kafka import create_topics, read_topic, read_until_quiet, settings_for

CHAIN = [{"name": "classify", "class": "tests.stages:Classify"},
         {"name": "relay", "class": "tests.stages:Relay", "chain": True},
         {"name": "answer", "class": "tests.stages:Answer", "chain": True}]


def test_the_topology_groups_chains_and_refuses_one_across_a_key_change():
    s = Settings(stages=[StageSpec.model_validate(x) for x in CHAIN])
    topo = topology_for(s)
    assert topo.groups() == ["classify"] and topo.chain("classify") == ["classify", "relay", "answer"]
    assert topo.head_of("answer") == "classify"
    unchained = topology_for(Settings(stages=[StageSpec.model_validate({**x, "chain": False}) for x in CHAIN]))
    assert unchained.groups() == ["classify", "relay", "answer"]
    # route's input is keyed by device_id|request_id, cache's by request_id: a topic must move the record
    with pytest.raises(TopologyError, match="cannot chain to 'cache'.*keyed by 'device_id|request_id'"):
        topology_for(Settings(stages=[StageSpec(name="mask"), StageSpec(name="cache"),
                                      StageSpec(name="route", chain=True)]))
    with pytest.raises(TopologyError, match="is first"):
        topology_for(Settings(stages=[StageSpec(name="mask", chain=True)]))


@pytest.mark.integration
@pytest.mark.asyncio(loop_scope="session")
async def test_a_chain_decides_stage_by_stage_in_one_worker(broker, prefix, tmp_path):
    s = settings_for(tmp_path, prefix, broker.bootstrap, CHAIN)
    await create_topics(s)
    names = TopicNames(prefix)
    async with stage_worker(s, topology_for(s), "classify", broker.bootstrap), \
            Client(broker.bootstrap, topic_prefix=prefix) as client:
        fine, boom = client.build("fine"), client.build("please explode")
        # a jump from elsewhere straight onto a chained stage's topic enters the chain there
        jumped = client.build("jumped in")
        fut = client._pending.setdefault(jumped.request_id, asyncio.get_running_loop().create_future())
        p = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
        await p.start()
        try:
            await p.send_and_wait(names.stage_input("answer"), encode(jumped), key=jumped.request_id.encode())
        finally:
            await p.stop()
        fine_resp, boom_resp = await asyncio.gather(client.request(fine, 60), client.request(boom, 60))
        jumped_resp = await client.wait(jumped.request_id, fut, 60)

    assert fine_resp.status == "ok" and fine_resp.text == "FINE" and fine_resp.route == "short"
    assert boom_resp.status == "error" and boom_resp.error_class == "test_explosion"
    assert jumped_resp.status == "ok" and jumped_resp.text == "JUMPED IN"
    # each stage wrote its own evidence, with its own timing, for the request that went through
    evidence = [decode(r.value, Evidence) for r in await read_until_quiet(broker.bootstrap, names.evidence, 2)]
    mine = {e.stage: e for e in evidence if e.request_id == fine.request_id}
    assert set(mine) == {"classify", "relay", "answer"}, mine
    assert mine["classify"].finished_ms <= mine["relay"].started_ms <= mine["answer"].started_ms
    assert all(e.worker == mine["classify"].worker for e in mine.values())
    assert {t for t in fine_resp.timings} == {"classify", "relay", "answer"}
    # nothing went through the chained stages' topics but the one record produced there on purpose
    relayed = await read_until_quiet(broker.bootstrap, names.stage_input("relay"), 1, timeout=5)
    answered = await read_until_quiet(broker.bootstrap, names.stage_input("answer"), 1, timeout=5)
    assert relayed == [] and [r.key for r in answered] == [jumped.request_id.encode()]
    # the failure inside the chain: dead-lettered as the answer stage read it, attributed to it
    [dl] = [decode(r.value, DlqRecord) for r in await read_topic(broker.bootstrap, names.dlq, 1)]
    assert dl.stage == "answer" and dl.error_class == "test_explosion" and dl.topic == names.stage_input("answer")
    original = decode(dl.original_value(), RequestDoc)
    assert original.request_id == boom.request_id and original.labels.get("class") == "short"
    assert [t.stage for t in original.timings] == ["classify", "relay"]
