"""Cheap per-tenant metering in front of the expensive work (issue 35, findings 9 and 10).

admit holds the exact limits, across replicas (its topic is keyed by tenant), but it runs after
mask, cache and route: a tenant over its rpm could still make mask analyse 32k-character prompts
(1-2 s each) before admit refused them, and feedback never passed admit at all. These meters run
where work enters: the door before it publishes, mask before it masks, the feedback paths before
the owner lookup and the masking of a comment. Each is a token bucket per tenant, local to one
process: per-replica, so N replicas pass up to N times a bucket's rate; admit stays exact.

Requests: capacity rpm + max_queue + 1, refilled at RATE_FACTOR (2) x rpm per minute.
- A tenant within its rate is never refused here: admit takes at most rpm in any rolling minute and
  lets at most max_queue wait, so over any T seconds a tenant it never refuses on rpm sends at most
  rpm * ceil(T / 60) + max_queue, and the bucket passes at least rpm + max_queue + 2 * rpm * T / 60,
  more than that. The spare token absorbs the delay between creation (this clock) and admit's.
- A tenant over its rate gets about what admit alone would give it. A bucket refilled at exactly
  rpm would not: the tokens an over-rate tenant spends on requests admit then refuses (its window,
  at one-second granularity, frees just after the bucket refilled) cost it up to half its rpm
  (rpm 1: 5 of 10 admitted in 10 minutes). At 2 x rpm a client that follows Retry-After is
  admitted exactly as often as without the bucket, and random traffic at 3 x rpm within one or
  two per 10 minutes; a flood that ignores Retry-After (10 a second) loses some: 7 of 10 at rpm
  1, 46 of 50 at rpm 5, none at rpm 60 (tests/test_precheck.py).
- So mask works on at most (rpm + max_queue + 1) + 2 * rpm per minute for a tenant, per replica.
  Cache hits (never seen by admit) count here: they cost the same masking.

Feedback: `feedback_rpm`, else the tenant's rpm, else DEFAULT_FEEDBACK_RPM; a text value costs one
unit per started TEXT_UNIT_CHARS characters (it is masked like a prompt).

The clock is the record's own creation time, never ahead of now and never backwards: a backlog
mask works off after a restart is metered at the rate it was offered, and a replay at its
original pace. A producer that stamps old times only slows its own tenant.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pipeline.config.tenants import TenantLimits
from pipeline.contracts.request import ChatMessage

REQUEST_SLACK = 1  # tokens beyond rpm + max_queue: the pipeline's delay between here and admit
RATE_FACTOR = 2  # the request bucket refills at this many times rpm (see above)
DEFAULT_FEEDBACK_RPM = 600  # a tenant whose requests are unlimited still has metered feedback
TEXT_UNIT_CHARS = 2000  # a comment or demonstration costs one feedback per started 2,000 characters
MAX_TENANTS = 10_000  # buckets kept; with auth off a producer names any tenant it likes


@dataclass(frozen=True)
class Rate:
    capacity: float  # the burst a full bucket takes at once
    per_minute: float  # the refill
    limit: int  # the tenant's configured rate, as a refusal names it


def request_rate(limits: TenantLimits) -> Rate | None:
    """None: the tenant's rpm is unlimited (admit's other limits still hold)."""
    if limits.rpm is None:
        return None
    return Rate(float(limits.rpm + limits.max_queue + REQUEST_SLACK), float(RATE_FACTOR * limits.rpm), limits.rpm)


def feedback_rate(limits: TenantLimits) -> Rate:
    per_minute = limits.feedback_rpm if limits.feedback_rpm is not None else \
        limits.rpm if limits.rpm is not None else DEFAULT_FEEDBACK_RPM
    return Rate(float(per_minute), float(per_minute), per_minute)


def feedback_cost(value: object) -> float:
    """What one feedback record costs: 1, or one per started TEXT_UNIT_CHARS of text."""
    return float(max(1, math.ceil(len(value) / TEXT_UNIT_CHARS))) if isinstance(value, str) else 1.0


def prompt_size_refusal(messages: Iterable[ChatMessage], limits: TenantLimits) -> str | None:
    """A prompt larger than the tenant's max_prompt_chars, refused before any recogniser runs."""
    limit = limits.max_prompt_chars
    n = sum(len(m.content) for m in messages)
    return f"prompt of {n} characters > {limit}" if n > limit else None


@dataclass
class TokenBucket:
    capacity: float
    per_s: float
    tokens: float
    at: float  # the clock reading of the last refill

    def refill(self, now: float) -> None:
        if now > self.at:
            self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.per_s)
            self.at = now

    def take(self, now: float, cost: float = 1.0) -> float | None:
        """Take `cost` tokens (at most a full bucket's): None when taken, else the seconds until
        they will be there; nothing is taken then."""
        self.refill(now)
        if self.capacity <= 0:  # a rate of 0: nothing, ever
            return 60.0
        cost = min(cost, self.capacity)
        if self.tokens >= cost:
            self.tokens -= cost
            return None
        return (cost - self.tokens) / self.per_s if self.per_s > 0 else 60.0

    def full_at(self, now: float) -> bool:
        return self.tokens + max(0.0, now - self.at) * self.per_s >= self.capacity


@dataclass(frozen=True)
class OverRate:
    retry_after_s: float
    reason: str

    @property
    def retry_after_ms(self) -> int:
        return max(1, math.ceil(self.retry_after_s * 1000))

    @property
    def retry_after_header(self) -> str:
        return str(max(1, math.ceil(self.retry_after_s)))


class TenantMeter:
    """A token bucket per tenant for one kind of work; thread-safe (mask decides in threads)."""

    def __init__(self, rate: Callable[[TenantLimits], Rate | None], what: str,
                 clock: Callable[[], float] = time.time, max_tenants: int = MAX_TENANTS) -> None:
        self.rate = rate
        self.what = what  # "requests" | "feedback": how a refusal names the work
        self.clock = clock
        self.max_tenants = max_tenants
        self._buckets: dict[str, TokenBucket] = {}
        self._lock = threading.Lock()

    def check(self, tenant: str, limits: TenantLimits, created_ms: int | None = None,
              cost: float = 1.0) -> OverRate | None:
        """None: within the tenant's rate (the cost is taken); else how long to wait."""
        rate = self.rate(limits)
        if rate is None:
            return None
        now = self.clock()
        stamp = now if created_ms is None else min(now, created_ms / 1000)
        with self._lock:
            b = self._buckets.get(tenant)
            if b is None:
                self._prune(now)
                b = self._buckets[tenant] = TokenBucket(rate.capacity, rate.per_minute / 60, rate.capacity, stamp)
            at = max(stamp, b.at)
            b.refill(at)  # at the rate that held until now; the limits may have changed since
            b.capacity, b.per_s = rate.capacity, rate.per_minute / 60
            b.tokens = min(b.tokens, b.capacity)
            wait = b.take(at, cost)
        if wait is None:
            return None
        return OverRate(wait, f"over the tenant's rate of {rate.limit} {self.what} per minute "
                              f"(checked before any work); retry in {math.ceil(wait)} s")

    def _prune(self, now: float) -> None:
        """Keep at most max_tenants buckets: a full one is the same as none; then the stalest go."""
        if len(self._buckets) < self.max_tenants:
            return
        for t in [t for t, b in self._buckets.items() if b.full_at(now)]:
            del self._buckets[t]
        if len(self._buckets) >= self.max_tenants:
            stalest = sorted(self._buckets, key=lambda t: self._buckets[t].at)
            for t in stalest[: len(stalest) // 2 + 1]:
                del self._buckets[t]
