"""What one request of each kind costs the embedded broker (Tansu, memory storage), in broker CPU.

peer_bench shows the broker as the largest process of the product topology; this says which
requests make that cost, so a change can aim at the right one. Each phase runs one kind of
request back to back from one client for a few seconds and divides the broker's CPU by the count:

  empty fetch   a consumer polling an idle 6-partition topic, at fetch_max_wait 0, 1, 5, 20, 100 ms
  produce 1     send_and_wait of one 1 KB record, acks=all
  produce 2     one forward record and one evidence record sent together (two topics, one request)
  fetch 1       a consumer reading what a producer writes one record at a time
  commit        an offset commit of one partition
  heartbeat     a group member with a 100 ms heartbeat, otherwise idle

    python bench/broker_cost.py [--seconds 4] [--json out.json]
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import typer
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import OffsetAndMetadata
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.runtime.broker.embedded import EmbeddedBroker
from pipeline.runtime.topics import TopicSpec, apply_topics

console = Console()
VALUE = os.urandom(1024)


def ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


async def measure(pid: int, seconds: float, step) -> tuple[int, float]:
    """Run `step()` (one request of the kind) until `seconds` pass; (count, broker CPU ms each)."""
    hz = os.sysconf("SC_CLK_TCK")
    t0, c0, n = time.monotonic(), ticks(pid), 0
    while time.monotonic() - t0 < seconds:
        n += await step()
    return n, round(1000 * (ticks(pid) - c0) / hz / max(n, 1), 3)


async def empty_fetches(bs: str, pid: int, wait_ms: int, seconds: float) -> dict[str, float]:
    """A consumer polling an idle 6-partition topic; fetch requests counted as the client sends them."""
    cons = AIOKafkaConsumer("bc.idle", bootstrap_servers=bs, fetch_max_wait_ms=wait_ms, group_id=f"bc-idle-{wait_ms}",
                            enable_auto_commit=False)
    await cons.start()
    try:
        await cons.getmany(timeout_ms=2000)
        sent = [0]
        orig = cons._client.send

        async def counting(node_id, request, **kw):
            if type(request).__name__.startswith("FetchRequest"):
                sent[0] += 1
            return await orig(node_id, request, **kw)

        cons._client.send = counting
        hz = os.sysconf("SC_CLK_TCK")
        t0, c0 = time.monotonic(), ticks(pid)
        while time.monotonic() - t0 < seconds:
            await cons.getmany(timeout_ms=100)
        return {"count": sent[0], "broker_ms": round(1000 * (ticks(pid) - c0) / hz / max(sent[0], 1), 3)}
    finally:
        await cons.stop()


async def run(seconds: float) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="bc", dir="/tmp") as d:
        async with EmbeddedBroker(Path(d)) as broker:
            bs, pid = broker.bootstrap, broker.proc.pid
            await apply_topics(bs, "bc.", {n: TopicSpec(n, 6, "request_id", 3_600_000, "delete", None)
                                           for n in ("idle", "a", "b", "c")})
            out: dict[str, dict[str, float]] = {}
            prod = AIOKafkaProducer(bootstrap_servers=bs, acks="all", linger_ms=0)
            await prod.start()
            try:
                # empty fetches at several waits: the broker's cost grows with the wait (it polls)
                for wait in (0, 1, 5, 20, 100):
                    out[f"empty fetch, {wait} ms wait"] = await empty_fetches(bs, pid, wait, seconds)

                async def produce1() -> int:
                    await prod.send_and_wait("bc.a", VALUE, partition=0)
                    return 1

                n, ms = await measure(pid, seconds, produce1)
                out["produce 1"] = {"count": n, "broker_ms": ms}

                async def produce2() -> int:
                    f1 = await prod.send("bc.a", VALUE, partition=1)
                    f2 = await prod.send("bc.b", VALUE[:300], partition=1)
                    await asyncio.gather(f1, f2)
                    return 1

                n, ms = await measure(pid, seconds, produce2)
                out["produce 2 (one request)"] = {"count": n, "broker_ms": ms}

                reader = AIOKafkaConsumer(bootstrap_servers=bs, fetch_max_wait_ms=5, enable_auto_commit=False)
                await reader.start()
                tp = TopicPartition("bc.c", 0)
                reader.assign([tp])
                await reader.seek_to_end(tp)

                async def fetch1() -> int:
                    await prod.send_and_wait("bc.c", VALUE, partition=0)
                    got = 0
                    while not got:
                        got = sum(len(r) for r in (await reader.getmany(tp, timeout_ms=1000)).values())
                    return 1

                n, ms = await measure(pid, seconds, fetch1)
                produce_ms = out["produce 1"]["broker_ms"]
                out["fetch 1 (minus its produce)"] = {"count": n, "broker_ms": round(ms - produce_ms, 3)}
                await reader.stop()

                member = AIOKafkaConsumer("bc.idle", bootstrap_servers=bs, group_id="bc-commit",
                                          enable_auto_commit=False, fetch_max_wait_ms=5)
                await member.start()
                await member.getmany(timeout_ms=2000)
                offset = [0]
                tp0 = TopicPartition("bc.idle", 0)

                async def commit() -> int:
                    offset[0] += 1
                    await member.commit({tp0: OffsetAndMetadata(0, "")})
                    return 1

                member.pause(*member.assignment())  # no fetches during the commit phase
                n, ms = await measure(pid, seconds, commit)
                out["commit"] = {"count": n, "broker_ms": ms}
                await member.stop()
            finally:
                await prod.stop()
            return out


def main(seconds: float = typer.Option(4.0, help="seconds per phase"),
         json_out: Path = typer.Option(None, "--json", help="write the result here")) -> None:
    result = asyncio.run(run(seconds))
    t = Table("request", "count", "broker CPU ms each", title="embedded broker (Tansu, memory storage)")
    for k, v in result.items():
        t.add_row(k, str(v["count"]), f"{v['broker_ms']:.3f}")
    console.print(t)
    doc = {"bench": "broker_cost", "seconds_per_phase": seconds, "requests": result}
    print(json.dumps(doc))
    if json_out:
        json_out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    typer.run(main)
