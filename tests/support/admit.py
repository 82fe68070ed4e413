"""admit on the session broker: a two-stage stack (admit, then a test answer stage), its workers
started as one settled group, and a burst of requests through it."""

from __future__ import annotations

import asyncio

from pipeline.app.assemble import topology_for
from pipeline.app.launch import stage_worker
from pipeline.contracts.request import ChatBody, ChatMessage
from pipeline.ingress import Client
from tests.support.kafka import create_topics, settings_for
from tests.support.waits import wait_until


def stack(tmp_path, prefix, broker, prepared_model, tenants, answer="tests.stages:Answer", answer_policy=None,
          deployments=None):
    s = settings_for(tmp_path, prefix, broker.bootstrap,
                     [{"name": "admit"}, {"name": "answer", "class": answer, "policy": answer_policy or {}}],
                     tenants=tenants, runtime={"concurrency": 64},
                     deployments=deployments or [{"name": "priced", "cost_per_1k_input": 1.0, "cost_per_1k_output": 1.0}])
    s.engine.model_dir = prepared_model
    return s


async def start(s, broker, admit_workers: int):
    topo = topology_for(s)
    workers = [stage_worker(s.model_copy(update={"worker_id": f"a{i}"}), topo, "admit", broker.bootstrap)
               for i in range(admit_workers)] + [stage_worker(s, topo, "answer", broker.bootstrap)]
    await asyncio.gather(*(w.start() for w in workers))
    admits = workers[:admit_workers]
    try:  # a settled group: every admit member owns its share of each input topic (no rebalance mid-load)
        await wait_until(lambda: all(len(w.consumer.assignment()) == len(w.topics) * 6 // admit_workers
                                     for w in admits), 60, "admit group settled")
    except BaseException:
        for w in workers:
            await w.stop()
        raise
    return workers


async def burst(s, broker, prefix, admit_workers: int, tenant: str, texts: list[str], timeout_s: float = 120):
    """Start the stack, send every request at once, wait for every answer, stop the stack."""
    await create_topics(s)
    workers = await start(s, broker, admit_workers)
    try:
        async with Client(broker.bootstrap, topic_prefix=prefix) as client:
            docs = [client.build(body=body(t), tenant_id=tenant, timeout_s=timeout_s) for t in texts]
            futs = await client.submit_many(docs)
            return docs, [await client.wait(d.request_id, f, timeout_s) for d, f in zip(docs, futs)]
    finally:
        for w in reversed(workers):
            await w.stop()


def body(text="Hello there"):
    return ChatBody(messages=[ChatMessage(role="user", content=text)], max_tokens=16)
