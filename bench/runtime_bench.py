"""Runtime benchmarks on the embedded broker: per-hop latency and one worker's max throughput.

    .venv/bin/python bench/runtime_bench.py            # full: 20 s latency run, 20,000 records
    .venv/bin/python bench/runtime_bench.py --quick    # 5 s, 5,000 records
    .venv/bin/python bench/runtime_bench.py --workers procs   # latency: subprocess workers only
    .venv/bin/python bench/runtime_bench.py --workers procs,chain --skip-throughput   # hops vs one chain

1. latency: h1,h2,h3 (tests.stages:Relay) -> h4 (tests.stages:Answer), paced at --rate req/s.
   Per hop: Response.timings[stage].queue_ms (input record timestamp -> processing start:
   produce + broker + fetch + queue wait). Also client end-to-end and service_ms. Run twice by
   default: each stage worker its own process (as deployed), and all four in this process.
   `chain`: the four stages as one chain (docs/design.md, "Stage chains") in one worker process: a
   request crosses the broker once in and once out; h2-h4's queue is the in-memory hand-over.
2. throughput: N records pre-published to a 1-stage topology's input (tests.stages:Answer),
   then one worker is started; records/s = N / (first partition assigned -> N-th answer acked
   on `responses`), once per --concurrency value.

Prints a rich table per bench, then one JSON line (the last line of stdout).
"""

from __future__ import annotations

import asyncio
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # `tests.stages` must import
os.environ.setdefault("OMP_NUM_THREADS", "1")

import typer  # noqa: E402
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench._common import CpuWindow, pct, print_result  # noqa: E402
from pipeline.app.assemble import topology_for  # noqa: E402
from pipeline.app.launch import stage_worker  # noqa: E402
from pipeline.config.settings import Settings, StageSpec, worker_config_yaml  # noqa: E402
from pipeline.contracts import ReplyTo, RequestDoc  # noqa: E402
from pipeline.contracts.base import now_ms  # noqa: E402
from pipeline.contracts.request import ChatBody, ChatMessage  # noqa: E402
from pipeline.ingress.client import Client  # noqa: E402
from pipeline.runtime.broker.embedded import EmbeddedBroker  # noqa: E402
from pipeline.runtime.codec import encode, request_headers  # noqa: E402
from pipeline.runtime.topics import TopicNames, apply_topics  # noqa: E402
from pipeline.runtime.worker import StageWorker  # noqa: E402

HOP_TARGET_MS = 5.0
HOPS = ["h1", "h2", "h3", "h4"]
console = Console(stderr=False)


def fmt(v: float | None, nd: int = 1) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def make_settings(data_dir: Path, prefix: str, bootstrap: str, stages: list[dict[str, Any]]) -> Settings:
    return Settings(data_dir=data_dir, topic_prefix=prefix, bootstrap=bootstrap,
                    stages=[StageSpec.model_validate(s) for s in stages])


async def create_topics(s: Settings) -> None:
    assert s.bootstrap
    await apply_topics(s.bootstrap, s.topic_prefix, topology_for(s).topic_registry())


class WorkerProc:
    """A `llmpipe worker STAGE` child process (as tests/conftest.py Proc)."""

    def __init__(self, stage: str, s: Settings, log: Path) -> None:
        cfg = log.with_suffix(".yaml")
        cfg.write_text(worker_config_yaml(s))
        env = {**os.environ, "LLMPIPE_CONFIG": str(cfg), "LLMPIPE_BOOTSTRAP": s.bootstrap or "",
               "LLMPIPE_TOPIC_PREFIX": s.topic_prefix, "LLMPIPE_DATA_DIR": str(s.data_dir),
               "LLMPIPE_LOG_LEVEL": "WARNING", "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "worker", stage], cwd=ROOT, env=env,
                                     stdout=open(log, "ab"), stderr=subprocess.STDOUT)

    def stop(self, timeout: float = 30) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# ---- 1. per-hop latency ----------------------------------------------------------------------


