"""Admission decisions as plain functions over one tenant's state: rolling-minute request and
token windows, in-flight holds (concurrency), and budgets with worst-case reservations settled by
the real cost on completion, for the tenant as a whole and per deployment ("lanes": the tenant's
limits on a deployment, and this admit partition's share of the deployment's global limits).
No Kafka here: the admit stage owns one TenantState per tenant (its topic is keyed by tenant, so
exactly one worker decides for a tenant) and drives these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from pipeline.config.settings import Deployment
from pipeline.config.tenants import RateLimits, TenantLimits

WINDOW_MS = 60_000
BUCKET_MS = 1_000
Action = Literal["admit", "wait", "reject"]


@dataclass
class Window:
    """Admissions over the last minute as [requests, tokens] per second. A second leaves the window
    once all of it is a minute old: never an under-count (at most one second conservative), and at
    most 61 buckets whatever the rate, so the state stays small enough to checkpoint on every change."""

    buckets: dict[int, list[int]] = field(default_factory=dict)

    def roll(self, now_ms: int) -> None:
        for sec in [s for s in self.buckets if (s + 1) * BUCKET_MS + WINDOW_MS <= now_ms]:
            del self.buckets[sec]

    def count(self) -> int:
        return sum(b[0] for b in self.buckets.values())

    def tokens(self) -> int:
        return sum(b[1] for b in self.buckets.values())

    def add(self, at_ms: int, tokens: int) -> None:
        b = self.buckets.setdefault(at_ms // BUCKET_MS, [0, 0])
        b[0] += 1
        b[1] += tokens

    def adjust_tokens(self, at_ms: int, delta: int) -> None:
        b = self.buckets.get(at_ms // BUCKET_MS)
        if b is not None:
            b[1] = max(0, b[1] + delta)

    def frees_in(self, need: int, what: int, now_ms: int) -> int:
        """Milliseconds until `need` requests (what=0) or tokens (what=1) have left the window."""
        for sec in sorted(self.buckets):
            need -= self.buckets[sec][what]
            if need <= 0:
                return (sec + 1) * BUCKET_MS + WINDOW_MS - now_ms
        return WINDOW_MS


@dataclass
class Meter:
    """What one scope (a tenant, a tenant on a deployment, a deployment share) has admitted."""

    window: Window = field(default_factory=Window)
    in_flight: set[str] = field(default_factory=set)


@dataclass
class Hold:
    """One admitted request until its completion: its slot, its tokens and its worst-case cost."""

    request_id: str
    at_ms: int
    tokens: int
    cost_usd: float
    expires_ms: int  # no completion by then: settled at the reserved (worst-case) cost
    deployment: str | None = None  # the lane it was admitted on, when deployments have limits
    attempt: int = 0  # the caller's attempt number of this request id

    @property
    def decided_key(self) -> str:
        return decided_key(self.request_id, self.attempt)


@dataclass
class TenantState:
    meter: Meter = field(default_factory=Meter)
    lanes: dict[str, Meter] = field(default_factory=dict)  # deployment -> this tenant's use of it
    holds: dict[str, Hold] = field(default_factory=dict)
    # requests (decided_key) answered recently -> when to forget them: a copy redelivered after a
    # crash (its input offset was not committed) must not be decided, answered and charged again
    settled: dict[str, int] = field(default_factory=dict)
    day: str = ""
    spent_day_usd: float = 0.0
    month: str = ""
    spent_month_usd: float = 0.0
    reserved: float = 0.0  # sum of the holds' costs, kept as they come and go (admit decides per record)
    next_expiry_ms: int = 0  # no hold expires before this: roll() scans the holds only then

    def reserved_usd(self) -> float:
        return max(0.0, self.reserved) if self.holds else 0.0

    def add_hold(self, h: Hold) -> None:
        self.holds[h.request_id] = h
        self.reserved += h.cost_usd
        self.next_expiry_ms = min(self.next_expiry_ms, h.expires_ms) if len(self.holds) > 1 else h.expires_ms

    def drop_hold(self, request_id: str) -> None:
        h = self.holds.pop(request_id, None)
        if h is not None:
            self.reserved = self.reserved - h.cost_usd if self.holds else 0.0

    def lane(self, deployment: str) -> Meter:
        return self.lanes.setdefault(deployment, Meter())


@dataclass(frozen=True)
class Lane:
    """A deployment the request may be counted against, with the limits that apply there:
    (scope, meter, limits) for the tenant's own limits on it and for the deployment's global share."""

    deployment: str
    gates: tuple[tuple[str, Meter, RateLimits], ...]


@dataclass(frozen=True)
class Ask:
    request_id: str
    tokens: int  # prompt tokens + max_tokens: the most this request can use
    cost_usd: float  # the most it can cost on any deployment it may run on
    now_ms: int
    expires_ms: int
    attempt: int = 0


def decided_key(request_id: str, attempt: int) -> str:
    """A caller's retry (attempt + 1) is a new decision; a redelivered copy (same attempt) is not."""
    return f"{request_id}/{attempt}"


