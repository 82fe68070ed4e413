"""Follow a whole topic (every partition, from the beginning, no consumer group) and apply each
record: how every cache worker keeps its replica of the `control` changelog.

Catching up: end offsets are unreliable on the embedded broker, so `catch_up()` writes a unique
marker record to every partition and waits until the follower has read all of them back.

With a doorbell dir (runtime/wakeup/doorbell.py) the follower dozes between records like a stage
worker: `control` takes a cache write-back per answered miss, so without it every follower of
every process (six in the product topology) fetched every 20 ms while traffic flowed. A rung
follower still fetches at most once per `MIN_ROUND_S`: only the cache stage applies write-backs,
the others would wake for each one only to skip it, and a fetch is what costs the broker
(bench/broker_cost.py). Control changes are applied up to that much later.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from pydantic import BaseModel

from pipeline.config.settings import KafkaSecurity, kafka_kwargs
from pipeline.contracts import ControlRecord, Marker
from pipeline.runtime.broker.epoch import rewind_on_restart
from pipeline.runtime.codec import decode, encode
from pipeline.runtime.errors import DecodeError
from pipeline.runtime.service import BackgroundTask
from pipeline.runtime.wakeup.bellpoll import BellPoller
from pipeline.runtime.wakeup.doorbell import Bell, producer_class

log = logging.getLogger(__name__)

DOZE_MAX_MS = 1000  # control changes are rare; a producer that does not ring is caught by doorbell step 5
MIN_ROUND_S = 0.2  # after a ring: control changes of one round are applied together


class ControlFollower:
    def __init__(self, bootstrap: str, topic: str, apply: Callable[[object], object],
                 security: KafkaSecurity | None = None, doorbell_dir: Path | None = None) -> None:
        self.bootstrap = bootstrap
        self.doorbell_dir = doorbell_dir
        self.bell: Bell | None = None
        self.kafka = kafka_kwargs(security)
        self.topic = topic
        self.apply = apply
        self.consumer: AIOKafkaConsumer | None = None
        self.producer: AIOKafkaProducer | None = None
        self._task = BackgroundTask("control-follower")
        self._waiting: dict[str, asyncio.Event] = {}
        self.applied = 0
        self.unreadable = 0

    async def start(self, timeout_s: float = 60.0) -> ControlFollower:
        cls, extra = producer_class(self.doorbell_dir)  # catch-up markers ring the other followers too
        self.producer = cls(bootstrap_servers=self.bootstrap, acks="all", enable_idempotence=False,
                            **self.kafka, **extra)
        await self.producer.start()
        if self.doorbell_dir is not None:
            self.bell = await Bell(self.doorbell_dir, [self.topic]).start()
        self.consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False,
                                         fetch_max_wait_ms=20,
                                         auto_offset_reset="earliest",
                                         **self.kafka)
        await self.consumer.start()
        await asyncio.sleep(0)  # aiokafka: a consumer stopped before its first tick raises CancelledError
        parts = await self.producer.partitions_for(self.topic)
        tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
        self.consumer.assign(tps)
        await self.consumer.seek_to_beginning(*tps)
        rewind_on_restart(self.consumer)  # a restarted embedded broker's logs start at 0 again
        self._task.launch(self._follow)
        await self.catch_up(timeout_s)
        return self

    async def stop(self) -> None:
        await self._task.cancel()
        if self.consumer is not None:
            await self.consumer.stop()
        if self.producer is not None:
            await self.producer.stop()
        if self.bell is not None:
            self.bell.stop()

    async def publish(self, record: BaseModel, key: bytes | None = None) -> None:
        await self.publish_to(self.topic, record, key)

    async def publish_to(self, topic: str, record: BaseModel, key: bytes | None = None) -> None:
        """Another topic through the same producer (e.g. `weight_events` next to a control report)."""
        assert self.producer is not None
        await self.producer.send_and_wait(topic, encode(record), key=key)

    async def catch_up(self, timeout_s: float = 60.0) -> None:
        """Return once every record written before this call has been applied."""
        assert self.producer is not None
        events = []
        for p in sorted(await self.producer.partitions_for(self.topic)):
            marker = Marker(marker_id=uuid.uuid4().hex)
            ev = self._waiting[marker.marker_id] = asyncio.Event()
            events.append(ev)
            await self.producer.send_and_wait(self.topic, encode(marker), partition=p)
        async with asyncio.timeout(timeout_s):
            await asyncio.gather(*(e.wait() for e in events))

    async def _follow(self) -> None:
        assert self.consumer is not None
        # awake (no bell, or doorbell step 5): slow polls when idle
        poller = BellPoller(self.consumer, self.bell, what="control follower", wait_ms=20, idle_wait_ms=200,
                            idle_after_ms=2000, awake_poll_ms=200, doze_max_ms=DOZE_MAX_MS, min_round_s=MIN_ROUND_S)
        while True:
            batches = await poller.poll()
            for records in batches.values():
                for rec in records:
                    try:
                        record = decode(rec.value, ControlRecord).root
                    except DecodeError as exc:
                        self.unreadable += 1
                        log.error("control: unreadable record at %s:%d@%d (%s)", rec.topic, rec.partition,
                                  rec.offset, exc.error_class)
                        continue
                    if isinstance(record, Marker):
                        ev = self._waiting.pop(record.marker_id, None)
                        if ev is not None:
                            ev.set()
                        continue
                    await asyncio.to_thread(self.apply, record)
                    self.applied += 1
