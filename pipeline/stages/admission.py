"""Admission decisions as plain functions over one tenant's state: rolling-minute request and
token windows, in-flight holds (concurrency), and budgets with worst-case reservations settled by
the real cost on completion. No Kafka here: the admit stage owns one TenantState per tenant (its
topic is keyed by tenant, so exactly one worker decides for a tenant) and drives these.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Literal

from pipeline.stages.tenants import TenantLimits

WINDOW_MS = 60_000
Action = Literal["admit", "wait", "reject"]


@dataclass
class Hold:
    """One admitted request until its completion: its slot, its tokens and its worst-case cost."""

    request_id: str
    at_ms: int
    tokens: int
    cost_usd: float
    expires_ms: int  # no completion by then: settled at the reserved (worst-case) cost


@dataclass
class TenantState:
    window: deque[tuple[int, str, int]] = field(default_factory=deque)  # (admitted at, request_id, tokens)
    holds: dict[str, Hold] = field(default_factory=dict)
    day: str = ""
    spent_day_usd: float = 0.0
    month: str = ""
    spent_month_usd: float = 0.0

    def reserved_usd(self) -> float:
        return sum(h.cost_usd for h in self.holds.values())

    def window_tokens(self) -> int:
        return sum(t for _, _, t in self.window)


@dataclass(frozen=True)
class Ask:
    request_id: str
    tokens: int  # prompt tokens + max_tokens: the most this request can use
    cost_usd: float  # the most it can cost on any deployment it may run on
    now_ms: int
    expires_ms: int


@dataclass(frozen=True)
class Verdict:
    action: Action
    reason: str  # admitted | rate_limited | concurrency_limited | budget_exhausted
    detail: str
    retry_after_ms: int = 0
    remaining: dict[str, float] = field(default_factory=dict)


def _periods(now_ms: int) -> tuple[str, str]:
    d = datetime.fromtimestamp(now_ms / 1000, tz=timezone.utc)
    return d.strftime("%Y-%m-%d"), d.strftime("%Y-%m")


def _ms_to_next_day(now_ms: int) -> int:
    return WINDOW_MS * 60 * 24 - now_ms % (WINDOW_MS * 60 * 24)


def roll(state: TenantState, now_ms: int) -> list[Hold]:
    """Advance the clock: drop window entries older than a minute, start new budget periods, and
    settle holds whose completion never came at their reserved cost. Returns those expired holds."""
    while state.window and state.window[0][0] <= now_ms - WINDOW_MS:
        state.window.popleft()
    day, month = _periods(now_ms)
    if state.day != day:
        state.day, state.spent_day_usd = day, 0.0
    if state.month != month:
        state.month, state.spent_month_usd = month, 0.0
    expired = [h for h in state.holds.values() if h.expires_ms <= now_ms]
    for h in expired:
        del state.holds[h.request_id]
        state.spent_day_usd += h.cost_usd
        state.spent_month_usd += h.cost_usd
    return expired


def remaining(state: TenantState, limits: TenantLimits) -> dict[str, float]:
    out: dict[str, float] = {}
    if limits.rpm is not None:
        out["rpm"] = float(limits.rpm - len(state.window))
    if limits.tpm is not None:
        out["tpm"] = float(limits.tpm - state.window_tokens())
    if limits.concurrency is not None:
        out["concurrency"] = float(limits.concurrency - len(state.holds))
    committed = state.reserved_usd()
    if limits.daily_budget_usd is not None:
        out["daily_budget_usd"] = round(limits.daily_budget_usd - state.spent_day_usd - committed, 8)
    if limits.monthly_budget_usd is not None:
        out["monthly_budget_usd"] = round(limits.monthly_budget_usd - state.spent_month_usd - committed, 8)
    return out


def evaluate(state: TenantState, limits: TenantLimits, ask: Ask, *, queued: int = 0) -> Verdict:
    """May `ask` be admitted now; if not, may it wait (a slot or window space will come, the tenant's
    queue has room, and its deadline outlasts the wait), or is it rejected? Call roll() first."""
    if ask.request_id in state.holds:
        return Verdict("admit", "admitted", "already admitted (redelivery)", remaining=remaining(state, limits))
    rem = remaining(state, limits)
    committed = state.reserved_usd() + ask.cost_usd
    for name, cap, spent, retry in (("daily", limits.daily_budget_usd, state.spent_day_usd, _ms_to_next_day(ask.now_ms)),
                                    ("monthly", limits.monthly_budget_usd, state.spent_month_usd, 0)):
        if cap is not None and spent + committed > cap + 1e-12:
            return Verdict("reject", "budget_exhausted",
                           f"{name} budget: spent {spent:.6f} + reserved {committed:.6f} > {cap}",
                           retry_after_ms=retry, remaining=rem)
    blocked: list[tuple[str, str, int]] = []
    if limits.concurrency is not None and len(state.holds) >= limits.concurrency:
        blocked.append(("concurrency_limited", f"{len(state.holds)} in flight = limit {limits.concurrency}", 1000))
    if limits.rpm is not None and len(state.window) >= limits.rpm:
        wait = state.window[-limits.rpm][0] + WINDOW_MS - ask.now_ms if limits.rpm else WINDOW_MS
        blocked.append(("rate_limited", f"{len(state.window)} requests in the last minute = rpm {limits.rpm}", wait))
    if limits.tpm is not None and state.window_tokens() + ask.tokens > limits.tpm:
        if ask.tokens > limits.tpm:
            return Verdict("reject", "rate_limited", f"request of {ask.tokens} tokens > tpm {limits.tpm}",
                           retry_after_ms=0, remaining=rem)
        need, wait = state.window_tokens() + ask.tokens - limits.tpm, WINDOW_MS
        for at, _, t in state.window:
            need -= t
            if need <= 0:
                wait = at + WINDOW_MS - ask.now_ms
                break
        blocked.append(("rate_limited", f"{state.window_tokens()} + {ask.tokens} tokens > tpm {limits.tpm}", wait))
    if not blocked:
        return Verdict("admit", "admitted", "within limits", remaining=rem)
    reason, detail, wait = max(blocked, key=lambda b: b[2])
    wait = max(1, wait)
    if queued < limits.max_queue and ask.now_ms + wait < ask.expires_ms:
        return Verdict("wait", reason, detail, retry_after_ms=wait, remaining=rem)
    return Verdict("reject", reason, detail, retry_after_ms=wait, remaining=rem)


def admit(state: TenantState, ask: Ask) -> None:
    if ask.request_id in state.holds:
        return
    state.window.append((ask.now_ms, ask.request_id, ask.tokens))
    state.holds[ask.request_id] = Hold(ask.request_id, ask.now_ms, ask.tokens, ask.cost_usd, ask.expires_ms)


def settle(state: TenantState, request_id: str, *, tokens: int, cost_usd: float) -> Hold | None:
    """A request finished: free its slot, charge its real cost, and count its real tokens in the
    window instead of the reserved ones. Unknown request ids (never admitted here) change nothing."""
    hold = state.holds.pop(request_id, None)
    if hold is None:
        return None
    state.spent_day_usd += cost_usd
    state.spent_month_usd += cost_usd
    for i, (at, rid, _) in enumerate(state.window):
        if rid == request_id:
            state.window[i] = (at, rid, tokens)
            break
    return hold


def now_ms() -> int:
    return int(time.time() * 1000)