@dataclass(frozen=True)
class Verdict:
    action: Action
    reason: str  # admitted | rate_limited | concurrency_limited | budget_exhausted
    detail: str
    retry_after_ms: int = 0
    remaining: dict[str, float] = field(default_factory=dict)
    deployment: str | None = None  # the lane admitted on (None: no deployment limits apply)


def _periods(now_ms: int) -> tuple[str, str]:
    d = datetime.fromtimestamp(now_ms / 1000, tz=UTC)
    return d.strftime("%Y-%m-%d"), d.strftime("%Y-%m")


def _ms_to_next_day(now_ms: int) -> int:
    return WINDOW_MS * 60 * 24 - now_ms % (WINDOW_MS * 60 * 24)


def roll(state: TenantState, now_ms: int, shares: dict[str, Meter] | None = None,
         remember_ms: int = 0) -> list[Hold]:
    """Advance the clock: age the windows, start new budget periods, and settle holds whose
    completion never came at their reserved cost. Returns those expired holds."""
    state.meter.window.roll(now_ms)
    for m in state.lanes.values():
        m.window.roll(now_ms)
    day, month = _periods(now_ms)
    if state.day != day:
        state.day, state.spent_day_usd = day, 0.0
    if state.month != month:
        state.month, state.spent_month_usd = month, 0.0
    if not state.holds or now_ms < state.next_expiry_ms:
        return []
    expired = [h for h in state.holds.values() if h.expires_ms <= now_ms]
    state.next_expiry_ms = min((h.expires_ms for h in state.holds.values() if h.expires_ms > now_ms), default=0)
    for h in expired:
        _release(state, h, shares, tokens=h.tokens, cost_usd=h.cost_usd)
        state.settled[h.decided_key] = now_ms + remember_ms
    return expired


def forget_settled(state: TenantState, now_ms: int) -> list[str]:
    """Answered requests (decided keys) old enough that no redelivery can come any more."""
    old = [rid for rid, until in state.settled.items() if until <= now_ms]
    for rid in old:
        del state.settled[rid]
    return old


def remaining(state: TenantState, limits: TenantLimits) -> dict[str, float]:
    out: dict[str, float] = {}
    if limits.rpm is not None:
        out["rpm"] = float(limits.rpm - state.meter.window.count())
    if limits.tpm is not None:
        out["tpm"] = float(limits.tpm - state.meter.window.tokens())
    if limits.concurrency is not None:
        out["concurrency"] = float(limits.concurrency - len(state.holds))
    committed = state.reserved_usd()
    if limits.daily_budget_usd is not None:
        out["daily_budget_usd"] = round(limits.daily_budget_usd - state.spent_day_usd - committed, 8)
    if limits.monthly_budget_usd is not None:
        out["monthly_budget_usd"] = round(limits.monthly_budget_usd - state.spent_month_usd - committed, 8)
    return out


Block = tuple[str, str, int]  # reason, detail, ms until it may clear


def _blocks(scope: str, meter: Meter, limits: RateLimits, ask: Ask) -> tuple[list[Block], Verdict | None]:
    """Why `meter` cannot take `ask` now (each with when it may clear); or a verdict when it never can."""
    out: list[Block] = []
    w = meter.window
    where = f" ({scope})" if scope else ""
    if limits.concurrency is not None and len(meter.in_flight) >= limits.concurrency:
        out.append(("concurrency_limited", f"{len(meter.in_flight)} in flight = limit {limits.concurrency}{where}", 1000))
    if limits.rpm is not None and w.count() >= limits.rpm:
        out.append(("rate_limited", f"{w.count()} requests in the last minute = rpm {limits.rpm}{where}",
                    w.frees_in(w.count() - limits.rpm + 1, 0, ask.now_ms)))
    if limits.tpm is not None and w.tokens() + ask.tokens > limits.tpm:
        if ask.tokens > limits.tpm:
            return out, Verdict("reject", "rate_limited", f"request of {ask.tokens} tokens > tpm {limits.tpm}{where}")
        out.append(("rate_limited", f"{w.tokens()} + {ask.tokens} tokens > tpm {limits.tpm}{where}",
                    w.frees_in(w.tokens() + ask.tokens - limits.tpm, 1, ask.now_ms)))
    return out, None


