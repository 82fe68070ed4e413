"""Lifecycles: the broker command, topics apply, micro-batching, graceful drain on SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys

import orjson
import pytest
from aiokafka import AIOKafkaConsumer

from pipeline.app.assemble import topology_for
from pipeline.app.launch import stage_worker
from pipeline.contracts import Evidence
from pipeline.ingress import Client
from pipeline.runtime.codec import decode
from pipeline.runtime.topics import TopicNames, load_registry
from tests.support.kafka import create_topics, publish, read_topic, settings_for
from tests.support.paths import ROOT
from tests.support.procs import Proc
from tests.support.waits import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


def llmpipe(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, **kw)


async def test_broker_command_and_idempotent_topics_apply(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "broker", "--json", "--data-dir", str(tmp_path)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = await asyncio.to_thread(proc.stdout.readline)
        info = orjson.loads(line)
        bootstrap = info["bootstrap"]
        assert bootstrap.startswith("127.0.0.1:")
        assert (tmp_path / "logs" / "broker.log").exists()
        first = llmpipe("topics", "apply", "--bootstrap", bootstrap, "--json")
        assert first.returncode == 0, first.stderr
        created = orjson.loads(first.stdout.splitlines()[-1])
        registry = load_registry()
        assert len(created["created"]) == len(registry) and created["existing"] == []
        second = orjson.loads(llmpipe("topics", "apply", "--bootstrap", bootstrap, "--json").stdout.splitlines()[-1])
        assert second["created"] == [] and len(second["existing"]) == len(registry)
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap)
        await c.start()
        await asyncio.sleep(0)
        try:
            await c.topics()
            for spec in registry.values():
                assert len(c.partitions_for_topic("llmpipe." + spec.name) or ()) == spec.partitions, spec.name
        finally:
            await c.stop()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    host, port = bootstrap.split(":")
    with socket.socket() as s:  # the broker process is gone with it
        assert s.connect_ex((host, int(port))) != 0


async def test_micro_batching_fills_batches_up_to_the_declared_size(broker, prefix, tmp_path):
    s = settings_for(tmp_path, prefix, broker.bootstrap, [{"name": "batch", "class": "tests.stages:BatchLength"}])
    await create_topics(s)
    async with Client(broker.bootstrap, topic_prefix=prefix) as client:
        docs = [client.build(f"b{i}") for i in range(200)]
        await publish(broker.bootstrap, TopicNames(prefix).requests, docs)  # queued before the worker starts
        futs = [client._pending.setdefault(d.request_id, asyncio.get_running_loop().create_future()) for d in docs]
        async with stage_worker(s, topology_for(s), "batch", broker.bootstrap):
            answers = await asyncio.gather(*(client.wait(d.request_id, f, 60) for d, f in zip(docs, futs)))
    sizes = [int(a.text) for a in answers]
    assert max(sizes) == 16, "batches fill up to max_batch when records are waiting"
    assert all(1 <= n <= 16 for n in sizes)


async def test_an_idle_worker_does_not_wait_for_a_batch_to_fill(broker, prefix, tmp_path):
    """runtime/worker.py `_next_batch`: max_wait_ms is waited only while another batch is in
    process; a lone record on an idle worker rides alone at once (PatientBatch would wait 2 s)."""
    s = settings_for(tmp_path, prefix, broker.bootstrap, [{"name": "batch", "class": "tests.stages:PatientBatch"}])
    await create_topics(s)
    async with stage_worker(s, topology_for(s), "batch", broker.bootstrap), \
            Client(broker.bootstrap, topic_prefix=prefix) as client:
        first = asyncio.ensure_future(client.request(client.build("one"), 30))
        await asyncio.sleep(0.3)
        second = await client.request(client.build("two"), 30)
        assert (await first).text == "1" and second.text == "1", "each rode alone, without waiting for the other"
        assert second.timings["batch"].queue_ms < 1000


async def test_idle_stage_workers_poll_slower_and_speed_up_for_the_next_record(broker, prefix, tmp_path):
    s = settings_for(tmp_path, prefix, broker.bootstrap, [{"name": "batch", "class": "tests.stages:BatchLength"}],
                     consumer={"fetch_max_wait_ms": 5, "idle_fetch_max_wait_ms": 60, "idle_after_ms": 300})
    await create_topics(s)
    async with Client(broker.bootstrap, topic_prefix=prefix) as client:
        async with stage_worker(s, topology_for(s), "batch", broker.bootstrap) as w:
            fetcher = w.consumer._fetcher  # the real aiokafka fetcher: FetchPacer relies on its attribute
            assert (await client.request(client.build("one"), 60)).status == "ok"
            await asyncio.sleep(1.0)
            assert fetcher._fetch_max_wait_ms == 60, "idle: slower polling"
            assert (await client.request(client.build("two"), 60)).status == "ok"
            assert fetcher._fetch_max_wait_ms == 5, "records flow: fast polling again"


async def test_sigterm_drains_in_flight_work_and_commits(broker, prefix, tmp_path):
    N = 400  # 400 x 50 ms over 4 slots: 5 s of work, so the signal lands mid-stream on a fast host too
    s = settings_for(tmp_path, prefix, broker.bootstrap,
                     [{"name": "slow", "class": "tests.stages:Sleep", "policy": {"sleep_ms": 50}}])
    await create_topics(s)
    names = TopicNames(prefix)
    async with Client(broker.bootstrap, topic_prefix=prefix) as client:
        docs = [client.build(f"d{i}", timeout_s=600) for i in range(N)]
    await publish(broker.bootstrap, names.requests, docs)
    env = {"LLMPIPE_RUNTIME__CONCURRENCY": "4", "LLMPIPE_RUNTIME__QUEUE_BOUND": "50"}
    first = Proc("slow", s, tmp_path / "first.log", env=env)

    async def evidence_count() -> int:
        return len(await read_topic(broker.bootstrap, names.evidence, 10**9, timeout=1.0))

    await wait_until(lambda: evidence_count(), 60, "first worker processing", interval=0.5)
    first.proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(first.proc.wait, 60) == 0, first.tail()
    done_by_first = await evidence_count()
    assert 0 < done_by_first < N, "SIGTERM arrived mid-stream"
    second = Proc("slow", s, tmp_path / "second.log", env=env)
    try:
        await wait_until(lambda: _at_least(evidence_count, N), 120, "the rest processed by a new worker", interval=0.5)
        await asyncio.sleep(1.0)
        rows = [decode(r.value, Evidence) for r in await read_topic(broker.bootstrap, names.evidence, 10**9, timeout=2.0)]
    finally:
        second.stop()
    ids = [e.request_id for e in rows]
    assert len(set(ids)) == N
    assert len(ids) == N, f"{len(ids) - N} records were processed twice: the drain did not commit"


async def _at_least(fn, n: int) -> bool:
    return (await fn()) >= n


async def test_broker_watch_asks_for_its_own_topics_and_never_creates_one(broker, prefix, tmp_path):
    """The probe names the topics it needs (the whole cluster's metadata cost 2.7 ms of CPU per probe
    per process on the stack); a missing topic reads as down and is not auto-created by asking."""
    from aiokafka import AIOKafkaProducer

    from pipeline.runtime.broker.watch import BrokerWatch

    settings = settings_for(tmp_path, prefix, broker.bootstrap, [{"name": "echo"}])
    await create_topics(settings)
    names = TopicNames(prefix)
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
    await producer.start()
    try:
        up = BrokerWatch(producer.client, [names.requests, names.responses], process="test")
        assert await up.probe() == (True, "metadata answered with every topic")
        absent = f"{prefix}never-applied"
        down = BrokerWatch(producer.client, [names.requests, absent], process="test")
        ok, why = await down.probe()
        assert not ok and absent in why and names.requests not in why
        assert absent not in (await producer.client.fetch_all_metadata()).topics()
    finally:
        await producer.stop()
