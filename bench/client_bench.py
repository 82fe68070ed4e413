"""Kafka clients on the same hop: aiokafka (pure Python, what every worker uses today) against
confluent-kafka (librdkafka, compiled), on the embedded broker, in one run.

    .venv/bin/python bench/client_bench.py            # 20,000 records, 15 s paced hop at 200 rec/s
    .venv/bin/python bench/client_bench.py --quick    # 5,000 records, 5 s hop

For each client, one after the other on a fresh topic (6 partitions, 1 KiB values, acks=all):
1. produce N records as fast as the client goes, then flush;
2. consume the N records from the beginning;
3. a hop: produce at a fixed rate and consume in the same process; latency = consume time minus the
   produce time carried in the value (the hop the stage workers pay per crossing).
CPU per record is the client process's CPU (time.process_time: every thread, librdkafka's included)
and the broker's (its /proc/<pid>/stat) over the phase. Prints one JSON line (the last line).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import typer  # noqa: E402
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition  # noqa: E402
from confluent_kafka import Consumer, Producer  # noqa: E402
from confluent_kafka import TopicPartition as CTopicPartition  # noqa: E402

from bench._common import pct  # noqa: E402
from pipeline.runtime.broker.embedded import EmbeddedBroker  # noqa: E402
from pipeline.runtime.topics import TopicSpec, apply_topics  # noqa: E402

T = TypeVar("T")
PARTITIONS = 6
VALUE = 1024
# librdkafka settings for the hop, from --tuned (measured: the defaults' p50 on the embedded broker)
HOP_TUNING: dict[str, Any] = {}
TUNED = {"fetch.error.backoff.ms": 5, "socket.nagle.disable": True, "fetch.min.bytes": 1}


def broker_ticks(pid: int | None) -> int:
    if pid is None:
        return 0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime
    except OSError:
        return 0


class Phase:
    """Client-process CPU and broker CPU over one phase, per record."""

    def __init__(self, broker_pid: int | None) -> None:
        self.pid = broker_pid
        self.cpu0, self.b0, self.t0 = time.process_time(), broker_ticks(broker_pid), time.perf_counter()

    def result(self, records: int) -> dict[str, float]:
        cpu, b, wall = time.process_time() - self.cpu0, broker_ticks(self.pid) - self.b0, time.perf_counter() - self.t0
        hz = os.sysconf("SC_CLK_TCK")
        return {"records": records, "seconds": round(wall, 2), "records_per_s": round(records / wall, 1),
                "client_cpu_us_per_record": round(cpu * 1e6 / records, 1),
                "broker_cpu_us_per_record": round(b / hz * 1e6 / records, 1)}


def payload(i: int) -> bytes:
    head = f"{time.time():.6f}|{i}|".encode()
    return head + b"x" * (VALUE - len(head))


# ---- aiokafka ---------------------------------------------------------------------------------


async def aio_produce(bootstrap: str, topic: str, n: int) -> None:
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, enable_idempotence=False)
    await p.start()
    try:
        futs = [await p.send(topic, payload(i), key=str(i).encode()) for i in range(n)]
        await p.flush()
        await asyncio.gather(*futs)
    finally:
        await p.stop()


async def aio_consume(bootstrap: str, topic: str, n: int) -> None:
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    await c.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        got = 0
        while got < n:
            batch = await c.getmany(timeout_ms=500, max_records=1000)
            got += sum(len(v) for v in batch.values())
    finally:
        await c.stop()


async def aio_hop(bootstrap: str, topic: str, rate: float, seconds: float) -> list[float]:
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0, enable_idempotence=False)
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="latest",
                         fetch_max_wait_ms=5)
    await p.start()
    await c.start()
    lat: list[float] = []
    try:
        tps = [TopicPartition(topic, q) for q in range(PARTITIONS)]
        c.assign(tps)
        await c.seek_to_end(*tps)
        for tp in tps:
            await c.position(tp)
        n = int(rate * seconds)
        done = asyncio.Event()

        async def read() -> None:
            while len(lat) < n:
                batch = await c.getmany(timeout_ms=100, max_records=500)
                now = time.time()
                lat.extend((now - float(r.value.split(b"|", 1)[0])) * 1000 for v in batch.values() for r in v)
            done.set()

        reader = asyncio.create_task(read())
        t0 = time.perf_counter()
        for i in range(n):
            await asyncio.sleep(max(0.0, t0 + i / rate - time.perf_counter()))
            await p.send(topic, payload(i), key=str(i).encode())
        async with asyncio.timeout(30):
            await done.wait()
        reader.cancel()
    finally:
        await c.stop()
        await p.stop()
    return lat


# ---- confluent-kafka ----------------------------------------------------------------------------


def ck_produce(bootstrap: str, topic: str, n: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "enable.idempotence": False})
    for i in range(n):
        while True:
            try:
                p.produce(topic, payload(i), key=str(i).encode())
                break
            except BufferError:
                p.poll(0.01)
        p.poll(0)
    left = p.flush(60)
    if left:
        raise RuntimeError(f"confluent producer: {left} records not delivered")


def ck_consumer(bootstrap: str, **extra: Any) -> Consumer:
    return Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                     "enable.auto.commit": False, "auto.offset.reset": "earliest", **extra})


def ck_consume(bootstrap: str, topic: str, n: int) -> None:
    c = ck_consumer(bootstrap)
    c.assign([CTopicPartition(topic, q, 0) for q in range(PARTITIONS)])
    got = 0
    try:
        deadline = time.monotonic() + 120
        while got < n and time.monotonic() < deadline:
            got += sum(1 for m in c.consume(num_messages=1000, timeout=0.5) if m.error() is None)
        if got < n:
            raise RuntimeError(f"confluent consumer: {got} of {n} records")
    finally:
        c.close()


def ck_hop(bootstrap: str, topic: str, rate: float, seconds: float) -> list[float]:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0, "enable.idempotence": False})
    c = ck_consumer(bootstrap, **{"auto.offset.reset": "latest", "fetch.wait.max.ms": 5, **HOP_TUNING})
    ends = [c.get_watermark_offsets(CTopicPartition(topic, q), timeout=10)[1] for q in range(PARTITIONS)]
    c.assign([CTopicPartition(topic, q, ends[q]) for q in range(PARTITIONS)])
    n = int(rate * seconds)
    lat: list[float] = []

    def read() -> None:
        deadline = time.monotonic() + seconds + 30
        while len(lat) < n and time.monotonic() < deadline:
            for m in c.consume(num_messages=500, timeout=0.1):
                if m.error() is None:
                    lat.append((time.time() - float(m.value().split(b"|", 1)[0])) * 1000)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    t0 = time.perf_counter()
    for i in range(n):
        time.sleep(max(0.0, t0 + i / rate - time.perf_counter()))
        p.produce(topic, payload(i), key=str(i).encode())
        p.poll(0)
    p.flush(30)
    reader.join()
    c.close()
    return lat


# ---- the run ----------------------------------------------------------------------------------


def _in_thread(fn: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """confluent-kafka's calls block: each phase runs in a thread, as a worker would drive them."""
    return lambda *args: asyncio.to_thread(fn, *args)


