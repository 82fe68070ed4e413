"""Knowing which requests their callers withdrew: every stage worker follows the `cancel` topic.

Protocol:
1. start(): assign every partition of `cancel` and seek to its end. Cancels published before the
   worker started are not read: a request is cancelled while somebody waits for it, and the worker
   that was processing it when it was cancelled is the one that had to stop.
2. Each `cancel/v1` record marks (request_id, SHA-256 of its secret) cancelled (the newest
   `MAX_REMEMBERED` are kept) and calls the callbacks registered for that pair (generate's: abort
   the engine call). A cancel without a secret is counted and dropped.
3. The stage handler asks `cancelled(doc)` before it processes a record: a request cancelled with
   the secret its `cancel_digest` names is answered `cancelled` where it is, instead of going on
   (stage_handler.py).

Authorisation (issue 35, finding 7): request ids are visible on shared topics (`responses`,
`deltas`), so a cancel that names an id proves nothing. The sender of a request puts the SHA-256
of a secret only it knows in the request (`cancel_digest`; ingress/client.py derives one per
request), and a cancel applies to the request only when it carries that secret. Another tenant's
cancel, or one for another request that reused the id, lands under a pair no request has. Rejected:
a cancel signed by the door with the mask keyring and checked against the request's tenant (every
stage worker would need the keyring, and a producer that holds only an API key could no longer
cancel what it sent).
With a doorbell the watch dozes between cancels like a control follower; a producer of a cancel
rings it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from pipeline.config.settings import KafkaSecurity, kafka_kwargs
from pipeline.contracts import Cancel, RequestDoc
from pipeline.runtime.broker.epoch import rewind_on_restart
from pipeline.runtime.codec import decode
from pipeline.runtime.errors import DecodeError
from pipeline.runtime.service import BackgroundTask
from pipeline.runtime.wakeup.bellpoll import BellPoller
from pipeline.runtime.wakeup.doorbell import Bell

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
        self._task = BackgroundTask("cancel-watch")
        # (request_id, SHA-256 of the cancel's secret) -> the cancel
        self._cancelled: OrderedDict[tuple[str, str], Cancel] = OrderedDict()
        self._callbacks: dict[tuple[str, str], list[Callable[[Cancel], None]]] = {}
        self.unreadable = 0
        self.unsigned = 0  # cancels without a secret: nobody's request can match them

    async def start(self, producer: AIOKafkaProducer) -> CancelWatch:
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
        self._task.launch(self._follow)
        return self

    async def stop(self) -> None:
        await self._task.cancel()
        if self.consumer is not None:
            await self.consumer.stop()
            self.consumer = None
        if self.bell is not None:
            self.bell.stop()
            self.bell = None

    def cancelled(self, doc: RequestDoc) -> Cancel | None:
        """The cancel its sender published for this request, if any (None when it has no digest)."""
        return self._cancelled.get((doc.request_id, doc.cancel_digest)) if doc.cancel_digest else None

    def watch(self, doc: RequestDoc, callback: Callable[[Cancel], None]) -> Callable[[], None]:
        """Call `callback` when its sender cancels `doc` (at once if it already has); returns the
        function that stops watching."""
        if not doc.cancel_digest:
            return lambda: None  # nobody can cancel it
        key = (doc.request_id, doc.cancel_digest)
        known = self._cancelled.get(key)
        if known is not None:
            callback(known)
            return lambda: None
        self._callbacks.setdefault(key, []).append(callback)

        def unwatch() -> None:
            cbs = self._callbacks.get(key)
            if cbs and callback in cbs:
                cbs.remove(callback)
                if not cbs:
                    del self._callbacks[key]

        return unwatch

    def apply(self, cancel: Cancel) -> None:
        """Step 2."""
        if not cancel.secret:
            self.unsigned += 1
            log.info("cancel: a cancel without a secret was dropped (request %s)", cancel.request_id)
            return
        key = (cancel.request_id, digest(cancel.secret))
        self._cancelled[key] = cancel
        self._cancelled.move_to_end(key)
        while len(self._cancelled) > MAX_REMEMBERED:
            self._cancelled.popitem(last=False)
        for cb in self._callbacks.pop(key, []):
            try:
                cb(cancel)
            except Exception:
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


def digest(secret: str) -> str:
    """What a request's `cancel_digest` holds for a cancel secret."""
    return hashlib.sha256(secret.encode()).hexdigest()
