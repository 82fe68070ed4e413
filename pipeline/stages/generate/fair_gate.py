"""Engine slots shared fairly between lanes (one lane per LoRA adapter, '' for the base model).

Without it, requests reach vLLM in arrival order and one tenant's burst on its adapter fills the
engine's batch while another adapter's short request waits behind all of it. The gate admits at
most `capacity` requests into the engine; when a slot frees it goes to the waiting lane with the
fewest tokens in flight (ties: the lane whose head has waited longest), and a lane already holding
`lane_token_budget` tokens in flight waits while any other lane has work. Within a lane: FIFO.

The last `reserve` slots only go to a lane with nothing in flight: a burst that arrives first cannot
take every slot, so another adapter's first request starts at once instead of waiting for the
burst's requests to finish (they all end at about the same time on a batched engine).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field


@dataclass
class _Waiter:
    tokens: int
    future: asyncio.Future
    since: float = field(default_factory=time.perf_counter)


class FairGate:
    def __init__(self, capacity: int, lane_token_budget: int, reserve: int = 0) -> None:
        if capacity < 1 or not 0 <= reserve < capacity:
            raise ValueError("capacity must be >= 1 and reserve in [0, capacity)")
        self.capacity = capacity
        self.lane_token_budget = lane_token_budget
        self.reserve = reserve
        self.in_flight = 0
        self.lane_tokens: dict[str, int] = {}
        self.lane_count: dict[str, int] = {}
        self.waiting: dict[str, deque[_Waiter]] = {}

    def _may_start(self, lane: str) -> bool:
        if self.in_flight >= self.capacity:
            return False
        return self.in_flight < self.capacity - self.reserve or self.lane_count.get(lane, 0) == 0

    def _next_lane(self) -> str | None:
        lanes = [lane for lane, q in self.waiting.items() if q and self._may_start(lane)]
        if not lanes:
            return None
        under = [lane for lane in lanes if self.lane_tokens.get(lane, 0) < self.lane_token_budget]
        pool = under or lanes  # every waiting lane over budget: still make progress
        return min(pool, key=lambda lane: (self.lane_tokens.get(lane, 0), self.waiting[lane][0].since))

    def _dispatch(self) -> None:
        while True:
            lane = self._next_lane()
            if lane is None:
                return
            w = self.waiting[lane].popleft()
            if w.future.done():  # cancelled while waiting
                continue
            self._take(lane, w.tokens)
            w.future.set_result(None)

    def _take(self, lane: str, tokens: int) -> None:
        self.in_flight += 1
        self.lane_tokens[lane] = self.lane_tokens.get(lane, 0) + tokens
        self.lane_count[lane] = self.lane_count.get(lane, 0) + 1

    def release(self, lane: str, tokens: int) -> None:
        self.in_flight -= 1
        self.lane_tokens[lane] = self.lane_tokens.get(lane, 0) - tokens
        self.lane_count[lane] = self.lane_count.get(lane, 0) - 1
        self._dispatch()

    async def acquire(self, lane: str, tokens: int) -> float:
        """Wait for a slot; returns the milliseconds waited."""
        t0 = time.perf_counter()
        if self._may_start(lane) and not any(self.waiting.values()):
            self._take(lane, tokens)
            return 0.0
        w = _Waiter(tokens, asyncio.get_running_loop().create_future())
        self.waiting.setdefault(lane, deque()).append(w)
        self._dispatch()
        try:
            await w.future
        except asyncio.CancelledError:
            if w.future.done() and not w.future.cancelled():  # granted, then cancelled: give it back
                self.release(lane, tokens)
            else:
                w.future.cancel()
            raise
        return (time.perf_counter() - t0) * 1000

    @asynccontextmanager
    async def slot(self, lane: str, tokens: int) -> AsyncIterator[float]:
        waited = await self.acquire(lane, tokens)
        try:
            yield waited
        finally:
            self.release(lane, tokens)
