"""The cheap per-tenant pre-checks in front of the expensive work (issue 35, findings 9 and 10):
the token bucket on a fake clock, its promise never to refuse what admit would take, mask refusing
an over-rate tenant before it masks, the door answering 429 for one tenant while another is served,
feedback metered at the door and in the feedback worker, and the owner lookup's bounded cost."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter

import pytest

from pipeline.config.settings import Settings, StageSpec
from pipeline.config.tenants import TenantLimits
from pipeline.contracts import RequestDoc, Status
from pipeline.contracts.feedback import Feedback, Refusal
from pipeline.registries.metering import (
    DEFAULT_FEEDBACK_RPM,
    TenantMeter,
    feedback_cost,
    feedback_rate,
    request_rate,
)
from pipeline.stages.admit.policy import Ask, TenantState, admit, evaluate, roll
from pipeline.stages.mask.pii import MaskResult
from pipeline.stores.owners import Owners
from pipeline.stores.warehouse import QueryResult
from tests.support.door import door_without_broker as _door
from tests.support.door import post as _post


class FakeClock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_a_bucket_takes_a_burst_then_refills_at_the_rate():
    clock = FakeClock()
    meter = TenantMeter(request_rate, "requests", clock=clock)
    lim = TenantLimits(rpm=6, max_queue=2)  # capacity 6 + 2 + 1 = 9, refilled at 12 a minute
    assert [meter.check("a", lim) for _ in range(9)] == [None] * 9
    over = meter.check("a", lim)
    assert over is not None and 4.9 < over.retry_after_s <= 5 and over.retry_after_header == "5"
    assert "rate of 6 requests per minute" in over.reason
    assert meter.check("b", lim) is None, "another tenant has a bucket of its own"
    clock.t += 2.5
    assert meter.check("a", lim) is not None, "half a token is not one"
    clock.t += 2.5
    assert meter.check("a", lim) is None and meter.check("a", lim) is not None
    clock.t += 3600
    assert [meter.check("a", lim) for _ in range(10)].count(None) == 9, "refilled to capacity, never beyond"
    assert all(meter.check("u", TenantLimits(rpm=None)) is None for _ in range(100)), "no rpm: no bucket"


def test_limits_changed_while_running_apply_at_once():
    clock = FakeClock()
    meter = TenantMeter(request_rate, "requests", clock=clock)
    assert [meter.check("a", TenantLimits(rpm=100)) for _ in range(5)] == [None] * 5
    # 96 tokens left, but the capacity is 2 now
    assert [meter.check("a", TenantLimits(rpm=1)) is None for _ in range(3)] == [True, True, False]
    clock.t += 3600  # refilled at the old rate; rpm 0: one reaches admit (which refuses it), then none
    assert [meter.check("a", TenantLimits(rpm=0)) is None for _ in range(3)] == [True, False, False]
    clock.t += 3600
    assert meter.check("a", TenantLimits(rpm=0)) is not None


def test_the_clock_is_the_records_creation_time_never_ahead_of_now_nor_backwards():
    clock = FakeClock()
    lim = TenantLimits(rpm=60)  # capacity 61, two a second
    meter = TenantMeter(request_rate, "requests", clock=clock)
    # a backlog worked off at once (mask restarted), created at 1.5 per second over 5 minutes: it
    # was offered within the bucket's rate, so none is refused
    start_ms = int((clock.t - 300) * 1000)
    assert all(meter.check("a", lim, start_ms + i * 667) is None for i in range(450))
    # stamps from the future refill nothing beyond now; stamps from the past refill nothing at all
    future = TenantMeter(request_rate, "requests", clock=clock)
    stamps = [int((clock.t + 3600) * 1000)] * 61 + [int((clock.t - 3600) * 1000)] * 5
    assert [future.check("a", lim, s) for s in stamps].count(None) == 61


def _through(times_ms: list[int], lim: TenantLimits, precheck: bool, follow_retry_after: bool = False):
    """Requests at these times (or one greedy client that follows Retry-After, from the first time
    for ten minutes) through the pre-check (if any), then admit's exact rolling minute: (admitted,
    passed to mask)."""
    clock = FakeClock()
    meter, state = TenantMeter(request_rate, "requests", clock=clock), TenantState()
    admitted = passed = 0
    queue, t, i = list(times_ms), times_ms[0], 0
    while (queue if not follow_retry_after else t < times_ms[0] + 600_000):
        t = queue.pop(0) if not follow_retry_after else t
        i += 1
        clock.t = t / 1000
        over = meter.check("t", lim, t) if precheck else None
        if over is not None:
            t += over.retry_after_ms
            continue
        passed += 1
        ask = Ask(f"r{i}", 10, 0.0, t, t + 60_000)
        roll(state, t)
        v = evaluate(state, lim, ask)
        if v.action == "admit":
            admit(state, ask)
            admitted += 1
        t += 10 if v.action == "admit" else (v.retry_after_ms or 1000)
    return admitted, passed


@pytest.mark.parametrize("rpm", [1, 5, 60])
def test_the_precheck_never_refuses_a_tenant_within_its_rate_nor_lowers_what_admit_gives(rpm):
    lim = TenantLimits(rpm=rpm)
    rng = random.Random(rpm)
    offered, t = [], 1_000_000
    for _ in range(3000):
        t += rng.choice([0, 0, 50, 400, 3000, 11_000, 30_000])
        offered.append(t)
    # a tenant within its rate: exactly the requests admit alone admits, sent again through both
    state, within = TenantState(), []
    for i, t in enumerate(offered):
        ask = Ask(f"r{i}", 10, 0.0, t, t + 60_000)
        roll(state, t)
        if evaluate(state, lim, ask).action == "admit":
            admit(state, ask)
            within.append(t)
    assert _through(within, lim, precheck=True) == (len(within), len(within)), "none of them refused"
    # a greedy client that follows Retry-After: admitted exactly as often as without the pre-check
    assert _through([1_000_000], lim, True, True)[0] == _through([1_000_000], lim, False, True)[0]
    # a flood, 10 a second for 10 minutes: mask works on at most a bucket plus 2 x rpm a minute
    # (not 6,000), and the flood is admitted about as often as without the pre-check
    flood = [1_000_000 + 100 * i for i in range(6000)]
    admitted, passed = _through(flood, lim, precheck=True)
    alone, _ = _through(flood, lim, precheck=False)
    assert passed <= rpm + 1 + 2 * rpm * 10 and admitted >= 0.7 * alone, (admitted, alone, passed)
    print(f"\nrpm {rpm}, a flood of 10/s for 10 minutes: admitted {admitted} (admit alone: {alone}); masked {passed}")


def test_buckets_are_bounded_when_producers_name_any_tenant():
    clock = FakeClock()
    meter = TenantMeter(request_rate, "requests", clock=clock, max_tenants=100)
    lim = TenantLimits(rpm=10)
    for i in range(1000):
        meter.check(f"t{i}", lim)
    assert len(meter._buckets) <= 100


def test_feedback_rate_and_cost():
    assert feedback_rate(TenantLimits(rpm=5)).per_minute == 5
    assert feedback_rate(TenantLimits(rpm=None)).per_minute == DEFAULT_FEEDBACK_RPM
    assert feedback_rate(TenantLimits(rpm=5, feedback_rpm=50)).capacity == 50
    assert (feedback_cost(True), feedback_cost(0.5), feedback_cost("x"), feedback_cost("x" * 8000)) == (1, 1, 1, 4)
    clock = FakeClock()
    meter = TenantMeter(feedback_rate, "feedback", clock=clock)
    lim = TenantLimits(feedback_rpm=6)
    assert meter.check("a", lim, cost=feedback_cost("x" * 8000)) is None  # 4 of 6
    assert meter.check("a", lim, cost=4) is not None
    clock.t += 60
    assert meter.check("a", lim, cost=100) is None, "a cost over the capacity takes a full bucket"
    assert TenantMeter(feedback_rate, "feedback").check("z", TenantLimits(feedback_rpm=0)) is not None


# ---- mask -------------------------------------------------------------------------------------

class CountingMasker:
    """Stands in for the masker: counts what it is asked to analyse."""

    revision = "counting"

    def __init__(self) -> None:
        self.calls = 0
        self.policy = type("P", (), {"version": "test"})()

    def mask(self, texts: list[str]) -> MaskResult:
        self.calls += 1
        return MaskResult(texts=list(texts))


def _mask_stage(tmp_path):
    from pipeline.runtime.stage import StageContext
    from pipeline.stages.mask.stage import MaskStage

    s = Settings(data_dir=tmp_path, auth={"required": False}, stages=[StageSpec(name="mask")],
                 tenants=[{"name": "slow", "limits": {"rpm": 2}}, {"name": "busy", "limits": {"rpm": 1000}}])
    stage = MaskStage(StageContext(spec=s.stage("mask"), settings=s, runtime=s.runtime))
    stage._maskers[""] = counting = CountingMasker()
    return stage, counting


def test_mask_refuses_an_over_rate_tenant_before_masking(tmp_path):
    stage, counting = _mask_stage(tmp_path)
    prompt = "x" * 32_000

    def doc(tenant: str, i: int) -> RequestDoc:
        return RequestDoc(request_id=f"{tenant}-{i}", tenant_id=tenant,
                          body={"messages": [{"role": "user", "content": prompt}]})

    slow = [stage.decide(doc("slow", i)) for i in range(10)]
    assert counting.calls == 3, "rpm 2: a burst of 3 (rpm + max_queue + 1) is masked, nothing more"
    refused = [o for o in slow if o.response is not None]
    assert len(refused) == 7 and all(o.next_stage is None for o in refused)
    for o in refused:
        r = o.response
        assert (r.status, r.error_class, r.answered_by) == (Status.rejected, "rate_limited", "mask")
        assert r.retry_after_ms and 14_000 < r.retry_after_ms <= 15_000  # rpm 2: refilled at 4 a minute
        assert (o.evidence[0].decision, o.evidence[0].reason) == ("rejected", "rate_limited: over rate before masking")
    busy = [stage.decide(doc("busy", i)) for i in range(10)]
    assert all(o.response is None for o in busy) and counting.calls == 13, "the other tenant is masked as before"


# ---- the door ---------------------------------------------------------------------------------

@pytest.mark.asyncio
async def test_the_door_answers_429_for_the_over_rate_tenant_while_another_is_served(tmp_path):
    door, keys, published = _door(tmp_path)
    chat = {"messages": [{"role": "user", "content": "hello"}]}
    slow = [await _post(door, "/v1/chat/completions", keys["slow"], chat) for _ in range(6)]
    assert [r.status_code for r in slow] == [200, 200, 200, 429, 429, 429]
    assert len(published) == 3, "nothing over the rate is published"
    r = slow[-1]
    assert r.json()["error"]["code"] == "rate_limited" and 10 <= int(r.headers["retry-after"]) <= 15
    assert r.headers["x-answered-by"] == "frontdoor"
    busy = [await _post(door, "/v1/chat/completions", keys["busy"], chat) for _ in range(20)]
    assert Counter(r.status_code for r in busy) == {200: 20} and len(published) == 23
    big = await _post(door, "/v1/chat/completions", keys["busy"],
                      {"messages": [{"role": "user", "content": "x" * 32_001}]})
    assert (big.status_code, big.json()["error"]["code"]) == (413, "too_large") and len(published) == 23


@pytest.mark.asyncio
async def test_feedback_over_the_tenants_rate_gets_429_before_the_owner_lookup(tmp_path):
    looked_up: list[str] = []

    def query(sql: str, params: dict) -> QueryResult:
        looked_up.append(params["id"])
        return QueryResult(columns=["tenant_id"], rows=[("slow",), ("busy",)])

    door, keys, published = _door(tmp_path, Owners(query, wait_s=0))
    thumbs = {"request_id": "r1", "metric": "thumbs_up", "value": True}
    slow = [await _post(door, "/v1/feedback", keys["slow"], thumbs) for _ in range(5)]
    assert [r.status_code for r in slow] == [200, 200, 429, 429, 429], [r.text for r in slow]
    assert slow[-1].json()["error"]["code"] == "rate_limited" and "retry-after" in slow[-1].headers
    assert len(looked_up) == 2 and len(published) == 2, "refused before the warehouse is asked"
    busy = [await _post(door, "/v1/feedback", keys["busy"], thumbs) for _ in range(10)]
    assert all(r.status_code == 200 for r in busy)


# ---- the feedback worker and the owner lookup -------------------------------------------------

@pytest.mark.asyncio
async def test_the_feedback_worker_meters_before_it_looks_up_or_masks(tmp_path):
    from pipeline.registries.tenants import key_hash
    from pipeline.stages.feedback.stage import FeedbackWorker

    looked_up: list[str] = []

    def query(sql: str, params: dict) -> QueryResult:
        looked_up.append(params["id"])
        return QueryResult(columns=["tenant_id"], rows=[("slow",)])

    s = Settings(data_dir=tmp_path, tenants=[{"name": "slow", "limits": {"rpm": 3},
                                              "api_keys": [{"key_sha256": key_hash("lp-slow")}]}])
    worker = FeedbackWorker(s, Owners(query, wait_s=0), "w1")
    worker._maskers[""] = counting = CountingMasker()
    fbs = [Feedback(request_id="r1", metric="comment", value="too slow", api_key="lp-slow") for _ in range(6)]
    got = [await worker._check(fb) for fb in fbs]
    refused = [g for g in got if isinstance(g, Refusal)]
    assert len(refused) == 3 and {(r.error_class, r.status) for r in refused} == {("rate_limited", 429)}
    assert len(looked_up) == 3 and counting.calls == 3


@pytest.mark.asyncio
async def test_an_unknown_target_costs_three_lookups_and_an_episode_is_looked_up_in_the_tenants_rows():
    asked: list[tuple[str, dict]] = []

    def query(sql: str, params: dict) -> QueryResult:
        asked.append((sql, params))
        return QueryResult(columns=["tenant_id"], rows=[])

    owners = Owners(query, wait_s=0.4)
    t0 = time.monotonic()
    assert await owners.check("acme", "request", "nope") == "unknown"
    assert len(asked) == 3 and 0.4 <= time.monotonic() - t0 < 1.5
    asked.clear()
    assert await owners.check("acme", "episode", "ep-1") == "unknown"
    [(sql, params)] = asked[:1]
    assert params == {"id": "ep-1", "tenant": "acme"} and "tenant_id = {tenant:String}" in sql


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    async def send(self, topic, value, **kw) -> asyncio.Future:
        self.sent.append((topic, value))
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut


@pytest.mark.asyncio
async def test_a_batch_of_unknown_targets_waits_once_not_once_per_record(tmp_path):
    """The feedback worker checks a batch together: 12 unknown targets cost one wait, not 12, and
    a tenant's feedback over its rate in the same batch is dead-lettered `rate_limited`."""
    from types import SimpleNamespace

    from aiokafka import TopicPartition

    from pipeline.registries.tenants import key_hash
    from pipeline.runtime.codec import encode
    from pipeline.runtime.handler import Item
    from pipeline.stages.feedback.stage import FeedbackWorker

    s = Settings(data_dir=tmp_path, tenants=[{"name": "acme", "limits": {"rpm": 12},
                                              "api_keys": [{"key_sha256": key_hash("lp-acme")}]}])
    worker = FeedbackWorker(s, Owners(lambda q, p: QueryResult(columns=["tenant_id"], rows=[]), wait_s=0.5), "w1")
    worker.producer = producer = FakeProducer()
    items = [Item(TopicPartition("fb", 0), SimpleNamespace(
        topic="fb", partition=0, offset=i, key=None, headers=[], timestamp=0,
        value=encode(Feedback(request_id=f"gone-{i}", metric="thumbs_up", value=True, api_key="lp-acme"))), 1)
        for i in range(15)]
    t0 = time.monotonic()
    await worker.handle(items)
    took = time.monotonic() - t0
    assert 0.5 <= took < 2.5, f"{took:.1f} s for a batch of 15 (one after another: 6 s)"
    classes = Counter(v.split(b'"error_class":"')[1].split(b'"')[0] for _, v in producer.sent)
    assert classes == {b"unknown_target": 12, b"rate_limited": 3}, classes
