"""A planned roll of the embedded broker: its memory storage never frees a record and lists every
batch of a partition on each fetch (docs/decisions/0001-embedded-broker-tansu.md), so a stack that
runs for hours grows and slows. The supervisor restarts it before that, quiet, with its state.

Protocol (the BrokerKeeper's loop runs it, so never beside a crash restart):

1. Every `roll_check_s`, read the broker process's RSS. At `roll_rss_mib` or more (and at least
   `roll_min_interval_s` after the last roll), or when `llmpipe roll-broker` asked (ROLL_FILE), roll.
2. Hold the front door: a new request waits there instead of being published.
3. Drain: wait until the door has nothing in flight and every consumer group of the stack has read
   each partition of its topics to the end (`lagging`: a fetch from its committed offset returns
   nothing). Not quiet within `roll_drain_s`: release the door, log why, try again `roll_retry_s` later.
4. Close the produce gate and give every process's watch time to see it; check 3 once more (a send
   that passed the gate meanwhile). Not quiet: open the gate, release the door, try again later.
5. Read the compacted topics (admit's changelog, `control`) to their end, the latest value of each
   key per partition (`carry`), with markers sent past the closed gate.
6. Stop the broker, start it again on the same port, bump the epoch (every consumer reads the new
   logs from 0), create the topics, write the carried records back to their partitions (`write_back`),
   open the gate, release the door.
7. Record it where operators look (a stack event `broker_rolled`).

Not carried: the records of every other topic (each consumed by every group of the stack by step 3;
the sink had written the evidence, answers and dead letters to the warehouse), the groups' offsets,
and what a producer outside the stack (which has no gate) sends during steps 4-6, as in a restart.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from pydantic import BaseModel

from pipeline.config.settings import EmbeddedBrokerSettings, KafkaSecurity, kafka_kwargs
from pipeline.contracts.admit import StateMarker
from pipeline.contracts.control import Marker
from pipeline.runtime.codec import encode
from pipeline.runtime.follow.changelog import ChangelogReader
from pipeline.runtime.topics import TopicSpec
from pipeline.runtime.wakeup.polling import guarded_getmany

ROLL_FILE = "run/broker.roll"  # `llmpipe roll-broker` asks for a roll by writing it; the keeper removes it

Carried = dict[str, dict[int, dict[bytes, bytes]]]  # topic -> partition -> key -> latest value


@dataclass
class RollEvent:
    roll: int  # 1, 2, ... since the stack started
    why: str
    rss_mib: float  # the broker's, before
    drain_s: float  # step 2 to the gate closing
    down_s: float  # the gate closed to the gate open
    carried: int  # records written back


@dataclass
class RollHooks:
    """What the keeper needs from the stack to roll its broker."""

    clock: RollClock
    hold: Callable[[], None]  # step 2: the front door holds new requests
    release: Callable[[], Awaitable[None]]  # step 6: ... and lets them through once it sees the broker
    in_flight: Callable[[], int]  # requests the door has published and not answered
    groups: dict[str, list[str]]  # the stack's consumer groups -> the topics each consumes
    compacted: dict[str, str]  # topic -> value schema: carried over
    on_rolled: Callable[[RollEvent], Awaitable[None]]  # step 7
    security: KafkaSecurity | None = None

    async def busy(self, bootstrap: str) -> str | None:
        """Step 3's test once: why the stack is not quiet, or None."""
        if n := self.in_flight():
            return f"{n} request(s) in flight at the door"
        behind = await lagging(bootstrap, self.groups, self.security)
        return f"{len(behind)} partition(s) not read to their end: {', '.join(behind[:5])}" if behind else None


@dataclass
class RollClock:
    """Step 1: when a roll is due."""

    settings: EmbeddedBrokerSettings
    request_file: Path
    last_check: float = 0.0
    not_before: float = field(default_factory=time.monotonic)  # min interval after the start, as after a roll

    def due(self, pid: int | None) -> str | None:
        """Why the broker should roll now, or None."""
        now = time.monotonic()
        if self.request_file.exists():
            return "asked for (llmpipe roll-broker)"
        s = self.settings
        if not s.roll_rss_mib or pid is None or now - self.last_check < s.roll_check_s or now < self.not_before:
            return None
        self.last_check = now
        rss = rss_mib(pid)
        if rss is not None and rss >= s.roll_rss_mib:
            return f"its RSS reached {rss:.0f} MiB (embedded_broker.roll_rss_mib {s.roll_rss_mib})"
        return None

    def rolled(self) -> None:
        self.request_file.unlink(missing_ok=True)
        self.not_before = time.monotonic() + self.settings.roll_min_interval_s

    def postponed(self) -> None:
        self.request_file.unlink(missing_ok=True)  # asked once: an operator asks again
        self.not_before = time.monotonic() + self.settings.roll_retry_s


