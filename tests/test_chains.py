"""Stage chains (docs/design.md, "Stage chains"): consecutive stages with the same partition key in one
worker, a forward to the next stage of the chain handed over in memory. On the session broker with
the test stages: each stage still decides alone and writes its own evidence and timing; nothing is
produced to a chained stage's input topic; a failure inside the chain dead-letters the document as
that stage would have read it; a record produced straight to a chained stage's topic (a jump from
elsewhere) enters the chain there; the topology refuses a chain across a key change. A replay reaches a
chained stage through its chain from the chain's first topic, and refuses to re-run the model on the way
unless asked."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaProducer

from pipeline.analysis.replay import RangeSpec, ReplayError, replay, replay_path
from pipeline.app.assemble import topology_for
from pipeline.app.launch import stage_worker
from pipeline.config.settings import Settings, StageSpec
from pipeline.contracts import DlqRecord, Evidence, RequestDoc
from pipeline.ingress import Client
from pipeline.runtime.codec import decode, encode
from pipeline.runtime.errors import TopologyError
from pipeline.runtime.topics import TopicNames
from pipeline.stores.warehouse import QueryResult
from tests.support.cli import last_json, llmpipe_in_process
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


def test_the_default_topology_chains_where_the_registry_allows_and_chain_false_splits_one_off(tmp_path):
    topo = topology_for(Settings())
    assert topo.groups() == ["mask", "route", "admit", "media", "vision", "generate"]
    assert topo.chain("mask") == ["mask", "cache"] and topo.chain("generate") == ["generate", "postprocess"]
    assert "tenant" in topo.boundary("admit") and "engine" in topo.boundary("generate") and topo.boundary("cache") == ""
    gateway = topology_for(Settings(stages=[StageSpec(name="generate"), StageSpec(name="postprocess")]))
    assert gateway.groups() == ["generate"], "the gateway topology is one chain"
    # a stage without a registry entry chains only when told; one line splits a chain to scale a stage alone
    assert topology_for(Settings(stages=[StageSpec(name="mask"), StageSpec(name="answer", cls="tests.stages:Answer")])
                        ).groups() == ["mask", "answer"]
    split = tmp_path / "split.yaml"
    split.write_text("stages:\n  - name: mask\n  - name: cache\n    chain: false\n  - name: route\n")
    r = llmpipe_in_process("topics", "chains", "--config", str(split), "--json", data_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    groups = {g["group"]: g for g in last_json(r)["groups"]}
    assert list(groups) == ["mask", "cache", "route"] and groups["cache"]["starts_because"].endswith("(chain: false)")
    assert groups["mask"]["consumes"] == ["llmpipe.stage.mask", "llmpipe.requests"]
    # a worker for a stage that runs in another's chain would decide the jumps to it twice: refused
    with pytest.raises(TopologyError, match="runs in the chain of 'generate'.*chain: false"):
        stage_worker(Settings(), topo, "postprocess", "127.0.0.1:1")
    # and `llmpipe worker` says so before it starts anything (no broker, no metrics port)
    r = llmpipe_in_process("worker", "postprocess", data_dir=tmp_path)
    assert r.returncode != 0 and "runs in the chain of 'generate'" in r.stdout + r.stderr, (r.stdout, r.stderr)


def test_a_replay_path_runs_through_the_chain_and_asks_before_re_running_the_model():
    product = topology_for(Settings(stages=[
        StageSpec(name="mask"), StageSpec(name="cache", chain=True), StageSpec(name="route"), StageSpec(name="admit"),
        StageSpec(name="generate"), StageSpec(name="postprocess", chain=True)]))
    names = TopicNames("t.")
    assert replay_path(product, names, "t.stage.mask", "cache") == ["mask", "cache"]
    assert replay_path(product, names, "t.requests", "cache") == ["mask", "cache"]
    assert replay_path(product, names, "t.stage.cache", "cache") == ["cache"], "its own topic: the jumps there"
    assert replay_path(product, names, "t.stage.route", "route") == ["route"]
    with pytest.raises(ReplayError, match="'route' is not chained to 'mask'.*t.stage.route"):
        replay_path(product, names, "t.stage.mask", "route")
    with pytest.raises(ReplayError, match="re-runs 'generate', which calls the model again.*--rerun.*chain: false"):
        replay_path(product, names, "t.stage.generate", "postprocess")
    assert replay_path(product, names, "t.stage.generate", "postprocess", rerun=True) == ["generate", "postprocess"]
    with pytest.raises(ReplayError, match="after 'cache'"):
        replay_path(product, names, "t.stage.route", "cache")


# the stage whose policy a replay changes sits inside the chain, behind the one whose topic holds the records
RELAYED = [{"name": "relay", "class": "tests.stages:Relay"},
           {"name": "classify", "class": "tests.stages:Classify", "chain": True},
           {"name": "answer", "class": "tests.stages:Answer", "chain": True}]


@pytest.mark.integration
@pytest.mark.asyncio(loop_scope="session")
async def test_a_shadow_replay_re_decides_a_chained_stage_from_the_topic_its_chain_reads(broker, prefix, tmp_path):
    s = settings_for(tmp_path, prefix, broker.bootstrap, RELAYED)
    await create_topics(s)
    names = TopicNames(prefix)
    prompts = ["hi", "short one", "a prompt well above the twenty characters"]
    async with stage_worker(s, topology_for(s), "relay", broker.bootstrap), \
            Client(broker.bootstrap, topic_prefix=prefix) as client:
        answers = await asyncio.gather(*(client.request(client.build(p), 60) for p in prompts))
    assert [a.route for a in answers] == ["short", "short", "long"]
    assert await read_until_quiet(broker.bootstrap, names.stage_input("classify"), 1, timeout=3) == []
    original = [decode(r.value, Evidence) for r in await read_until_quiet(broker.bootstrap, names.evidence, 2)]

    def query(sql: str, params: dict) -> QueryResult:  # the warehouse's answer, from the evidence topic
        rows = [(e.request_id, e.attempt, e.stage, e.decision, e.reason, e.labels.get("variant", ""))
                for e in original if e.stage in params["stages"] and e.request_id in params["ids"]]
        return QueryResult(["request_id", "attempt", "stage", "decision", "reason", "variant"], rows)

    report = await replay(s, broker.bootstrap, topic="requests", stage="classify", rng=RangeSpec(),
                          policy={"threshold": 1}, shadow=True, replay_id="r-chain", query=query)
    assert report.through == ["relay", "classify"] and report.records == 3
    # relay re-decided as before; classify under the new threshold calls every prompt long
    assert report.compared == 6 and report.changed == 2, report.as_json()
    assert report.transitions == {("classify", "short -> long"): 2}
    assert sorted(report.changed_ids) == sorted(a.request_id for a in answers[:2])
    # shadow: evidence only, every row marked; no answer, nothing on the chained stages' topics
    replayed = [e for r in await read_until_quiet(broker.bootstrap, names.evidence, 2)
                if (e := decode(r.value, Evidence)).replay_id == "r-chain"]
    assert sorted(e.stage for e in replayed) == ["classify"] * 3 + ["relay"] * 3 and all(e.shadow for e in replayed)
    assert len(await read_until_quiet(broker.bootstrap, names.responses, 1)) == 3
    assert await read_until_quiet(broker.bootstrap, names.stage_input("classify"), 1, timeout=3) == []
