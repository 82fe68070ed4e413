"""The contract between the worker (Kafka plumbing) and what it drives (a stage or a sink)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.structs import ConsumerRecord


@dataclass(slots=True)
class Item:
    """One consumed record and the assignment generation it was fetched under."""

    tp: TopicPartition
    record: ConsumerRecord
    generation: int


class Handler(Protocol):
    """Handles a batch of records. Returns only when every output is acknowledged by the broker
    (or stored, for sinks); a raise means "not done" and the worker retries the batch."""

    name: str
    max_batch: int
    max_wait_ms: int
    concurrency: int

    async def start(self, producer: AIOKafkaProducer) -> None: ...

    async def stop(self) -> None: ...

    async def handle(self, items: list[Item]) -> None: ...

    async def on_assigned(self, topic_partitions: list[tuple[str, int]]) -> None:
        """Partitions this worker now owns; awaited before any of their records is fetched."""

    async def on_revoked(self, topic_partitions: list[tuple[str, int]]) -> None:
        """Partitions this worker no longer owns (their done offsets are committed already)."""
