"""Knowing which requests their callers withdrew: every stage worker follows the `cancel` topic.

Protocol:
1. start(): assign every partition of `cancel` and seek to its end. Cancels published before the
   worker started are not read: a request is cancelled while somebody waits for it, and the worker
   that was processing it when it was cancelled is the one that had to stop.
2. Each `cancel/v1` record marks its request_id cancelled (the newest `MAX_REMEMBERED` are kept)
   and calls the callbacks registered for that request_id (generate's: abort the engine call).
3. The stage handler asks `cancelled(request_id)` before it processes a record: a cancelled
   request is answered `cancelled` where it is, instead of going on (stage_handler.py).
With a doorbell the watch dozes between cancels like a control follower; a producer of a cancel
rings it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from pipeline.config.settings import KafkaSecurity, kafka_kwargs
from pipeline.contracts import Cancel
from pipeline.runtime.bellpoll import BellPoller
from pipeline.runtime.broker_epoch import rewind_on_restart
from pipeline.runtime.codec import decode
from pipeline.runtime.doorbell import Bell
from pipeline.runtime.errors import DecodeError

log = logging.getLogger(__name__)

MAX_REMEMBERED = 100_000
DOZE_MAX_MS = 500  # a producer that does not ring is noticed within this (doorbell step 5)


class CancelWatch:
    def __init__(self, bootstrap: str, topic: str, security: KafkaSecurity | None = None,
                 doorbell_dir: Path | None = None) -> None:
        self.bootstrap, self.topic, self.doorbell_dir = bootstrap, topic, doorbell_dir
        self.kafka = kafka_kwargs(security)
        self.consumer: AIOKafkaConsumer | None = None
        self.bell: Bell | None = None
        self._task: asyncio.Task | None = None
        self._cancelled: OrderedDict[str, Cancel] = OrderedDict()
        self._callbacks: dict[str, list[Callable[[Cancel], None]]] = {}
        self.unreadable = 0

    async def start(self, producer: AIOKafkaProducer) -> "CancelWatch":
        """`producer` only looks up the topic's partitions (the owner's, already started)."""
        if self.doorbell_dir is not None:
            self.bell = await Bell(self.doorbell_dir, [self.topic]).start()
        self.consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False,
                                         fetch_max_wait_ms=20, auto_offset_reset="latest", **self.kafka)
        await self.consumer.start()
        await asyncio.sleep(0)  # aiokafka: a consumer stopped before its first tick raises CancelledError
        parts = await producer.partitions_for(self.topic)
        if not parts:
            raise RuntimeError(f"topic {self.topic} does not exist (run `llmpipe topics apply`)")
        tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
        self.consumer.assign(tps)
        await self.consumer.seek_to_end(*tps)
        rewind_on_restart(self.consumer)  # a restarted embedded broker's logs start at 0 again
        for tp in tps:
            await self.consumer.position(tp)  # step 1: fixed now, so a cancel sent after start is read
        self._task = asyncio.create_task(self._follow(), name="cancel-watch")
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self.consumer is not None:
            await self.consumer.stop()
            self.consumer = None
        if self.bell is not None:
            self.bell.stop()
            self.bell = None

    def cancelled(self, request_id: str) -> Cancel | None:
        return self._cancelled.get(request_id)

    def watch(self, request_id: str, callback: Callable[[Cancel], None]) -> Callable[[], None]:
        """Call `callback` when `request_id` is cancelled (at once if it already is); returns the
        function that stops watching."""
        known = self._cancelled.get(request_id)
        if known is not None:
            callback(known)
            return lambda: None
        self._callbacks.setdefault(request_id, []).append(callback)

        def unwatch() -> None:
            cbs = self._callbacks.get(request_id)
            if cbs and callback in cbs:
                cbs.remove(callback)
                if not cbs:
                    del self._callbacks[request_id]

        return unwatch

    def apply(self, cancel: Cancel) -> None:
        """Step 2."""
        self._cancelled[cancel.request_id] = cancel
        self._cancelled.move_to_end(cancel.request_id)
        while len(self._cancelled) > MAX_REMEMBERED:
            self._cancelled.popitem(last=False)
        for cb in self._callbacks.pop(cancel.request_id, []):
            try:
                cb(cancel)
            except Exception:  # noqa: BLE001 - one failing watcher must not stop the others
                log.exception("cancel watcher of a request failed")

    async def _follow(self) -> None:
        assert self.consumer is not None
        poller = BellPoller(self.consumer, self.bell, what="cancel watch", wait_ms=20, idle_wait_ms=200,
                            idle_after_ms=2000, awake_poll_ms=100, doze_max_ms=DOZE_MAX_MS)
        while True:
            for records in (await poller.poll()).values():
                for rec in records:
                    try:
                        self.apply(decode(rec.value, Cancel))
                    except DecodeError as exc:
                        self.unreadable += 1
                        log.error("cancel: unreadable record at %s:%d@%d (%s)", rec.topic, rec.partition,
                                  rec.offset, exc.error_class)
