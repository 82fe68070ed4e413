"""Deployment compatibility, the retry budget and the circuit breaker: pure policy, no engine."""

from __future__ import annotations

from pipeline.stages.deployments import (
    Breaker,
    BreakerPolicy,
    Deployment,
    Needs,
    RetryPolicy,
    backoff_ms,
    breaker_allows,
    breaker_record,
    candidates,
    next_step,
)

SMALL = Deployment(name="local", model="small", max_context=2048, region="kr")
BIG = Deployment(name="cloud", model="large", max_context=32_768, images=True, json_schema=True, region="us",
                 cost_per_1k_input=0.5, cost_per_1k_output=1.5)


def test_incompatible_fallbacks_are_refused_with_reasons():
    ok, refused = candidates([SMALL, BIG], ["local", "cloud"], Needs(context_tokens=3000))
    assert [d.name for d in ok] == ["cloud"] and refused["local"].startswith("context")
    ok, refused = candidates([SMALL, BIG], ["cloud", "local"], Needs(context_tokens=100, regions=frozenset({"kr"})))
    assert [d.name for d in ok] == ["local"] and "region us" in refused["cloud"]
    ok, refused = candidates([SMALL, BIG], ["local"], Needs(context_tokens=100, images=True))
    assert [d.name for d in ok] == ["cloud"] and refused["local"] == "no image support"
    ok, refused = candidates([SMALL, BIG], ["cloud"], Needs(context_tokens=1000, max_cost_usd=0.0001))
    assert [d.name for d in ok] == ["local"] and "cost" in refused["cloud"]
    ok, refused = candidates([SMALL], ["nope", "local"], Needs(context_tokens=10))
    assert refused["nope"] == "unknown deployment" and [d.name for d in ok] == ["local"]


def test_retry_only_within_the_deadline_budget():
    p = RetryPolicy(attempt_timeout_ms=1000, backoff_base_ms=100, fallback_reserve_ms=500)
    kw = dict(request_id="r", side_effects=False, idempotency_key=None, p=p)
    assert next_step("timeout", attempt=1, remaining_ms=5000, has_fallback=False, **kw).action == "retry"
    tight = next_step("timeout", attempt=1, remaining_ms=900, has_fallback=False, **kw)
    assert tight.action == "give_up" and "cannot fit" in tight.reason
    assert next_step("context_too_long", attempt=1, remaining_ms=60_000, has_fallback=True, **kw).action == "give_up"
    assert next_step("connection_refused", attempt=1, remaining_ms=5000, has_fallback=True, **kw).action == "fallback"
    assert next_step("timeout", attempt=3, remaining_ms=60_000, has_fallback=False, **kw).action == "give_up"


def test_side_effects_need_an_idempotency_key():
    p = RetryPolicy()
    no_key = next_step("timeout", request_id="r", attempt=1, remaining_ms=60_000, has_fallback=False,
                       side_effects=True, idempotency_key=None, p=p)
    assert no_key.action == "give_up" and "idempotency" in no_key.reason
    keyed = next_step("timeout", request_id="r", attempt=1, remaining_ms=60_000, has_fallback=False,
                      side_effects=True, idempotency_key="k1", p=p)
    assert keyed.action == "retry"


def test_backoff_is_jittered_bounded_and_replayable():
    p = RetryPolicy(backoff_base_ms=200, backoff_max_ms=1000)
    assert backoff_ms("r1", 1, p) == backoff_ms("r1", 1, p)
    assert 100 <= backoff_ms("r1", 1, p) <= 200 and 500 <= backoff_ms("r1", 5, p) <= 1000
    assert len({backoff_ms(f"r{i}", 2, p) for i in range(20)}) > 5


def test_breaker_opens_half_opens_with_one_probe_and_closes():
    p = BreakerPolicy(failures_to_open=3, window_ms=10_000, cooldown_ms=5_000)
    b = Breaker()
    for t in (0, 1000, 2000):
        allowed, b = breaker_allows(b, t, p)
        assert allowed
        b = breaker_record(b, ok=False, now_ms=t, p=p)
    assert b.state == "open"
    assert breaker_allows(b, 3000, p)[0] is False
    allowed, b = breaker_allows(b, 7000, p)
    assert allowed and b.state == "half_open"
    assert breaker_allows(b, 7001, p)[0] is False, "one probe at a time"
    b = breaker_record(b, ok=False, now_ms=7500, p=p)
    assert b.state == "open" and b.opened_ms == 7500
    allowed, b = breaker_allows(b, 12_600, p)
    assert allowed and b.state == "half_open"
    b = breaker_record(b, ok=True, now_ms=12_700, p=p)
    assert b == Breaker()


def test_old_failures_leave_the_window():
    p = BreakerPolicy(failures_to_open=3, window_ms=1_000)
    b = Breaker()
    for t in (0, 600, 1_300, 2_000):
        b = breaker_record(b, ok=False, now_ms=t, p=p)
    assert b.state == "closed" and len(b.failures) == 2
