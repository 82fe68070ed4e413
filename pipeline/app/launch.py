"""The workers of a group, for every way of starting the stack: in-process `llmpipe up` opens every
group in one process, `up --processes` one `llmpipe worker <group>` child per group, and that
command opens its one group here too (`open_group`).

A group is a stage of the topology, or the sink (`SINK_STAGE`): the warehouse, its admin endpoint
and the sink worker. The feedback worker runs in the FEEDBACK_HOST group's processes.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from contextlib import AsyncExitStack

from pipeline.config.settings import Settings
from pipeline.runtime.stage_handler import StageHandler
from pipeline.runtime.topics import TopicNames
from pipeline.runtime.topology import Topology
from pipeline.runtime.worker import StageWorker, default_worker_id
from pipeline.stages.sink.warehouse import SINK_STAGE, WarehouseSink, sink_topics
from pipeline.stores.warehouse import Warehouse

log = logging.getLogger(__name__)


def group_id(settings: Settings, stage: str) -> str:
    return f"{settings.topic_prefix}{'sink' if stage == SINK_STAGE else 'stage.' + stage}"


def stack_groups(settings: Settings, topology: Topology) -> dict[str, list[str]]:
    """Every consumer group of the stack and the topics it consumes (a broker roll waits for them all)."""
    names = TopicNames(settings.topic_prefix)
    groups = {group_id(settings, g): topology.group_topics(g, names) for g in topology.groups()}
    groups[group_id(settings, SINK_STAGE)] = sink_topics(names)
    if FEEDBACK_HOST in topology.groups():
        groups[f"{settings.topic_prefix}stage.feedback"] = [names.feedback]
    return groups


def stage_worker(settings: Settings, topology: Topology, stage: str, bootstrap: str) -> StageWorker:
    """The worker of the group `stage` starts: its stage, and the stages chained to it (each with its
    own handler, linked in order; the worker consumes every input topic of the chain)."""
    topology.require_group(stage)
    names = TopicNames(settings.topic_prefix)
    worker_id = settings.worker_id or default_worker_id()
    handler = StageHandler(topology.build(stage, bootstrap=bootstrap), topology, names, worker_id)
    last = handler
    for member in topology.chain(stage)[1:]:
        last = last.chain(StageHandler(topology.build(member, bootstrap=bootstrap), topology, names, worker_id))
    topics = topology.group_topics(stage, names)
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


FEEDBACK_HOST = "mask"  # the stage group whose processes also check feedback (they have its registry and masker)


def feedback_worker(settings: Settings, bootstrap: str, admin_url: str | None) -> StageWorker:
    """The feedback worker (its own consumer group), asking the warehouse who owns a target: through
    the stack's admin endpoint when the warehouse is embedded, else directly."""
    from pipeline.ingress.admin import warehouse_query
    from pipeline.stages.feedback.stage import FeedbackWorker
    from pipeline.stores.owners import Owners

    worker_id = settings.worker_id or default_worker_id()
    owners = Owners(warehouse_query(settings, admin_url), wait_s=settings.feedback.owner_wait_s)
    handler = FeedbackWorker(settings.model_copy(update={"bootstrap": bootstrap}), owners, worker_id)
    return StageWorker(handler, settings, bootstrap=bootstrap, topics=handler.topics,
                       group_id=f"{settings.topic_prefix}stage.{handler.name}", worker_id=worker_id)  # stack_groups


async def open_group(parts: AsyncExitStack, settings: Settings, topology: Topology, group: str, bootstrap: str,
                     admin_port: int | None, admin_token: str | None = None) -> list[StageWorker]:
    """The workers of one group, not started; what they need is opened on `parts` (closed LIFO).

    1. The sink group: the warehouse, opened and migrated (the admin endpoint answers at once); its
       admin endpoint on 127.0.0.1:`admin_port` (none or 0: a free port), guarded by `admin_token`
       (none: admin_token_for(settings)); the sink worker.
    2. A stage group: its stage worker; the FEEDBACK_HOST group also the feedback worker, which asks
       the admin endpoint on `admin_port` who owns a feedback target (none: the warehouse directly).
    """
    from pipeline.ingress.admin import AdminServer, admin_token_for
    from pipeline.runtime.service import serve
    from pipeline.stores.warehouse import open_warehouse

    if group == SINK_STAGE:
        warehouse = open_warehouse(settings)
        parts.callback(warehouse.close)
        await asyncio.to_thread(warehouse.migrate)
        await serve(parts, AdminServer(warehouse, admin_port or 0, admin_token or admin_token_for(settings)))
        return [sink_worker(settings, bootstrap, warehouse)]
    workers = [stage_worker(settings, topology, group, bootstrap)]
    if group == FEEDBACK_HOST:
        workers.append(feedback_worker(settings, bootstrap, f"http://127.0.0.1:{admin_port}" if admin_port else None))
    return workers


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
