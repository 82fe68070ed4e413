"""Admission as pure functions: exact rolling windows, concurrency holds, worst-case budget
reservations settled by real cost, and the queue-or-reject choice."""

from __future__ import annotations

from pipeline.config.tenants import RateLimits, TenantLimits
from pipeline.stages.admit.policy import (
    Ask,
    Lane,
    Meter,
    TenantState,
    admit,
    evaluate,
    remaining,
    roll,
    settle,
    split_share,
)

T0 = 1_790_000_000_000  # some UTC instant


def ask(i: int, now: int, tokens: int = 10, cost: float = 0.0, expires: int | None = None) -> Ask:
    return Ask(f"r{i}", tokens, cost, now, expires if expires is not None else now + 30_000)


def run(state: TenantState, limits: TenantLimits, a: Ask, queued: int = 0, lanes=None, shares=None):
    roll(state, a.now_ms, shares)
    v = evaluate(state, limits, a, queued=queued, lanes=lanes)
    if v.action == "admit":
        admit(state, a, v.deployment, shares)
    return v


def test_rpm_is_exact_over_a_rolling_minute():
    s, lim = TenantState(), TenantLimits(rpm=120)
    verdicts = [run(s, lim, ask(i, T0 + i * 10)) for i in range(1000)]  # 1000 requests in 10 s
    assert sum(v.action == "admit" for v in verdicts) == 120
    rejected = next(v for v in verdicts if v.action == "reject")
    assert rejected.reason == "rate_limited" and 49_000 < rejected.retry_after_ms <= 60_000
    # the window counts whole seconds: the first second's admissions leave it once all of it is a
    # minute old (never early, at most a second late)
    assert run(s, lim, ask(5000, T0 + 60_999)).action == "reject"
    assert run(s, lim, ask(5001, T0 + 61_000)).action == "admit"


def test_concurrency_holds_free_on_completion():
    s, lim = TenantState(), TenantLimits(concurrency=2)
    assert [run(s, lim, ask(i, T0)).action for i in range(3)] == ["admit", "admit", "reject"]
    assert run(s, lim, ask(2, T0)).reason == "concurrency_limited"
    settle(s, "r0", tokens=5, cost_usd=0.0)
    assert run(s, lim, ask(3, T0 + 1)).action == "admit"
    assert settle(s, "never-admitted", tokens=1, cost_usd=1.0) is None and s.spent_day_usd == 0.0


def test_budget_reserves_worst_case_and_settles_real_cost():
    s, lim = TenantState(), TenantLimits(daily_budget_usd=1.0)
    got = [run(s, lim, ask(i, T0, cost=0.02)) for i in range(200)]  # budget covers 50 worst cases
    assert sum(v.action == "admit" for v in got) == 50
    assert {v.reason for v in got if v.action == "reject"} == {"budget_exhausted"}
    assert s.reserved_usd() <= 1.0 + 1e-9
    for i in range(50):  # each really cost half the worst case
        settle(s, f"r{i}", tokens=5, cost_usd=0.01)
    assert abs(s.spent_day_usd - 0.5) < 1e-9 and remaining(s, lim)["daily_budget_usd"] == 0.5
    assert sum(run(s, lim, ask(1000 + i, T0 + 1, cost=0.02)).action == "admit" for i in range(100)) == 25
    # the next UTC day starts from zero
    assert run(s, lim, ask(9999, T0 + 86_400_000, cost=0.02)).action == "admit"


def test_redelivered_request_is_not_counted_twice():
    s, lim = TenantState(), TenantLimits(rpm=1)
    assert run(s, lim, ask(1, T0)).action == "admit"
    again = run(s, lim, ask(1, T0 + 5))
    assert again.action == "admit" and s.meter.window.count() == 1 and len(s.holds) == 1


def test_wait_only_with_queue_room_and_deadline_budget():
    s, lim = TenantState(), TenantLimits(concurrency=1, max_queue=2)
    run(s, lim, ask(0, T0))
    assert run(s, lim, ask(1, T0), queued=0).action == "wait"
    assert run(s, lim, ask(2, T0), queued=2).action == "reject", "the queue is bounded"
    assert run(s, lim, ask(3, T0, expires=T0 + 500), queued=0).action == "reject", "the deadline cannot outlast the wait"


def test_tpm_counts_reserved_tokens_then_actual_ones():
    s, lim = TenantState(), TenantLimits(tpm=100)
    assert run(s, lim, ask(0, T0, tokens=60)).action == "admit"
    assert run(s, lim, ask(1, T0, tokens=60)).reason == "rate_limited"
    settle(s, "r0", tokens=20, cost_usd=0.0)  # it used 20 of the 60 reserved
    assert run(s, lim, ask(2, T0 + 1, tokens=60)).action == "admit"
    assert run(s, lim, ask(3, T0 + 2, tokens=500)).detail == "request of 500 tokens > tpm 100"


def test_holds_without_completion_expire_at_their_reserved_cost():
    s, lim = TenantState(), TenantLimits(concurrency=1, daily_budget_usd=1.0)
    run(s, lim, ask(0, T0, cost=0.3, expires=T0 + 1000))
    expired = roll(s, T0 + 1000)
    assert [h.request_id for h in expired] == ["r0"] and not s.holds and abs(s.spent_day_usd - 0.3) < 1e-9


def test_deployment_lanes_take_the_first_with_room_and_free_on_settle():
    """A tenant's limit on deployment `a` and a global share on `b`: requests spill from a to b,
    then wait; a completion on `a` frees a slot there (and only there)."""
    s, lim = TenantState(), TenantLimits(deployments={"a": RateLimits(concurrency=2)})
    shares = {"b": Meter()}

    def lanes():
        return [Lane("a", (("acme on a", s.lane("a"), lim.deployments["a"]),)),
                Lane("b", (("b share", shares["b"], RateLimits(rpm=1)),))]

    got = [run(s, lim, ask(i, T0 + i), lanes=lanes(), shares=shares) for i in range(4)]
    assert [(v.action, v.deployment) for v in got] == [("admit", "a"), ("admit", "a"), ("admit", "b"), ("reject", None)]
    assert got[3].reason == "concurrency_limited", "the lane that clears first (a: a slot) decides the wait"
    assert len(shares["b"].in_flight) == 1 and shares["b"].window.count() == 1
    settle(s, "r0", tokens=3, cost_usd=0.0, shares=shares)
    assert (v := run(s, lim, ask(9, T0 + 10), lanes=lanes(), shares=shares)).action == "admit" and v.deployment == "a"
    settle(s, "r2", tokens=3, cost_usd=0.0, shares=shares)
    assert not shares["b"].in_flight and shares["b"].window.count() == 1, "rpm still counts it; the slot is free"


def test_global_shares_sum_to_the_limit():
    for limit in (0, 1, 5, 6, 7, 120, 1001):
        shares = [split_share(limit, 6, p) for p in range(6)]
        assert sum(shares) == limit and max(shares) - min(shares) <= 1
    assert split_share(None, 6, 0) is None


def test_window_stays_small_at_any_rate():
    s, lim = TenantState(), TenantLimits(rpm=1_000_000)
    for i in range(20_000):  # 20k admissions over 100 s
        run(s, lim, ask(i, T0 + i * 5))
    assert len(s.meter.window.buckets) <= 61 and s.meter.window.count() <= 12_200