# client -> its produce, consume and hop phases, all awaitable
CLIENTS: dict[str, tuple[Callable[..., Awaitable[Any]], ...]] = {
    "aiokafka": (aio_produce, aio_consume, aio_hop),
    "confluent-kafka": (_in_thread(ck_produce), _in_thread(ck_consume), _in_thread(ck_hop)),
}


async def run(records: int, rate: float, seconds: float) -> dict[str, Any]:
    out: dict[str, Any] = {"bench": "client", "records": records, "value_bytes": VALUE, "partitions": PARTITIONS,
                           "hop_rate": rate, "hop_seconds": seconds, "clients": {}}
    with tempfile.TemporaryDirectory(prefix="llmpipe-client-bench-") as d:
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
        broker = await EmbeddedBroker(Path(d) / "broker").start()
        pid = broker.proc.pid if broker.proc is not None else None
        try:
            for client in CLIENTS:
                topic = f"bench-{client}-{uuid.uuid4().hex[:6]}"
                await apply_topics(broker.bootstrap, "", {topic: TopicSpec(topic, PARTITIONS, "k", 3_600_000,
                                                                           "delete", "bench")})
                res: dict[str, Any] = {}
                produce, consume, hop = CLIENTS[client]
                for name, run_phase in (("produce", produce), ("consume", consume)):
                    ph = Phase(pid)
                    await run_phase(broker.bootstrap, topic, records)
                    res[name] = ph.result(records)
                ph = Phase(pid)
                lat = await hop(broker.bootstrap, topic, rate, seconds)
                res["hop"] = {**ph.result(max(1, len(lat))), "received": len(lat),
                              "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99)}
                out["clients"][client] = res
                print(client, res, file=sys.stderr, flush=True)
        finally:
            broker.stop()
    return out


def main(quick: bool = typer.Option(False, "--quick"), records: int = typer.Option(None),
         rate: float = typer.Option(200.0, help="hop: records per second"),
         seconds: float = typer.Option(None, help="hop: seconds (default 15, quick 5)"),
         tuned: bool = typer.Option(False, "--tuned", help=f"the confluent hop consumer with {TUNED}")) -> None:
    """aiokafka against confluent-kafka on the embedded broker: CPU per record and hop latency."""
    if tuned:
        HOP_TUNING.update(TUNED)
    records = records or (5_000 if quick else 20_000)
    seconds = seconds or (5.0 if quick else 15.0)
    import json

    print(json.dumps(asyncio.run(run(records, rate, seconds))))


if __name__ == "__main__":
    typer.run(main)
