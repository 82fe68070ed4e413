"""Assemble workers from settings: one StageWorker per stage group, and the warehouse sink."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable

from pipeline.config.settings import Settings
from pipeline.runtime.stage_handler import StageHandler
from pipeline.runtime.topics import TopicNames
from pipeline.runtime.topology import Topology, import_object
from pipeline.runtime.worker import StageWorker, default_worker_id
from pipeline.stores.warehouse import Warehouse
from pipeline.stores.warehouse_sink import SINK_STAGE, WarehouseSink

log = logging.getLogger(__name__)


def group_id(settings: Settings, stage: str) -> str:
    return f"{settings.topic_prefix}{'sink' if stage == SINK_STAGE else 'stage.' + stage}"


def stage_worker(settings: Settings, topology: Topology, stage: str, bootstrap: str) -> StageWorker:
    names = TopicNames(settings.topic_prefix)
    worker_id = settings.worker_id or default_worker_id()
    handler = StageHandler(topology.build(stage, bootstrap=bootstrap), topology, names, worker_id)
    topics = [names.stage_input(stage), *(names(t) for t in handler.stage.side_inputs)]
    if stage == topology.first:
        topics.append(names.requests)  # external producers publish to `requests`
    spec = topology.spec(stage)
    return StageWorker(handler, settings, bootstrap=bootstrap, topics=topics, group_id=group_id(settings, stage),
                       runtime=settings.runtime_for(spec), consumer=settings.consumer_for(spec), worker_id=worker_id)


def sink_worker(settings: Settings, bootstrap: str, warehouse: Warehouse) -> StageWorker:
    names = TopicNames(settings.topic_prefix)
    worker_id = settings.worker_id or default_worker_id()
    sink = WarehouseSink(warehouse, names, settings.sink, worker_id)
    # the sink's batches are large: its queue must hold at least one
    runtime = settings.runtime.model_copy(update={"queue_bound": max(settings.runtime.queue_bound, 2 * sink.max_batch)})
    # no doorbell: every stage rings the evidence topic, and the sink is paced by its flushes anyway
    consumer = settings.consumer.model_copy(update={"doorbell": False, "fetch_every_ms": settings.sink.flush_interval_ms})
    return StageWorker(sink, settings, bootstrap=bootstrap, topics=sink.topics, group_id=group_id(settings, SINK_STAGE),
                       runtime=runtime, consumer=consumer, worker_id=worker_id)


FEEDBACK_WORKER = "pipeline.stages.feedback.stage:FeedbackWorker"
FEEDBACK_HOST = "mask"  # the stage group whose processes also check feedback (they have its registry and masker)


def feedback_worker(settings: Settings, bootstrap: str, admin_url: str | None) -> StageWorker:
    """The feedback worker (its own consumer group), asking the warehouse who owns a target: through
    the stack's admin endpoint when the warehouse is embedded, else directly."""
    from pipeline.stores.owners import Owners
    from pipeline.stores.sql_gateway import warehouse_query

    worker_id = settings.worker_id or default_worker_id()
    owners = Owners(warehouse_query(settings, admin_url), wait_s=settings.feedback.owner_wait_s)
    handler = import_object(FEEDBACK_WORKER)(settings.model_copy(update={"bootstrap": bootstrap}), owners, worker_id)
    return StageWorker(handler, settings, bootstrap=bootstrap, topics=handler.topics,
                       group_id=f"{settings.topic_prefix}stage.{handler.name}", worker_id=worker_id)


async def start_all(workers: list[StageWorker]) -> list[StageWorker]:
    """Start concurrently (each first group join waits out the broker's initial rebalance delay,
    ~3 s on Tansu); if any fails, stop the ones that started and raise."""
    results = await asyncio.gather(*(w.start() for w in workers), return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    if failures:
        for w, r in zip(workers, results):
            if not isinstance(r, BaseException):
                await w.stop(drain=False)
        raise failures[0]
    return workers


async def run_until_signalled(workers: list[StageWorker], stop: asyncio.Event | None = None,
                              on_started: Callable[[], None] | None = None) -> None:
    """Start workers, wait for SIGTERM/SIGINT (or `stop`), then drain and stop them in order."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    started: list[StageWorker] = []
    try:
        started = await start_all(workers)
        if on_started is not None:
            on_started()
        await stop.wait()
    finally:
        log.info("draining %d workers", len(started))
        for w in started:  # pipeline order: upstream stops first, downstream drains what it sent
            await w.stop()
