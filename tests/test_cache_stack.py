"""The cache stage on a real broker: a write-back on `control` turns the next ask into a hit
answered by the cache; `llmpipe cache invalidate` takes it back; evidence says why."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from aiokafka import AIOKafkaProducer

from pipeline.app.assemble import topology_for
from pipeline.app.launch import stage_worker
from pipeline.contracts import Evidence
from pipeline.contracts.request import ChatBody, ChatMessage
from pipeline.engines.embedder import Embedder
from pipeline.ingress import Client
from pipeline.runtime.codec import decode, encode
from pipeline.runtime.topics import TopicNames
from pipeline.security.sealing import keyring_for
from pipeline.stages.cache.config import CachePolicy
from pipeline.stages.cache.semantic import put_record
from tests.support.kafka import create_topics, read_topic, settings_for
from tests.support.paths import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


async def test_write_back_hit_and_invalidation_through_the_stack(broker, prefix, tmp_path):
    s = settings_for(tmp_path, prefix, broker.bootstrap, [
        {"name": "mask"}, {"name": "cache"}, {"name": "answer", "class": "tests.stages:Answer"}],
        auth={"required": False})  # a trusted producer publishes tenant_id without a key
    await create_topics(s)
    names = TopicNames(prefix)
    topo = topology_for(s)
    workers = [stage_worker(s, topo, n, broker.bootstrap) for n in topo.groups()]  # cache runs in mask's chain
    for w in workers:
        await w.start()
    try:
        async with Client(broker.bootstrap, topic_prefix=prefix) as client:
            def ask():
                body = ChatBody(messages=[ChatMessage(role="user", content="What are your opening hours on weekdays?")])
                return client.build(body=body, tenant_id="acme", timeout_s=120)

            first = await client.request(ask(), 120)
            assert first.status == "ok" and first.answered_by == "answer"
            # postprocess's write-back, published on control
            embedder = await asyncio.to_thread(Embedder)
            put = put_record(ask(), "We are open 9 to 6 on weekdays.", embedder, CachePolicy(), keyring_for(s))
            p = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
            await p.start()
            try:
                await p.send_and_wait(names("control"), encode(put), key=b"cache:acme")
            finally:
                await p.stop()
            for _ in range(100):
                hit = await client.request(ask(), 120)
                if hit.answered_by == "cache":
                    break
                await asyncio.sleep(0.2)
            assert hit.answered_by == "cache" and hit.cache == "hit" and hit.text == "We are open 9 to 6 on weekdays."
            inv = await asyncio.to_thread(subprocess.run, [
                sys.executable, "-m", "pipeline.cli", "cache", "invalidate", "--tenant", "acme",
                "--bootstrap", broker.bootstrap, "--json"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                env={**__import__("os").environ, "LLMPIPE_TOPIC_PREFIX": prefix})
            assert inv.returncode == 0, inv.stderr
            for _ in range(100):
                after = await client.request(ask(), 120)
                if after.answered_by == "answer":
                    break
                await asyncio.sleep(0.2)
            assert after.answered_by == "answer", "the invalidated entry is no longer served"
    finally:
        for w in reversed(workers):
            await w.stop()
    evidence = [decode(r.value, Evidence) for r in await read_topic(broker.bootstrap, names.evidence, 10**9, timeout=2)]
    cache_ev = [e for e in evidence if e.stage == "cache"]
    decisions = {e.decision for e in cache_ev}
    assert {"miss", "hit"} <= decisions
    hit_ev = next(e for e in cache_ev if e.decision == "hit")
    assert hit_ev.scores["similarity"] >= hit_ev.scores["threshold"] and hit_ev.candidates
    assert hit_ev.revisions["embedding"].startswith("all-MiniLM-L6-v2@")
