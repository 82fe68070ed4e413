"""Events of the stack itself (the broker restarted, a worker crash-looping), recorded where operators
and analysts already look: an evidence row on `evidence`, so the warehouse's `decisions` has it and
the report's "Stack events" section lists it.

Rows are `stage = 'stack.<part>'` (the dot keeps them out of the per-stage latency and capacity
queries, which read final stage decisions only) with a `request_id` of `stack:<uuid>`: they
belong to no request.
"""

from __future__ import annotations

import uuid

from pipeline.config.settings import Settings, kafka_kwargs
from pipeline.contracts import Evidence
from pipeline.contracts.base import now_ms
from pipeline.runtime.broker.gate import GatedProducer
from pipeline.runtime.codec import encode
from pipeline.runtime.topics import TopicNames


def stack_event(part: str, decision: str, reason: str, *, scores: dict[str, float] | None = None,
                labels: dict[str, str] | None = None) -> Evidence:
    at = now_ms()
    return Evidence(request_id=f"stack:{uuid.uuid4().hex}", stage=f"stack.{part}", decision=decision, reason=reason,
                    scores=scores or {}, labels=labels or {}, worker="supervisor", enqueued_ms=at, started_ms=at,
                    finished_ms=at)


async def publish_stack_event(settings: Settings, bootstrap: str, event: Evidence) -> None:
    """Publish one event; raises when the broker does not take it within PRODUCE_TIMEOUT_MAX_MS."""
    producer = GatedProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False,
                             **kafka_kwargs(settings.kafka))
    await producer.start()
    try:
        await producer.send_and_wait(TopicNames(settings.topic_prefix).evidence, encode(event),
                                     key=event.request_id.encode())
    finally:
        await producer.stop()
