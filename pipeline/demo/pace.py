"""The demo's pace: offer less than this host carries, so a newcomer sees the engine's latency and
not a queue's. Hosts of one class differ by 3-4x (an AVX2-only host runs the model in float32), so
the rate is measured, unless the caller names one.

Protocol:
1. Once the stack is up, send `probes` generation requests at once (distinct prompts: none can be a
   cache hit), `rounds` times; the first round warms the engine and is not counted.
2. The host's capacity is the best round's answers per second; its latency the median answer time.
3. Offer `share` of that capacity, never more than `ceiling` (the traffic's own pace), never less
   than `floor` (a demo that never ends shows nothing either).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass

import httpx

from pipeline.runtime.serve.metrics import percentile


@dataclass(frozen=True)
class Capacity:
    answers_per_s: float
    latency_p50_s: float
    probes: int


class PaceError(RuntimeError):
    pass


async def measure_capacity(client: httpx.AsyncClient, key: str, *, probes: int = 4, rounds: int = 2,
                           max_tokens: int = 40) -> Capacity:
    """Steps 1-2. `client` has the front door as its base URL."""
    best = 0.0
    latencies: list[float] = []

    async def one(i: int) -> float:
        body = {"messages": [{"role": "user", "content": f"Describe the number {i} in one sentence. "
                                                         f"({os.urandom(4).hex()})"}], "max_tokens": max_tokens}
        t0 = time.monotonic()
        r = await client.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
        if r.status_code != 200:
            raise PaceError(f"measuring this host's pace: the front door answered {r.status_code}: {r.text[:300]}")
        return time.monotonic() - t0

    for n in range(rounds):
        t0 = time.monotonic()
        times = await asyncio.gather(*(one(n * probes + i) for i in range(probes)))
        if n > 0 or rounds == 1:
            best = max(best, probes / (time.monotonic() - t0))
            latencies.extend(times)
    return Capacity(best, percentile(latencies, 50) or 0.0, probes)


async def measure_door(http_url: str, key: str) -> Capacity:
    """Steps 1-2 against the front door at `http_url` (a slow engine's answers may take minutes)."""
    async with httpx.AsyncClient(base_url=http_url, timeout=httpx.Timeout(600.0)) as client:
        return await measure_capacity(client, key)


def pick_rate(capacity: Capacity, *, share: float = 0.7, ceiling: float = 2.5, floor: float = 0.2) -> float:
    """Step 3."""
    return round(max(floor, min(ceiling, share * capacity.answers_per_s)), 2)