async def latency_bench(broker: EmbeddedBroker, tmp: Path, rate: float, duration_s: float, warmup_s: float,
                        mode: str) -> dict[str, Any]:
    prefix = f"bench{uuid.uuid4().hex[:8]}."
    chained = mode == "chain"
    stages = ([{"name": h, "class": "tests.stages:Relay", "chain": chained and h != HOPS[0]} for h in HOPS[:-1]]
              + [{"name": HOPS[-1], "class": "tests.stages:Answer", "chain": chained}])
    s = make_settings(tmp / "latency", prefix, broker.bootstrap, stages)
    (tmp / "latency").mkdir(exist_ok=True)
    await create_topics(s)
    topo = topology_for(s)
    workers: list[StageWorker] = []
    children: list[WorkerProc] = []
    try:
        if mode in ("procs", "chain"):
            children = [WorkerProc(h, s, tmp / "latency" / f"{h}.log") for h in topo.groups()]
        else:
            for h in HOPS:
                workers.append(await stage_worker(s, topo, h, broker.bootstrap).start())
        async with Client(broker.bootstrap, topic_prefix=prefix) as client:
            # ready = one request makes it through every hop (group joins done)
            t_ready = time.perf_counter()
            first = client.build("ready?", timeout_s=120)
            await client.wait(first.request_id, await client.submit(first), 120)
            ready_s = time.perf_counter() - t_ready
            if warmup_s > 0:
                await paced(client, rate, warmup_s)  # discarded
            cpu = CpuWindow()
            samples, sent, achieved_rps, timeouts = await paced(client, rate, duration_s)
            cpu_use = cpu.result()
        hop_q = {h: [t[h]["queue_ms"] for t in samples if h in t] for h in HOPS}
        hop_s = {h: [t[h]["service_ms"] for t in samples if h in t] for h in HOPS}
        e2e = [t["_e2e_ms"] for t in samples]
        hops = {}
        for h in HOPS:
            p50 = pct(hop_q[h], 50)
            hops[h] = {"stage": "Relay" if h != HOPS[-1] else "Answer", "n": len(hop_q[h]),
                       "queue_p50_ms": p50, "queue_p95_ms": pct(hop_q[h], 95), "queue_p99_ms": pct(hop_q[h], 99),
                       "service_p50_ms": pct(hop_s[h], 50),
                       "ratio_p50_to_5ms": None if p50 is None else round(p50 / HOP_TARGET_MS, 2)}
        sum_p50 = [sum(t[h]["queue_ms"] for h in HOPS) for t in samples if all(h in t for h in HOPS)]
        busy = cpu_use.get("busy_pct")
        # the whole host's CPU over the window (broker, workers, this client) per answered request
        cpu_ms = None if busy is None or not samples else \
            round(busy / 100 * (os.cpu_count() or 1) * duration_s * 1000 / len(samples), 2)
        return {
            "workers": mode, "rate_target": rate, "rate_achieved": round(achieved_rps, 1),
            "duration_s": duration_s, "warmup_s": warmup_s, "sent": sent, "answered": len(samples),
            "timeouts": timeouts, "ready_s": round(ready_s, 2), "host_cpu": cpu_use,
            "host_cpu_ms_per_request": cpu_ms, "hops": hops,
            "all_hops_p50_ms": pct([v for h in HOPS for v in hop_q[h]], 50),
            "sum_of_hops_p50_ms": pct(sum_p50, 50),
            "e2e_p50_ms": pct(e2e, 50), "e2e_p95_ms": pct(e2e, 95), "e2e_p99_ms": pct(e2e, 99),
        }
    finally:
        for c in children:
            c.stop()
        for w in workers:  # upstream first
            await w.stop()


async def paced(client: Client, rate: float, duration_s: float,
                build: Callable[[int], RequestDoc] | None = None) -> tuple[list[dict[str, Any]], int, float, int]:
    """Send at `rate` req/s for duration_s (open loop: a late answer never delays the next send)."""
    results: list[dict[str, Any]] = []
    timeouts = 0

    async def one(i: int) -> None:
        nonlocal timeouts
        t0 = time.perf_counter()
        doc = build(i) if build is not None else client.build("bench hop latency", timeout_s=60)
        try:
            fut = await client.submit(doc)
            resp = await client.wait(doc.request_id, fut, 60)
        except Exception:
            timeouts += 1
            return
        e2e = (time.perf_counter() - t0) * 1000
        t = {k: {"queue_ms": v.queue_ms, "service_ms": v.service_ms} for k, v in resp.timings.items()}
        t["_e2e_ms"] = e2e
        results.append(t)

    n = int(rate * duration_s)
    tasks = []
    start = time.perf_counter()
    for i in range(n):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i)))
    send_span = time.perf_counter() - start
    await asyncio.gather(*tasks)
    return results, n, n / send_span if send_span > 0 else 0.0, timeouts


# ---- 2. single-worker throughput -------------------------------------------------------------


def build_docs(prefix: str, n: int) -> list[RequestDoc]:
    reply = ReplyTo(topic=TopicNames(prefix).responses, partition=0)
    created = now_ms()
    return [RequestDoc(request_id=uuid.uuid4().hex, created_ms=created, deadline_ms=created + 3_600_000, reply_to=reply,
                       body=ChatBody(messages=[ChatMessage(role="user", content=f"throughput record {i}")]))
            for i in range(n)]


