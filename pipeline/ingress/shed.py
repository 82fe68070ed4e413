"""Overload shedding at the front door: a request that would wait longer than it may is refused at
once (503 `overloaded`, with Retry-After) instead of joining a backlog that only grows.

Protocol:
1. The door counts every request it publishes as in flight until its answer comes back (a stream:
   until its first event) or its wait ends; each answer's time joins a window of `window_s`.
2. Before publishing, it estimates the new request's time to answer by Little's law: (in flight + 1)
   over the completion rate of the window. With fewer than `min_in_flight` in flight, or fewer than
   `min_answers` answers in the window, nothing is shed: a cold or lightly loaded stack has no
   rate to trust, and a slow engine's own service time is not a backlog.
3. It refuses when that estimate exceeds the request's own time left (it could not be answered in
   time anyway), or `http.max_queue_s` when set. Retry-After is how long the backlog above that
   bound takes to drain at the measured rate, at least a second.
The bound holds the backlog near capacity x bound, so the stack keeps working at its capacity while
every caller beyond it hears at once (docs/design.md, "Ingress").
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Shed:
    reason: str
    retry_after_s: int


@dataclass
class Shedder:
    max_queue_s: float | None = None
    window_s: float = 5.0
    min_in_flight: int = 16
    min_answers: int = 10
    in_flight: int = 0
    _answered: deque[float] = field(default_factory=deque)

    def started(self) -> None:
        self.in_flight += 1

    def finished(self, now: float, answered: bool = True) -> None:
        """Step 1: a request left the door's wait; `answered`: an answer came (a timeout is no rate)."""
        self.in_flight = max(0, self.in_flight - 1)
        if answered:
            self._answered.append(now)
            self._trim(now)

    def rate(self, now: float) -> float | None:
        """Answers per second over the window; None before it holds `min_answers`."""
        self._trim(now)
        return len(self._answered) / self.window_s if len(self._answered) >= self.min_answers else None

    def check(self, now: float, time_left_s: float) -> Shed | None:
        """Steps 2-3 for a request about to be published."""
        if self.in_flight < self.min_in_flight:
            return None
        rate = self.rate(now)
        if rate is None:
            return None
        wait_s = (self.in_flight + 1) / rate
        bound = time_left_s if self.max_queue_s is None else min(time_left_s, self.max_queue_s)
        if wait_s <= bound:
            return None
        why = "its deadline" if bound == time_left_s else f"http.max_queue_s = {self.max_queue_s:g} s"
        return Shed(f"overloaded: {self.in_flight} requests ahead at {rate:.1f} answers/s, about {wait_s:.1f} s to "
                    f"an answer, beyond {why} ({bound:.1f} s)", max(1, math.ceil(wait_s - bound)))

    def _trim(self, now: float) -> None:
        while self._answered and self._answered[0] < now - self.window_s:
            self._answered.popleft()
