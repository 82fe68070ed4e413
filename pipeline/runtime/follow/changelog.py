"""Restoring a stage's state from its changelog topic: read chosen partitions from the beginning
to their end, latest value per key winning (a None value is a tombstone).

"The end" is found with markers, not end offsets (unreliable on the embedded broker): a unique
marker record is produced to each partition and the partition is read until it comes back.
Writes go through the stage's outputs (SideRecord with an explicit partition), so they are
acknowledged before the input offsets that caused them are committed.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from pipeline.config.settings import KafkaSecurity, kafka_kwargs
from pipeline.runtime.broker.gate import GatedProducer
from pipeline.runtime.wakeup.polling import guarded_getmany

MARKER_KEY = b"~marker"


class ChangelogReader:
    def __init__(self, bootstrap: str, topic: str, marker: Callable[[str], bytes],
                 security: KafkaSecurity | None = None, gated: bool = True) -> None:
        self.bootstrap = bootstrap
        self.gated = gated  # False: the broker roll reads with the stack's gate closed (runtime/broker/roll.py)
        self.kafka = kafka_kwargs(security)
        self.topic = topic
        self.marker = marker  # marker id -> record value; the value must contain the id
        self.producer: AIOKafkaProducer | None = None

    async def start(self) -> ChangelogReader:
        cls = GatedProducer if self.gated else AIOKafkaProducer
        self.producer = cls(bootstrap_servers=self.bootstrap, acks="all", enable_idempotence=False, **self.kafka)
        await self.producer.start()
        return self

    async def stop(self) -> None:
        if self.producer is not None:
            await self.producer.stop()
            self.producer = None

    async def partitions(self, topic: str | None = None) -> int:
        assert self.producer is not None, "start() first"
        return len(await self.producer.partitions_for(topic or self.topic))

    async def read(self, partitions: list[int], timeout_s: float = 60.0) -> dict[int, dict[bytes, bytes | None]]:
        """The latest value of every key in each partition, as of this call, in the order of
        those latest values' offsets (what a compacted topic would still hold, in its order)."""
        assert self.producer is not None, "start() first"
        out: dict[int, dict[bytes, bytes | None]] = {p: {} for p in partitions}
        if not partitions:
            return out
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False,
                                    fetch_max_wait_ms=20, auto_offset_reset="earliest",
                                    max_partition_fetch_bytes=8 << 20, **self.kafka)
        await consumer.start()
        try:
            await asyncio.sleep(0)  # aiokafka: a consumer stopped before its first tick raises CancelledError
            tps = [TopicPartition(self.topic, p) for p in partitions]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            waiting: dict[int, bytes] = {}
            for p in partitions:
                mid = uuid.uuid4().hex
                waiting[p] = mid.encode()
                await self.producer.send_and_wait(self.topic, self.marker(mid), key=MARKER_KEY, partition=p)
            deadline = time.monotonic() + timeout_s
            while waiting:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"restoring {self.topic} partitions {sorted(waiting)} took over {timeout_s}s")
                batches = await guarded_getmany(consumer, f"changelog {self.topic}", timeout_ms=200)
                for tp, records in batches.items():
                    for rec in records:
                        if rec.key == MARKER_KEY:
                            if rec.value is not None and waiting.get(tp.partition, b"\0") in rec.value:
                                del waiting[tp.partition]
                            continue
                        if tp.partition in waiting and rec.key is not None:
                            latest = out[tp.partition]
                            latest.pop(rec.key, None)  # re-insert: the dict stays in order of latest offset
                            latest[rec.key] = rec.value
        finally:
            await consumer.stop()
        return out
