"""Producing a record's outputs and knowing the broker acknowledged them.

`Outputs` collects the sends of one batch; `await outputs.flush()` returns once every send was
acknowledged (acks=all) and raises if any failed - only then may the input offsets be committed.
"""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaProducer

from pipeline.config.settings import Settings, kafka_kwargs
from pipeline.runtime.codec import Headers
from pipeline.runtime.doorbell import producer_class


def make_producer(settings: Settings, bootstrap: str) -> AIOKafkaProducer:
    """With a doorbell_dir, a producer that rings the consumers of what it wrote."""
    p = settings.producer
    cls, extra = producer_class(settings.doorbell_dir)
    return cls(
        bootstrap_servers=bootstrap,
        acks=p.acks,
        enable_idempotence=p.enable_idempotence,
        linger_ms=p.linger_ms,
        max_batch_size=p.max_batch_size,
        max_request_size=p.max_request_size,
        request_timeout_ms=p.request_timeout_ms,
        **kafka_kwargs(settings.kafka),
        **extra,
    )


class Outputs:
    def __init__(self, producer: AIOKafkaProducer) -> None:
        self.producer = producer
        self._pending: list[asyncio.Future] = []

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Headers | None = None,
    ) -> None:
        fut = await self.producer.send(topic, value, key=key, partition=partition, headers=headers or [])
        self._pending.append(fut)

    async def flush(self) -> int:
        pending, self._pending = self._pending, []
        if pending:
            await asyncio.gather(*pending)  # raises the first send failure
        return len(pending)
