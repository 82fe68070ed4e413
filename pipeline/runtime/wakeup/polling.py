"""One guarded poll: aiokafka's getmany once did not return during a broker outage, so every
poll in llmpipe is bounded, and a failed poll backs off instead of spinning."""

from __future__ import annotations

import asyncio
import logging
import time

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError

log = logging.getLogger(__name__)


async def guarded_getmany(consumer: AIOKafkaConsumer, what: str, *, timeout_ms: int = 100, guard_s: float = 10.0,
                          max_records: int | None = None) -> dict:
    """getmany bounded by `guard_s`; {} (after logging) when it times out or fails."""
    try:
        # asyncio.timeout, never wait_for: on 3.11, wait_for returns the result instead of raising when
        # the caller is cancelled just as the poll completes, so a `while True` poll loop would never stop
        async with asyncio.timeout(guard_s):
            return await consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
    except TimeoutError:
        log.warning("%s: poll did not return within %.0fs (broker unreachable?)", what, guard_s)
    except KafkaError as exc:
        log.warning("%s: poll failed: %r", what, exc)
        await asyncio.sleep(0.5)
    return {}


class FetchPacer:
    """Poll fast while records flow, slowly while a consumer is idle.

    The embedded broker answers a fetch on an empty partition only after fetch_max_wait_ms (it
    does not wake on new data), so that wait is both the hop latency and the idle cost: every
    consumer fetching every 5 ms keeps the broker about half a core busy on a 2-core host
    (bench/generate_bench.py), which is CPU the engine needs. After `idle_after_ms` without a
    record the wait becomes `idle_wait_ms`; the next record brings it back. aiokafka reads the wait
    from its fetcher for every fetch request; it has no public setter, so this sets the attribute
    (aiokafka is pinned, and tests/test_runtime_units.py fails if the attribute goes away).
    """

    def __init__(self, consumer: AIOKafkaConsumer, fast_ms: int, idle_wait_ms: int, idle_after_ms: int) -> None:
        fetcher = getattr(consumer, "_fetcher", None)
        if fetcher is None or not hasattr(fetcher, "_fetch_max_wait_ms"):
            raise RuntimeError("FetchPacer needs a started aiokafka consumer with a fetcher")
        self._fetcher = fetcher
        self.fast_ms, self.idle_wait_ms, self.idle_after_s = fast_ms, max(fast_ms, idle_wait_ms), idle_after_ms / 1000
        self._last = time.monotonic()
        self.idle = False

    def set_waits(self, fast_ms: int, idle_wait_ms: int) -> None:
        """Change both waits now (runtime/wakeup/bellpoll.py: 0 ms while a doorbell wakes the consumer)."""
        self.fast_ms, self.idle_wait_ms = fast_ms, max(fast_ms, idle_wait_ms)
        self._fetcher._fetch_max_wait_ms = self.idle_wait_ms if self.idle else self.fast_ms

    def saw(self, records: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if records:
            self._last = now
            if self.idle:
                self.idle = False
                self._fetcher._fetch_max_wait_ms = self.fast_ms
        elif not self.idle and self.idle_wait_ms > self.fast_ms and now - self._last >= self.idle_after_s:
            self.idle = True
            self._fetcher._fetch_max_wait_ms = self.idle_wait_ms
