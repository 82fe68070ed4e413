"""Deployment compatibility, the retry budget and the circuit breaker: pure policy, no engine."""

from __future__ import annotations

from pipeline.stages.generate.config import BreakerPolicy, RetryPolicy
from pipeline.stages.generate.deployments import (
    Breaker,
    Deployment,
    Needs,
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
    refused = next_step("connection_refused", request_id="r", attempt=1, remaining_ms=60_000, has_fallback=False,
                        side_effects=True, idempotency_key=None, p=p)
    assert refused.action == "retry"  # it never reached the upstream: nothing can have happened twice


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


# ---- generate's use of the policy (no engine, no broker) ---------------------------------------

def _generate_stage(**policy):
    from pipeline.config.settings import Settings, StageSpec
    from pipeline.runtime.stage import StageContext
    from pipeline.stages.generate.stage import GenerateStage

    s = Settings(stages=[StageSpec(name="generate", policy=policy)],
                 deployments=[{"name": "local-vllm"}, {"name": "remote", "engine": "openai", "base_url": "http://x/v1"}])
    return GenerateStage(StageContext(spec=s.stage("generate"), settings=s, runtime=s.runtime))


def test_breaker_updates_from_other_workers_are_adopted_and_own_echoes_ignored():
    from pipeline.contracts import BreakerUpdate

    st = _generate_stage()
    st.apply_control(BreakerUpdate(deployment="remote", state="open", opened_ms=1000, worker="other"))
    assert st.breakers["remote"].state == "open" and st.breakers["remote"].opened_ms == 1000
    # another worker probing: this one counts it as open from the probe's time, so it does not probe too
    st.apply_control(BreakerUpdate(deployment="remote", state="half_open", opened_ms=1000, worker="other", at_ms=5000))
    assert st.breakers["remote"].state == "open" and st.breakers["remote"].opened_ms == 5000
    st.apply_control(BreakerUpdate(deployment="remote", state="closed", worker=st.member))
    assert st.breakers["remote"].state == "open", "its own update is already applied locally"
    st.apply_control(BreakerUpdate(deployment="remote", state="closed", worker="other"))
    assert st.breakers["remote"].state == "closed"
    st.apply_control(BreakerUpdate(deployment="unknown", state="open", worker="other"))
    assert "unknown" not in st.breakers


def test_needs_and_sampling_follow_the_request():
    from pipeline.contracts import RequestDoc
    from pipeline.contracts.request import (
        ChatBody,
        ChatMessage,
        RequestContext,
        ResponseFormat,
    )
    from pipeline.stages.generate.attempts import needs_for, sampling_for

    st = _generate_stage(default_max_tokens=64, max_tokens_cap=100)
    rf = ResponseFormat.model_validate({"type": "json_schema", "json_schema": {"schema": {"type": "object"}}})
    doc = RequestDoc(request_id="r", body=ChatBody(messages=[ChatMessage(role="user", content="hi")], max_tokens=500,
                                                   response_format=rf, images=["https://x/y.png"]),
                     context=RequestContext(residency=["kr"], max_cost_usd=0.01))
    s = sampling_for(doc, st.policy)
    assert s.max_tokens == 100 and s.json_schema == {"type": "object"} and s.temperature == 0.0
    n = needs_for(doc, 30, s)
    assert n.context_tokens == 30 and n.expected_output_tokens == 100 and n.images and n.json_schema
    assert n.regions == frozenset({"kr"}) and n.max_cost_usd == 0.01
    plain = RequestDoc(request_id="r2", body=ChatBody(messages=[ChatMessage(role="user", content="hi")]))
    assert sampling_for(plain, st.policy).max_tokens == 64 and sampling_for(plain, st.policy).json_schema is None


def test_http_failures_map_to_retryable_or_not():
    from pipeline.engines.openai_engine import _status_class
    from pipeline.stages.generate.deployments import NON_RETRYABLE, RETRYABLE

    cases = {(400, "max_tokens=5000 cannot be greater than max_model_len=2048"): "context_too_long",
             (400, "bad field"): "invalid_request", (401, ""): "unauthorized", (429, ""): "overloaded",
             (503, ""): "overloaded", (500, ""): "server_error", (404, "model not found"): "invalid_request"}
    for (status, msg), want in cases.items():
        got = _status_class(status, msg)
        assert got == want, (status, msg, got)
        assert got in RETRYABLE | NON_RETRYABLE


def test_example_configs_validate_with_their_stage_policies(monkeypatch):
    from pathlib import Path

    from pipeline.app.assemble import topology_for
    from pipeline.config.settings import load_settings

    monkeypatch.delenv("LLMPIPE_CONFIG", raising=False)  # load_settings sets it; undone after the test
    root = Path(__file__).resolve().parents[1]
    for path in sorted((root / "examples").glob("*.yaml")):
        s = load_settings(path)
        topo = topology_for(s)
        for spec in s.stages:
            cls = topo.stage_class(spec.name)
            if cls.policy_model is not None:
                cls.policy_model.model_validate(spec.policy)
        assert s.deployments, path