async def publish(bootstrap: str, topic: str, docs: list[RequestDoc]) -> None:
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, max_batch_size=256 << 10)
    await p.start()
    try:
        futs = []
        for d in docs:
            futs.append(await p.send(topic, encode(d), key=d.request_id.encode(),
                                     headers=request_headers(d.request_id, d.tenant_id, d.deadline_ms, d.attempt, None)))
            if len(futs) >= 2000:
                await asyncio.gather(*futs)
                futs = []
        await asyncio.gather(*futs)
    finally:
        await p.stop()


@dataclass
class WorkerRun:
    seen: int  # distinct keys read from the output topic
    t_start: float
    t_assigned: float  # first partition assigned (records start flowing)
    t_half: float | None  # half of n seen
    t_done: float
    cpu: dict[str, float | None]  # host CPU from assignment to done


async def run_worker_until(worker: StageWorker, bootstrap: str, topic: str, partitions: int, n: int,
                           timeout_s: float) -> WorkerRun:
    """Start `worker`, read `topic` until n distinct keys appeared (or timeout), stop it."""
    watcher = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                               auto_offset_reset="earliest", fetch_max_wait_ms=20)
    await watcher.start()
    watcher.assign([TopicPartition(topic, p) for p in range(partitions)])
    seen: set[bytes] = set()
    t_start = time.perf_counter()
    t_assigned = t_half = None
    cpu = CpuWindow()
    try:
        await worker.start()
        deadline = t_start + timeout_s
        while time.perf_counter() < deadline and len(seen) < n:
            if t_assigned is None:
                if worker.consumer is not None and worker.consumer.assignment():
                    t_assigned = time.perf_counter()
                    cpu = CpuWindow()
                else:
                    await asyncio.sleep(0.005)
                    continue
            for recs in (await watcher.getmany(timeout_ms=50)).values():
                seen.update(r.key for r in recs)
            if t_half is None and len(seen) >= n // 2:
                t_half = time.perf_counter()
        t_done = time.perf_counter()
    finally:
        await worker.stop()
        await watcher.stop()
    return WorkerRun(len(seen), t_start, t_assigned or t_done, t_half, t_done, cpu.result())