def rss_mib(pid: int) -> float | None:
    try:
        return psutil.Process(pid).memory_info().rss / 2**20
    except psutil.Error:
        return None


async def lagging(bootstrap: str, groups: dict[str, list[str]], security: KafkaSecurity | None = None) -> list[str]:
    """Step 3: `group topic[partition]` for every partition a group of the stack has not read to its end.
    End offsets are unreliable on the embedded broker, so a partition is read from the group's committed
    offset (0 when it committed none): any record there is one the group has not finished."""
    kafka = kafka_kwargs(security)
    start: dict[TopicPartition, tuple[str, int]] = {}  # one fetch per partition: the furthest-behind group
    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=50, **kafka)
    await reader.start()
    try:
        await reader.topics()  # the cluster's metadata: every topic's partitions
        for group, topics in groups.items():
            asker = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False, **kafka)
            await asker.start()  # never subscribes: it only reads the group's committed offsets
            try:
                for topic in topics:
                    for p in sorted(reader.partitions_for_topic(topic) or ()):
                        tp = TopicPartition(topic, p)
                        at = await asker.committed(tp) or 0
                        if tp not in start or at < start[tp][1]:
                            start[tp] = (group, at)
            finally:
                await asker.stop()
        if not start:
            return []
        reader.assign(list(start))
        for tp, (_, at) in start.items():
            reader.seek(tp, at)
        behind: set[TopicPartition] = set()
        for _ in range(2):  # the embedded broker answers a fetch of many partitions in parts
            got = await guarded_getmany(reader, "broker roll: lag", timeout_ms=300)
            behind |= {tp for tp, recs in got.items() if recs}
        return sorted(f"{start[tp][0]} {tp.topic}[{tp.partition}]" for tp in behind)
    finally:
        await reader.stop()


# a compacted topic's value schema -> the marker its readers skip (runtime/follow/)
MARKERS: dict[str, Callable[[str], BaseModel]] = {
    "control": lambda mid: Marker(marker_id=mid),
    "admit_state": lambda mid: StateMarker(marker_id=mid),
}


def compacted(registry: dict[str, TopicSpec]) -> dict[str, str]:
    """The registry's compacted topics (unprefixed name -> value schema): what a roll carries over."""
    out = {name: spec.value_schema or "" for name, spec in registry.items() if spec.cleanup_policy == "compact"}
    if unknown := sorted(n for n, schema in out.items() if schema not in MARKERS):
        raise ValueError(f"compacted topics {unknown} have no marker in runtime/broker/roll.py: a roll cannot carry them")
    return out


async def carry(bootstrap: str, topics: dict[str, str], security: KafkaSecurity | None = None,
                timeout_s: float = 60.0) -> Carried:
    """Step 5: the latest value of each key per partition of each compacted topic (name -> value schema);
    tombstones dropped (what compaction would keep, and all a changelog's reader needs)."""
    out: Carried = {}
    for topic, schema in topics.items():
        marker = MARKERS[schema]
        reader = await ChangelogReader(bootstrap, topic, lambda mid: encode(marker(mid)), security,  # noqa: B023
                                       gated=False).start()
        try:
            latest = await reader.read(list(range(await reader.partitions())), timeout_s)
        finally:
            await reader.stop()
        out[topic] = {p: {k: v for k, v in kv.items() if v is not None} for p, kv in latest.items()}
    return out


async def write_back(bootstrap: str, carried: Carried, security: KafkaSecurity | None = None) -> int:
    """Step 6: each carried record to its own partition, in its order; returns how many."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False,
                                max_request_size=16 << 20, **kafka_kwargs(security))
    await producer.start()
    try:
        acks = [await producer.send(topic, value, key=key, partition=p)
                for topic, parts in carried.items() for p, kv in parts.items() for key, value in kv.items()]
        for ack in acks:
            await ack
        return len(acks)
    finally:
        await producer.stop()