def evaluate(state: TenantState, limits: TenantLimits, ask: Ask, *, queued: int = 0,
             lanes: list[Lane] | None = None) -> Verdict:
    """May `ask` be admitted now, and on which lane (the first in preference order with room); if
    not, may it wait (a slot or window space will come, the tenant's queue has room, and its
    deadline outlasts the wait), or is it rejected? Call roll() first."""
    if ask.request_id in state.holds:
        return Verdict("admit", "admitted", "already admitted (redelivery)", remaining=remaining(state, limits),
                       deployment=state.holds[ask.request_id].deployment)
    rem = remaining(state, limits)
    committed = state.reserved_usd() + ask.cost_usd
    for name, cap, spent, retry in (("daily", limits.daily_budget_usd, state.spent_day_usd, _ms_to_next_day(ask.now_ms)),
                                    ("monthly", limits.monthly_budget_usd, state.spent_month_usd, 0)):
        if cap is not None and spent + committed > cap + 1e-12:
            return Verdict("reject", "budget_exhausted",
                           f"{name} budget: spent {spent:.6f} + reserved {committed:.6f} > {cap}",
                           retry_after_ms=retry, remaining=rem)
    blocked, never = _blocks("", state.meter, limits, ask)
    if never is not None:
        return Verdict(never.action, never.reason, never.detail, remaining=rem)
    chosen: str | None = None
    if lanes and not blocked:
        lane_blocks: list[Block] = []
        for lane in lanes:
            here: list[Block] = []
            for scope, meter, lim in lane.gates:
                b, never = _blocks(scope, meter, lim, ask)
                here += b if never is None else [(never.reason, never.detail, WINDOW_MS * 60 * 24)]
            if not here:
                chosen = lane.deployment
                break
            lane_blocks.append(max(here, key=lambda b: b[2]))
        if chosen is None:  # every lane is full: the one that clears first decides the wait
            blocked = [min(lane_blocks, key=lambda b: b[2])]
    if not blocked:
        return Verdict("admit", "admitted", "within limits", remaining=rem, deployment=chosen)
    reason, detail, wait = max(blocked, key=lambda b: b[2])
    wait = max(1, wait)
    if queued < limits.max_queue and ask.now_ms + wait < ask.expires_ms:
        return Verdict("wait", reason, detail, retry_after_ms=wait, remaining=rem)
    return Verdict("reject", reason, detail, retry_after_ms=wait, remaining=rem)


def admit(state: TenantState, ask: Ask, deployment: str | None = None,
          shares: dict[str, Meter] | None = None) -> Hold:
    if ask.request_id in state.holds:
        return state.holds[ask.request_id]
    meters = [state.meter]
    if deployment is not None:
        meters.append(state.lane(deployment))
        if shares is not None and deployment in shares:
            meters.append(shares[deployment])
    for m in meters:
        m.window.add(ask.now_ms, ask.tokens)
        m.in_flight.add(ask.request_id)
    hold = Hold(ask.request_id, ask.now_ms, ask.tokens, ask.cost_usd, ask.expires_ms, deployment, ask.attempt)
    state.add_hold(hold)
    return hold


def _release(state: TenantState, hold: Hold, shares: dict[str, Meter] | None, *, tokens: int, cost_usd: float) -> None:
    state.drop_hold(hold.request_id)
    state.spent_day_usd += cost_usd
    state.spent_month_usd += cost_usd
    meters = [state.meter]
    if hold.deployment is not None:
        meters.append(state.lane(hold.deployment))
        if shares is not None and hold.deployment in shares:
            meters.append(shares[hold.deployment])
    for m in meters:
        m.in_flight.discard(hold.request_id)
        m.window.adjust_tokens(hold.at_ms, tokens - hold.tokens)


def settle(state: TenantState, request_id: str, *, tokens: int, cost_usd: float,
           shares: dict[str, Meter] | None = None, remember_until_ms: int = 0) -> Hold | None:
    """A request finished: free its slots, charge its real cost, and count its real tokens in the
    windows instead of the reserved ones; remember it was settled until `remember_until_ms`.
    Unknown request ids (never admitted here) change nothing."""
    hold = state.holds.get(request_id)
    if hold is None:
        return None
    _release(state, hold, shares, tokens=tokens, cost_usd=cost_usd)
    if remember_until_ms:
        state.settled[hold.decided_key] = remember_until_ms
    return hold


def worst_case_cost(deployments: list[Deployment], tokens_in: int, max_tokens: int) -> float:
    """The most this request can cost: generate may fall back to any of these, so the priciest."""
    return max(((tokens_in * d.cost_per_1k_input + max_tokens * d.cost_per_1k_output) / 1000 for d in deployments),
               default=0.0)


def split_share(limit: int | None, partitions: int, p: int) -> int | None:
    """Partition p's share of a global limit; the shares sum to the limit exactly."""
    if limit is None:
        return None
    return limit // partitions + (1 if p < limit % partitions else 0)