async def throughput_one(broker: EmbeddedBroker, tmp: Path, n: int, concurrency: int, timeout_s: float) -> dict[str, Any]:
    prefix = f"bench{uuid.uuid4().hex[:8]}."
    names = TopicNames(prefix)
    stage = "answer"
    s = make_settings(tmp / "tput", prefix, broker.bootstrap,
                      [{"name": stage, "class": "tests.stages:Answer", "runtime": {"concurrency": concurrency}}])
    (tmp / "tput").mkdir(exist_ok=True)
    await create_topics(s)
    docs = build_docs(prefix, n)
    t_pub = time.perf_counter()
    await publish(broker.bootstrap, names.stage_input(stage), docs)
    publish_s = time.perf_counter() - t_pub
    del docs

    # Count answers by reading `responses` (distinct keys): the embedded broker's end offsets
    # (ListOffsets latest) lag behind the records actually readable under concurrent produce.
    n_parts = topology_for(s).topic_registry()["responses"].partitions
    r = await run_worker_until(stage_worker(s, topology_for(s), stage, broker.bootstrap), broker.bootstrap,
                               names.responses, n_parts, n, timeout_s)
    done, t_start, t_assigned, t_half, t_done, cpu_use = r.seen, r.t_start, r.t_assigned, r.t_half, r.t_done, r.cpu
    span = t_done - t_assigned
    return {"concurrency": concurrency, "records": n, "answered": done, "complete": done >= n,
            "publish_s": round(publish_s, 2), "join_s": round(t_assigned - t_start, 2), "process_s": round(span, 2),
            "records_per_s": round(done / span, 1) if span > 0 else None,
            "records_per_s_incl_join": round(done / (t_done - t_start), 1),
            # a falling second half means the worker (or the in-memory broker) slows as topics grow
            "records_per_s_1st_half": round((n // 2) / (t_half - t_assigned), 1) if t_half and t_half > t_assigned else None,
            "records_per_s_2nd_half": round((done - n // 2) / (t_done - t_half), 1) if t_half and t_done > t_half else None,
            "host_cpu": cpu_use}


# ---- report ----------------------------------------------------------------------------------


def latency_table(runs: list[dict[str, Any]]) -> Table:
    r0 = runs[0]
    t = Table(title=f"Per-hop latency, 4-stage chain h1-h3 Relay -> h4 Answer, {r0['rate_target']:.0f} req/s x "
                    f"{r0['duration_s']:.0f} s (queue_ms = record ts -> processing start)")
    t.caption = "; ".join(f"{r['workers']}: sent {r['rate_achieved']:.1f}/s, {r['timeouts']} timeouts, host cpu "
                          f"{fmt(r['host_cpu']['busy_pct'], 0)}% steal {fmt(r['host_cpu']['steal_pct'], 0)}%" for r in runs)
    for col in ("workers", "hop", "p50 ms", "p95 ms", "p99 ms", "svc p50", "p50/5ms"):
        t.add_column(col, justify="left" if col in ("workers", "hop") else "right")
    for r in runs:
        mode = r["workers"]
        for h, v in r["hops"].items():
            t.add_row(mode, h, fmt(v["queue_p50_ms"]), fmt(v["queue_p95_ms"]), fmt(v["queue_p99_ms"]),
                      fmt(v["service_p50_ms"]), fmt(v["ratio_p50_to_5ms"], 2))
            mode = ""
        t.add_row(f"{r['answered']}/{r['sent']} ok", "e2e", fmt(r["e2e_p50_ms"]), fmt(r["e2e_p95_ms"]),
                  fmt(r["e2e_p99_ms"]), "", "", end_section=True)
    return t


def throughput_table(rows: list[dict[str, Any]]) -> Table:
    t = Table(title=f"One worker (tests.stages:Answer), {rows[0]['records']:,} pre-published records")
    for col in ("concurrency", "records/s", "proc s", "join s", "w/ join/s", "answered", "cpu/steal%"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(str(r["concurrency"]), fmt(r["records_per_s"], 0), fmt(r["process_s"], 2), fmt(r["join_s"], 2),
                  fmt(r["records_per_s_incl_join"], 0), f"{r['answered']:,}" + ("" if r["complete"] else " (incomplete)"),
                  f"{fmt(r['host_cpu']['busy_pct'], 0)}/{fmt(r['host_cpu']['steal_pct'], 0)}")
    return t


async def main_async(rate: float, duration: float, warmup: float, records: int, concurrency: list[int],
                     modes: list[str], skip_throughput: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"bench": "runtime", "host": {"cpus": os.cpu_count(), "python": platform.python_version()}}
    with tempfile.TemporaryDirectory(prefix="llmpipe-bench-") as d:
        tmp = Path(d)
        kafka_log = logging.getLogger("aiokafka")
        kafka_log.setLevel(logging.CRITICAL)  # the readiness probe's refused connects are expected
        broker = await EmbeddedBroker(tmp / "broker").start()
        kafka_log.setLevel(logging.WARNING)
        try:
            if modes:
                runs = [await latency_bench(broker, tmp, rate, duration, warmup, m) for m in modes]
                out["latency"] = runs
                console.print(latency_table(runs))
            if not skip_throughput:
                rows = []
                for c in concurrency:
                    rows.append(await throughput_one(broker, tmp, records, c, timeout_s=max(120.0, records / 50)))
                out["throughput"] = rows
                console.print(throughput_table(rows))
        finally:
            broker.stop()
    return out


app = typer.Typer(add_completion=False)


@app.command()
def main(
    quick: bool = typer.Option(False, "--quick", help="5 s latency run, 5,000 records"),
    rate: float = typer.Option(200.0, help="latency bench: requests per second"),
    duration: float = typer.Option(None, help="latency bench: measured seconds (default 20, quick 5)"),
    warmup: float = typer.Option(None, help="latency bench: paced warm-up seconds, discarded (default 3, quick 1)"),
    records: int = typer.Option(None, help="throughput bench: records (default 20000, quick 5000)"),
    concurrency: str = typer.Option("1,16,64", help="throughput bench: comma-separated runtime.concurrency values"),
    workers: str = typer.Option("procs,inproc", help="latency bench: comma-separated modes, `procs` (one process "
                                "per stage worker), `inproc` (all in this process), `chain` (one process, the four "
                                "stages chained); empty = skip"),
    skip_throughput: bool = typer.Option(False, "--skip-throughput"),
) -> None:
    """Per-hop latency and single-worker throughput on the embedded broker."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    duration = duration if duration is not None else (5.0 if quick else 20.0)
    warmup = warmup if warmup is not None else (1.0 if quick else 3.0)
    records = records if records is not None else (5_000 if quick else 20_000)
    conc = [int(x) for x in concurrency.split(",") if x.strip()]
    t0 = time.perf_counter()
    modes = [m.strip() for m in workers.split(",") if m.strip()]
    if any(m not in ("procs", "inproc", "chain") for m in modes):
        raise typer.BadParameter("modes are `procs`, `inproc` and `chain`", param_hint="--workers")
    result = asyncio.run(main_async(rate, duration, warmup, records, conc, modes, skip_throughput))
    print_result(console, result, t0)


if __name__ == "__main__":
    app()
