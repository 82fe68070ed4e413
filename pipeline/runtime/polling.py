"""One guarded poll: aiokafka's getmany once did not return during a broker outage, so every
poll in llmpipe is bounded, and a failed poll backs off instead of spinning."""

from __future__ import annotations

import asyncio
import logging

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError

log = logging.getLogger(__name__)


async def guarded_getmany(consumer: AIOKafkaConsumer, what: str, *, timeout_ms: int = 100, guard_s: float = 10.0,
                          max_records: int | None = None) -> dict:
    """getmany bounded by `guard_s`; {} (after logging) when it times out or fails."""
    try:
        return await asyncio.wait_for(consumer.getmany(timeout_ms=timeout_ms, max_records=max_records), guard_s)
    except asyncio.TimeoutError:
        log.warning("%s: poll did not return within %.0fs (broker unreachable?)", what, guard_s)
    except KafkaError as exc:
        log.warning("%s: poll failed: %r", what, exc)
        await asyncio.sleep(0.5)
    return {}
