"""The stage worker: consume -> bounded queue -> handle -> produce -> commit.

Commit protocol (an offset is committed only when it is safe to never see its record again):

1. The fetch loop polls at most `queue.room()` records, tracks each offset per partition and
   queues it; past the high-water mark it pauses every assigned partition, and resumes below
   the low-water mark.
2. A processor takes a batch, and the handler produces every output and waits for the broker's
   acks (or the sink's insert) before it returns.
3. Only then is each offset marked done. A partition's committable offset is the lowest offset
   not done yet (or the last one + 1), so a slow record holds back the commit of later ones.
4. The commit loop commits advanced offsets every `commit_interval_ms`; on revocation the
   revoked partitions' done offsets are committed first and their queued records are dropped
   (the new owner reads them again); on SIGTERM the worker stops fetching, drains the queue and
   in-flight work (bounded by drain_timeout_s) and commits before leaving the group.
5. A crash loses nothing: everything after the last commit is redelivered (at-least-once; the
   sinks are idempotent on request_id/stage/attempt).
6. A batch whose handling raises is retried with backoff for as long as the error is the
   infrastructure's (errors.is_infrastructure: the broker down, timeouts). An error that is the
   records' own (errors.is_record_fault), or one that is neither after `UNKNOWN_TRIES` tries, is
   narrowed down: each record is handled alone, and one that still fails alone is handed to the
   handler's `give_up` (the stage handler dead-letters and answers it), then counted done. A
   handler without `give_up` (the warehouse sink: a warehouse outage raises its client's own
   errors) keeps retrying.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from aiokafka.structs import OffsetAndMetadata

from pipeline.config.settings import ConsumerSettings, RuntimeSettings, Settings, kafka_kwargs
from pipeline.runtime.broker.epoch import tell_on_restart
from pipeline.runtime.broker.watch import BrokerWatch
from pipeline.runtime.errors import is_infrastructure, is_record_fault
from pipeline.runtime.flow import BoundedQueue
from pipeline.runtime.handler import Handler, Item
from pipeline.runtime.offsets import OffsetTracker
from pipeline.runtime.outputs import make_producer
from pipeline.runtime.serve.metrics import StageMetrics
from pipeline.runtime.wakeup.bellpoll import BellPoller, PacedBell
from pipeline.runtime.wakeup.doorbell import Bell

log = logging.getLogger(__name__)
# an error neither the records' nor the infrastructure's (a broker's UnknownError, a bug): ~11 s of
# backoff, long enough for a broker's passing oddity, then narrowed down to the record (step 6)
UNKNOWN_TRIES = 8


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, worker: StageWorker) -> None:
        self.worker = worker

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.worker._on_revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self.worker._on_assigned(set(assigned))


class StageWorker:
    """One consumer-group member. `async with StageWorker(...)` or start()/stop()."""

    def __init__(
        self,
        handler: Handler,
        settings: Settings,
        *,
        bootstrap: str,
        topics: list[str],
        group_id: str,
        runtime: RuntimeSettings | None = None,
        consumer: ConsumerSettings | None = None,
        worker_id: str | None = None,
    ) -> None:
        self.handler = handler
        self.settings = settings
        self.runtime = runtime or settings.runtime
        self.consumer_settings = consumer or settings.consumer
        self.bootstrap = bootstrap
        self.topics = topics
        self.group_id = group_id
        self.worker_id = worker_id or settings.worker_id or default_worker_id()
        self.metrics = StageMetrics(handler.name)
        self.queue: BoundedQueue[Item] = BoundedQueue(
            self.runtime.queue_bound, self.runtime.high_watermark, self.runtime.low_watermark, self.metrics
        )
        self.tracker = OffsetTracker()
        self._from_zero = False  # the broker restarted: read the next assignment from offset 0
        self._generation: dict[TopicPartition, int] = {}
        self._gen_counter = 0
        self._restoring: set[TopicPartition] = set()  # assigned, paused until the stage restored their state
        self._in_flight = 0
        self._fetching = True
        self._tasks: list[asyncio.Task] = []
        self._processors: list[asyncio.Task] = []
        self.consumer: AIOKafkaConsumer | None = None
        self.producer: AIOKafkaProducer | None = None
        self.bell: Bell | PacedBell | None = None
        self.poller: BellPoller | None = None
        self.broker: BrokerWatch | None = None
        self.stopped = asyncio.Event()

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self) -> StageWorker:
        c = self.consumer_settings
        self.producer = make_producer(self.settings, self.bootstrap)
        await self.producer.start()
        await self.handler.start(self.producer)
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=self.group_id,
            client_id=f"{self.handler.name}-{self.worker_id}",
            enable_auto_commit=False,
            auto_offset_reset=c.auto_offset_reset,
            fetch_max_wait_ms=c.fetch_max_wait_ms,
            session_timeout_ms=c.session_timeout_ms,
            heartbeat_interval_ms=c.heartbeat_interval_ms,
            max_poll_interval_ms=c.max_poll_interval_ms,
            rebalance_timeout_ms=c.rebalance_timeout_ms,
            max_partition_fetch_bytes=c.max_partition_fetch_bytes,
            fetch_max_bytes=c.fetch_max_bytes,
            # range, not aiokafka's round-robin: partition p of every input topic goes to the same
            # member, so a stage's side inputs stay co-partitioned with its input (admit's completions)
            partition_assignment_strategy=(RangePartitionAssignor,),
            **kafka_kwargs(self.settings.kafka),
        )
        self.consumer.subscribe(self.topics, listener=_Rebalance(self))
        tell_on_restart(self)  # an embedded broker that restarted lost the group and its offsets
        if self.settings.doorbell_dir and c.doorbell:
            self.bell = await Bell(self.settings.doorbell_dir, self.topics).start()
        elif c.fetch_every_ms:
            self.bell = PacedBell()
        await self.consumer.start()
        # this worker's view of the broker: `llmpipe_broker_up{process}`, its log, `llmpipe status`
        self.broker = await BrokerWatch(self.producer.client, self.topics, process=f"stage {self.handler.name}",
                                        interval_s=2.0).start()
        concurrency = max(1, self.handler.concurrency)
        self._processors = [asyncio.create_task(self._process_loop(), name=f"{self.handler.name}-proc{i}")
                            for i in range(concurrency)]
        self._tasks = [
            asyncio.create_task(self._fetch_loop(), name=f"{self.handler.name}-fetch"),
            asyncio.create_task(self._commit_loop(), name=f"{self.handler.name}-commit"),
        ]
        log.info("worker %s started: stage=%s topics=%s group=%s concurrency=%d",
                 self.worker_id, self.handler.name, self.topics, self.group_id, concurrency)
        return self

    async def stop(self, drain: bool = True) -> None:
        """Graceful: stop fetching, finish queued and in-flight records, commit, leave the group."""
        if self.stopped.is_set():
            return
        self._fetching = False
        deadline = time.monotonic() + (self.runtime.drain_timeout_s if drain else 0)
        while drain and (self.queue.qsize() or self._in_flight) and time.monotonic() < deadline:  # noqa: ASYNC110 - bounded
            await asyncio.sleep(0.02)
        left = self.queue.qsize() + self._in_flight
        if left:
            log.warning("stage %s stopping with %d records not done; they will be redelivered", self.handler.name, left)
        for t in self._processors + self._tasks:
            t.cancel()
        await asyncio.gather(*self._processors, *self._tasks, return_exceptions=True)
        if self.broker is not None:
            await self.broker.stop()
        await self._commit()
        try:
            if self.consumer is not None:
                await self.consumer.stop()
        finally:
            await self.handler.stop()
            if self.producer is not None:
                await self.producer.stop()
            if self.bell is not None:
                self.bell.stop()
            self.stopped.set()

    async def __aenter__(self) -> StageWorker:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ---- rebalance ---------------------------------------------------------------------------

    def broker_restarted(self) -> None:
        """runtime/broker/epoch.py: the embedded broker's logs start at 0 again. Offsets of the old
        logs are never committed, and the next assignment is read from offset 0."""
        for tp in self.tracker.owned():
            self.tracker.reset(tp)
        self._from_zero = True

    async def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        for tp in assigned:
            self._gen_counter += 1
            self._generation[tp] = self._gen_counter
            self.tracker.reset(tp)
        log.info("stage %s assigned %s", self.handler.name, sorted(f"{tp.topic}:{tp.partition}" for tp in assigned))
        if not assigned or self.consumer is None:
            return
        if self._from_zero:  # not the committed offsets: one may be the old generation's, from the old logs
            self._from_zero = False
            for tp in assigned:
                self.consumer.seek(tp, 0)
        # The stage restores these partitions' state first. The consumer may fetch while this
        # listener awaits, so they stay paused (nothing of them is fetched) until it is done.
        self.consumer.pause(*assigned)
        self._restoring |= assigned
        backoff = 0.5
        try:
            while True:
                try:
                    await self.handler.on_assigned([(tp.topic, tp.partition) for tp in assigned])
                    break
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - never process a partition on half its state
                    self.metrics.error("restore_failed")
                    log.warning("stage %s: restoring %d partitions failed (%r); retrying in %.1fs",
                                self.handler.name, len(assigned), exc, backoff)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 10.0)
        finally:
            self._restoring -= assigned
        if not self.queue.paused:
            self.consumer.resume(*(assigned & self.consumer.assignment()))
        if self.bell is not None:
            self.bell.wake()  # a dozing fetch loop reads the new partitions now

    async def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        # Give in-flight records of these partitions a moment to finish, then commit what is done.
        deadline = time.monotonic() + min(2.0, self.consumer_settings.session_timeout_ms / 3000)
        while self.tracker.in_flight(revoked) and time.monotonic() < deadline:  # noqa: ASYNC110 - at most 2 s
            await asyncio.sleep(0.01)
        await self._commit(revoked)
        for tp in revoked:
            self._generation.pop(tp, None)
            self.tracker.forget(tp)
        await self.handler.on_revoked([(tp.topic, tp.partition) for tp in revoked])

    # ---- loops -------------------------------------------------------------------------------

    async def _fetch_loop(self) -> None:
        assert self.consumer is not None
        c = self.consumer_settings
        doze_max_ms = (c.fetch_every_ms or c.doze_max_ms) if isinstance(self.bell, PacedBell) else c.doze_max_ms
        poller = self.poller = BellPoller(
            self.consumer, self.bell, what=f"stage {self.handler.name}", wait_ms=c.fetch_max_wait_ms,
            idle_wait_ms=c.idle_fetch_max_wait_ms, idle_after_ms=c.idle_after_ms, awake_poll_ms=100,
            doze_max_ms=doze_max_ms, idle_doze_max_ms=c.idle_doze_max_ms, guard_s=c.poll_guard_s, held=lambda: self._restoring,
            may_resume=lambda: not self.queue.paused, on_doze=self.metrics.dozed)
        while self._fetching:
            if self.queue.paused:
                if await self.queue.wait_below_low(0.2):
                    self.consumer.resume(*(self.consumer.assignment() - self._restoring))
                    self.queue.set_paused(False)
                    poller.forget()
                continue
            room = self.queue.room()
            if room <= 0:
                await asyncio.sleep(0.005)
                continue
            unrung = self.bell.unrung if self.bell is not None else 0
            batches = await poller.poll(max_records=room)
            if self.bell is not None and self.bell.unrung > unrung:
                self.metrics.unrung.inc()
            for tp, records in batches.items():
                gen = self._generation.get(tp)
                if gen is None:
                    continue  # revoked while fetched: the new owner reads these
                for rec in records:
                    self.tracker.track(tp, rec.offset)
                    self.queue.put(Item(tp, rec, gen))
                hw = self.consumer.highwater(tp)
                if hw is not None:
                    self.metrics.lag(tp.partition, max(0, hw - records[-1].offset - 1))
            if self.queue.should_pause():
                self.consumer.pause(*self.consumer.assignment())
                self.queue.set_paused(True)
                poller.forget()

    async def _next_batch(self) -> list[Item]:
        first = await self.queue.get()
        items = [first]
        max_batch = self.handler.max_batch
        if max_batch > 1:
            # what is queued joins at once; waiting `max_wait_ms` for more pays only while another
            # batch is being processed (under load). An idle worker goes at once: a fixed wait per
            # hop was most of a lone request's queue time (generate 5 ms of ~10, issue 18)
            wait_ms = self.handler.max_wait_ms if self._in_flight > 0 else 0
            deadline = time.monotonic() + wait_ms / 1000
            while len(items) < max_batch:
                try:
                    items.append(self.queue.get_nowait())
                    continue
                except asyncio.QueueEmpty:
                    pass
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    async with asyncio.timeout(remaining):
                        items.append(await self.queue.get())
                except TimeoutError:
                    break
        # records of partitions revoked since they were queued belong to their new owner now
        return [it for it in items if self._generation.get(it.tp) == it.generation]

    async def _process_loop(self) -> None:
        while True:
            items = await self._next_batch()
            if not items:
                continue
            self._in_flight += len(items)
            self.metrics.in_flight.set(self._in_flight)
            try:
                await self._handle_until_done(items)
                for it in items:
                    if self._generation.get(it.tp) == it.generation:
                        self.tracker.done(it.tp, it.record.offset)
            finally:
                self._in_flight -= len(items)
                self.metrics.in_flight.set(self._in_flight)

    async def _handle_until_done(self, items: list[Item]) -> None:
        """Step 6: the infrastructure's trouble is retried until it passes; the records' is not."""
        backoff, unknown = 0.1, 0
        give_up = getattr(self.handler, "give_up", None)
        while True:
            try:
                await self.handler.handle(items)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001
                infra = is_infrastructure(exc)
                unknown = 0 if infra else unknown + 1
                if give_up is not None and not infra and (is_record_fault(exc) or unknown >= UNKNOWN_TRIES):
                    if len(items) == 1:
                        return await self._give_up(items[0], exc)
                    for it in items:  # which record is it? each alone (the good ones are handled again)
                        await self._handle_until_done([it])
                    return
                self.metrics.error("output_failed")
                # an infrastructure error says what failed; any other may quote a record (PII): its class only
                log.warning("stage %s: outputs of %d records failed (%s); retrying in %.1fs", self.handler.name,
                            len(items), repr(exc) if infra else type(exc).__name__, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _give_up(self, item: Item, exc: BaseException) -> None:
        """The handler dead-letters and answers the record; only the infrastructure's trouble is retried here."""
        backoff = 0.1
        while True:
            try:
                await self.handler.give_up(item, exc)  # type: ignore[attr-defined]
                self.metrics.error("given_up")
                return
            except asyncio.CancelledError:
                raise
            except Exception as again:  # noqa: BLE001
                if not is_infrastructure(again):
                    self.metrics.error("unanswerable")
                    log.error("stage %s: record %s:%d@%d could not be dead-lettered (%s); skipped", self.handler.name,
                              item.record.topic, item.record.partition, item.record.offset, type(again).__name__)
                    return
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _commit_loop(self) -> None:
        interval = self.runtime.commit_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            await self._commit()

    async def _commit(self, tps: set[TopicPartition] | None = None) -> None:
        if self.consumer is None:
            return
        offsets = self.tracker.to_commit(tps)
        if not offsets:
            return
        try:
            await self.consumer.commit({tp: OffsetAndMetadata(off, "") for tp, off in offsets.items()})
            self.tracker.mark_committed(offsets)
            self.metrics.commits.inc()
        except (CommitFailedError, IllegalStateError, KafkaError) as exc:
            # a rebalance is under way: the records are redelivered to the new owner
            log.info("stage %s: commit of %d partitions skipped: %r", self.handler.name, len(offsets), exc)
