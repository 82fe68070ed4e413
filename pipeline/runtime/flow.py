"""Backpressure: a bounded queue that pauses consumption at the high-water mark.

The fetch loop asks `room()` before every poll and never takes more than that, so the queue can
not exceed its bound; `should_pause()` / `should_resume()` implement the watermark hysteresis.
"""

from __future__ import annotations

import asyncio
from typing import Generic, TypeVar

from pipeline.runtime.serve.metrics import StageMetrics

T = TypeVar("T")


class BoundedQueue(Generic[T]):
    def __init__(self, bound: int, high: float, low: float, metrics: StageMetrics) -> None:
        self.bound = bound
        self.high = max(1, int(bound * high))
        self.low = int(bound * low)
        self._q: asyncio.Queue[T] = asyncio.Queue(maxsize=bound)
        self._below_low = asyncio.Event()
        self.paused = False
        self.metrics = metrics
        metrics.queue_bound.set(bound)

    def qsize(self) -> int:
        return self._q.qsize()

    def room(self) -> int:
        return self.bound - self._q.qsize()

    def put(self, item: T) -> None:
        self._q.put_nowait(item)  # QueueFull here would be a runtime bug: room() was checked
        self.metrics.depth(self._q.qsize())

    async def get(self) -> T:
        item = await self._q.get()
        self._after_get()
        return item

    def get_nowait(self) -> T:
        item = self._q.get_nowait()
        self._after_get()
        return item

    def _after_get(self) -> None:
        n = self._q.qsize()
        self.metrics.depth(n)
        if self.paused and n <= self.low:
            self._below_low.set()

    def should_pause(self) -> bool:
        return not self.paused and self._q.qsize() >= self.high

    def set_paused(self, paused: bool) -> None:
        self.paused = paused
        self.metrics.paused.set(1 if paused else 0)
        if paused:
            self.metrics.pauses.inc()
            self._below_low.clear()
            if self._q.qsize() <= self.low:
                self._below_low.set()

    async def wait_below_low(self, timeout: float) -> bool:
        try:
            async with asyncio.timeout(timeout):
                await self._below_low.wait()
            return True
        except TimeoutError:
            return False

    def drain_nowait(self) -> list[T]:
        items = []
        while not self._q.empty():
            items.append(self._q.get_nowait())
        self.metrics.depth(0)
        return items
