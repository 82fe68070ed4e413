"""The warehouse sink: evidence, finished requests, rollouts, feedback and dead letters into ClickHouse.

Per batch: decode each record by its topic -> insert each table's rows (one insert per table,
chDB costs 11-22 ms per insert whatever its size) -> return, so the worker commits the offsets.
A crash between insert and commit re-inserts the batch; ReplacingMergeTree keys make that
idempotent. Undecodable records go to the DLQ like anywhere else (except records of the DLQ
topic itself, which are counted and logged: re-dead-lettering them would loop).
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaProducer
from pydantic import BaseModel

from pipeline.config.settings import SinkSettings
from pipeline.contracts import DlqRecord, Evidence, Feedback, Response, Rollout, RolloutConsumption, WeightEvent
from pipeline.runtime.codec import decode, encode
from pipeline.runtime.dlq import dead_letter
from pipeline.runtime.errors import DecodeError
from pipeline.runtime.handler import Item
from pipeline.runtime.outputs import Outputs
from pipeline.runtime.serve.metrics import StageMetrics
from pipeline.runtime.topics import TopicNames
from pipeline.stores import warehouse_rows as rows
from pipeline.stores.warehouse import Warehouse

log = logging.getLogger(__name__)

SINK_STAGE = "sink"

# registry topic -> (model, table, columns, row builder)
_ROUTES: dict[str, tuple[type[BaseModel], str, list[str], Callable[[Any], list[Any]]]] = {
    "evidence": (Evidence, "decisions", rows.DECISIONS_COLUMNS, rows.decision_row),
    "responses": (Response, "requests", rows.REQUESTS_COLUMNS, rows.request_row),
    "rollouts": (Rollout, "rollouts", rows.ROLLOUTS_COLUMNS, rows.rollout_row),
    "weight_events": (WeightEvent, "weight_events", rows.WEIGHT_EVENTS_COLUMNS, rows.weight_event_row),
    "dlq": (DlqRecord, "dead_letters", rows.DEAD_LETTERS_COLUMNS, rows.dead_letter_row),
    "feedback.accepted": (Feedback, "feedback", rows.FEEDBACK_COLUMNS, rows.feedback_row),
    "rollouts.consumed": (RolloutConsumption, "rollout_consumption", rows.CONSUMPTION_COLUMNS, rows.consumption_row),
}


def sink_topics(names: TopicNames) -> list[str]:
    """What the sink consumes: every topic the warehouse keeps a table of."""
    return [names(t) for t in _ROUTES]


class WarehouseSink:
    name = SINK_STAGE
    concurrency = 1  # one writer: inserts are batched, and chDB serialises anyway

    def __init__(self, warehouse: Warehouse, names: TopicNames, settings: SinkSettings, worker_id: str) -> None:
        self.warehouse = warehouse
        self.names = names
        self.worker_id = worker_id
        self.max_batch = settings.batch_size
        self.max_wait_ms = settings.flush_interval_ms
        self.metrics = StageMetrics(SINK_STAGE)
        self._by_topic = {names(t): t for t in _ROUTES}
        self.producer: AIOKafkaProducer | None = None

    @property
    def topics(self) -> list[str]:
        return list(self._by_topic)

    async def start(self, producer: AIOKafkaProducer) -> None:
        self.producer = producer
        await asyncio.to_thread(self.warehouse.migrate)

    async def stop(self) -> None:
        pass

    async def on_assigned(self, topic_partitions: list[tuple[str, int]]) -> None:
        pass  # stateless: the warehouse is the state

    async def on_revoked(self, topic_partitions: list[tuple[str, int]]) -> None:
        pass

    async def handle(self, items: list[Item]) -> None:
        assert self.producer is not None
        tables: dict[str, tuple[list[str], list[list[Any]]]] = defaultdict(lambda: ([], []))
        out = Outputs(self.producer)
        for it in items:
            route = self._by_topic.get(it.record.topic)
            if route is None:
                continue
            model, table, columns, build = _ROUTES[route]
            try:
                obj = decode(it.record.value, model)
            except DecodeError as exc:
                await self._poison(out, it, route, exc)
                continue
            cols, batch = tables[table]
            if not cols:
                cols.extend(columns)
            batch.append(build(obj))
        for table, (cols, batch) in tables.items():
            await asyncio.to_thread(self.warehouse.insert, table, cols, batch)
            self.metrics.processed(table, len(batch))
        await out.flush()

    async def _poison(self, out: Outputs, it: Item, route: str, exc: DecodeError) -> None:
        self.metrics.error(exc.error_class)
        if route == "dlq":
            log.error("sink: unreadable record in the DLQ topic at %s:%d@%d (%s); left in place",
                      it.record.topic, it.record.partition, it.record.offset, exc.error_class)
            return
        self.metrics.dead_lettered(exc.error_class)
        dl = dead_letter(it.record, stage=SINK_STAGE, worker=self.worker_id, error_class=exc.error_class,
                         error=str(exc), attempts=0)
        await out.send(self.names.dlq, encode(dl), key=it.record.key, headers=list(it.record.headers or ()))
