"""Producing a record's outputs and knowing the broker acknowledged them.

`Outputs` collects the sends of one batch; `await outputs.flush()` returns once every send was
acknowledged (acks=all) and raises if any failed - only then may the input offsets be committed.
`ReplyCheck` says whether a record's reply_to is somewhere the stage may write for it.
"""

from __future__ import annotations

import asyncio
import re
import time

from aiokafka import AIOKafkaProducer

from pipeline.config.settings import Settings, kafka_kwargs
from pipeline.contracts import ReplyTo
from pipeline.runtime.codec import Headers
from pipeline.runtime.wakeup.doorbell import producer_class


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


_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
METADATA_REFRESH_S = 5.0


class ReplyCheck:
    """A record's reply_to may name only the stack's `responses` topic and a partition it has.

    Anything else is the record's fault, caught where the document is read: a topic of the sender's
    choosing would have the stage's principal write there for them (admit's state, a stage's input),
    and aiokafka 0.14's `send` asserts `partition in partitions_for_topic(topic)` (an AssertionError,
    or with `python -O` a send the sender fails to deliver). The partitions come from the producer's
    metadata; a partition it lacks triggers one refresh (at most every METADATA_REFRESH_S), since the
    topic may have grown since the metadata was read."""

    def __init__(self, producer: AIOKafkaProducer, responses: str) -> None:
        self.producer = producer
        self.responses = responses
        self._refresh_after = 0.0

    async def problem(self, reply: ReplyTo | None) -> str | None:
        """None when the answer may go there; else why not, in words that name the bad reply_to."""
        if reply is None:
            return None
        if reply.topic != self.responses:
            named = repr(reply.topic) if _TOPIC_NAME.fullmatch(reply.topic) else "a topic name that is not allowed"
            return f"reply_to names topic {named}: answers go only to {self.responses}"
        partitions = await self.producer.partitions_for(self.responses)
        if reply.partition not in partitions and time.monotonic() >= self._refresh_after:
            self._refresh_after = time.monotonic() + METADATA_REFRESH_S
            await self.producer.client.force_metadata_update()
            partitions = await self.producer.partitions_for(self.responses)
        if reply.partition in partitions:
            return None
        return (f"reply_to names partition {reply.partition} of {self.responses}, "
                f"which has partitions 0-{max(partitions, default=-1)}")
