"""Admission as pure functions: exact rolling windows, concurrency holds, worst-case budget
reservations settled by real cost, and the queue-or-reject choice."""

from __future__ import annotations

from pipeline.stages.admission import Ask, TenantState, admit, evaluate, remaining, roll, settle
from pipeline.stages.tenants import TenantLimits

T0 = 1_790_000_000_000  # some UTC instant


def ask(i: int, now: int, tokens: int = 10, cost: float = 0.0, expires: int | None = None) -> Ask:
    return Ask(f"r{i}", tokens, cost, now, expires if expires is not None else now + 30_000)


def run(state: TenantState, limits: TenantLimits, a: Ask, queued: int = 0):
    roll(state, a.now_ms)
    v = evaluate(state, limits, a, queued=queued)
    if v.action == "admit":
        admit(state, a)
    return v


def test_rpm_is_exact_over_a_rolling_minute():
    s, lim = TenantState(), TenantLimits(rpm=120)
    verdicts = [run(s, lim, ask(i, T0 + i * 10)) for i in range(1000)]  # 1000 requests in 10 s
    assert sum(v.action == "admit" for v in verdicts) == 120
    rejected = next(v for v in verdicts if v.action == "reject")
    assert rejected.reason == "rate_limited" and 49_000 < rejected.retry_after_ms <= 60_000
    later = run(s, lim, ask(5000, T0 + 60_001))  # the first admission left the window
    assert later.action == "admit"


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
    assert again.action == "admit" and len(s.window) == 1 and len(s.holds) == 1


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
