"""Consumer groups of real worker processes: scale-out, kill -9, backpressure."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipeline.contracts import Evidence
from pipeline.ingress import Client
from pipeline.runtime.broker.embedded import free_port
from pipeline.runtime.codec import decode
from pipeline.runtime.topics import TopicNames
from tests.support.kafka import create_topics, publish, read_until_quiet, settings_for
from tests.support.procs import Proc, Sink
from tests.support.waits import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


async def test_three_workers_over_six_partitions_write_exactly_10000_rows(broker, prefix, tmp_path):
    s = settings_for(tmp_path, prefix, broker.bootstrap, [{"name": "record", "class": "tests.stages:Record"}])
    await create_topics(s)
    sink = Sink(s, tmp_path)
    workers = [Proc("record", s, tmp_path / f"w{i}.log", env={"LLMPIPE_WORKER_ID": f"w{i}"}) for i in range(3)]
    try:
        await sink.ready()
        async with Client(broker.bootstrap, topic_prefix=prefix) as client:
            docs = [client.build(f"record {i}", timeout_s=600) for i in range(10_000)]
        await publish(broker.bootstrap, TopicNames(prefix).requests, docs)
        await wait_until(lambda: sink.scalar("SELECT count() FROM decisions FINAL WHERE stage = 'record'") >= 10_000,
                         300, "10,000 decisions")
        await asyncio.sleep(1.5)  # let any redelivered duplicates land before counting
        # the topic, not the table: FINAL would fold a redelivered record's second row into the first
        records = await read_until_quiet(broker.bootstrap, TopicNames(prefix).evidence)
        evidence = [decode(r.value, Evidence) for r in records]
        per_request = Counter(e.request_id for e in evidence if e.stage == "record")
        duplicates = sum(n - 1 for n in per_request.values())
        assert len(per_request) == 10_000 and set(per_request) == {d.request_id for d in docs}
        assert duplicates == 0, f"{duplicates} records processed twice: a rebalance must commit before handing over"
        workers_seen = sink.scalar("SELECT uniqExact(worker) FROM decisions FINAL WHERE stage = 'record'")
        assert workers_seen == 3, "every worker of the group took partitions"
        assert sink.scalar("SELECT count() FROM requests FINAL") == 10_000
    finally:
        for w in workers:
            w.stop()
        sink.stop()


async def test_kill_9_of_a_worker_loses_no_request_and_no_evidence(broker, prefix, tmp_path):
    # answer sleeps 20 ms a record: the burst takes ~1.2 s of both answer workers, so the kill lands on
    # work in flight (an instant answerer had finished all 2,000 before the kill on a fast host)
    stages = [{"name": "classify", "class": "tests.stages:Classify"},
              {"name": "answer", "class": "tests.stages:Sleep", "policy": {"sleep_ms": 20}}]
    s = settings_for(tmp_path, prefix, broker.bootstrap, stages)
    await create_topics(s)
    sink = Sink(s, tmp_path)
    workers = {f"{st}{i}": Proc(st, s, tmp_path / f"{st}{i}.log", env={"LLMPIPE_WORKER_ID": f"{st}{i}"})
               for st in ("classify", "answer") for i in range(2)}
    try:
        await sink.ready()
        async with Client(broker.bootstrap, topic_prefix=prefix) as client:
            docs = [client.build(f"request number {i} " + "x" * (i % 30), timeout_s=300) for i in range(2000)]
            futs = {}
            for d in docs[:100]:  # a paced warm-up until the doomed worker is working
                futs[d.request_id] = await client.submit(d)
                await asyncio.sleep(0.01)
            await wait_until(lambda: sink.scalar("SELECT count() FROM decisions WHERE worker = 'answer0'") > 0,
                             60, "the doomed worker to be working")
            burst = await client.submit_many(docs[100:])  # 1,900 in flight at once
            futs.update({d.request_id: f for d, f in zip(docs[100:], burst)})
            await asyncio.sleep(0.05)
            in_flight = sum(not f.done() for f in futs.values())
            workers["answer0"].kill9()
            answers = await asyncio.gather(*(client.wait(rid, f, 300) for rid, f in futs.items()))
            await asyncio.sleep(1)
            duplicates = client.duplicates
        assert len(answers) == 2000 and {a.request_id for a in answers} == set(futs)
        assert all(a.status == "ok" for a in answers)
        await wait_until(lambda: sink.scalar("SELECT uniqExact(request_id, stage) FROM decisions FINAL") >= 4000,
                         120, "evidence of both stages for all requests")
        per_stage = dict(sink.query("SELECT stage, uniqExact(request_id) FROM decisions FINAL GROUP BY stage"))
        assert per_stage == {"classify": 2000, "answer": 2000}
        by_worker = dict(sink.query("SELECT worker, count() FROM decisions FINAL WHERE stage = 'answer' GROUP BY worker"))
        assert by_worker.get("answer0", 0) > 0, "the killed worker owned partitions and was working"
        assert by_worker.get("answer1", 0) > by_worker.get("answer0", 0), "its partitions moved to the survivor"
        # duplicates are allowed (at-least-once) but every one is dropped by the client
        print(f"killed with {in_flight} requests in flight; duplicates dropped by the client: {duplicates}")
        assert in_flight > 0
    finally:
        for w in workers.values():
            w.stop()
        sink.stop()


def scrape(port: int) -> dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            if sample.labels.get("stage") == "slow":  # counters with more labels (outcome) are summed
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


async def test_backpressure_bounds_the_queue_and_memory(broker, prefix, tmp_path):
    s = settings_for(tmp_path, prefix, broker.bootstrap,
                     [{"name": "slow", "class": "tests.stages:Sleep", "policy": {"sleep_ms": 50}}])
    await create_topics(s)
    port = free_port()
    w = Proc("slow", s, tmp_path / "slow.log", env={
        "LLMPIPE_METRICS_PORT": str(port), "LLMPIPE_RUNTIME__QUEUE_BOUND": "100", "LLMPIPE_RUNTIME__CONCURRENCY": "8"})
    try:
        await wait_until(lambda: _metrics_up(port), 60, "worker metrics endpoint")
        await wait_until(lambda: scrape(port).get("llmpipe_queue_bound") == 100, 30, "queue bound reported")
        proc = psutil.Process(w.pid)
        rss_before = proc.memory_info().rss
        async with Client(broker.bootstrap, topic_prefix=prefix) as client:
            docs = [client.build(f"slow {i}", timeout_s=3600) for i in range(20_000)]
        t0 = time.monotonic()
        publisher = asyncio.create_task(publish(broker.bootstrap, TopicNames(prefix).requests, docs))
        peak_rss, paused_seen, depths = rss_before, 0.0, []
        while time.monotonic() - t0 < 20 or not publisher.done():
            m = scrape(port)
            depths.append(m.get("llmpipe_queue_depth", 0))
            paused_seen = max(paused_seen, m.get("llmpipe_paused", 0))
            peak_rss = max(peak_rss, proc.memory_info().rss)
            await asyncio.sleep(0.25)
        await publisher
        m = scrape(port)
        assert m["llmpipe_queue_depth_peak"] <= 100, m
        assert max(depths) <= 100
        assert paused_seen == 1 and m["llmpipe_pauses_total"] >= 1
        assert m["llmpipe_records_processed_total"] >= 100, "the worker reports the records it finished"
        growth_mb = (peak_rss - rss_before) / 2**20
        print(f"RSS growth {growth_mb:.1f} MB, queue peak {m['llmpipe_queue_depth_peak']}, pauses {m['llmpipe_pauses_total']}")
        assert growth_mb < 100
    finally:
        w.stop()


def _metrics_up(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
