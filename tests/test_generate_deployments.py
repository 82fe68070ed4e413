"""generate across real deployments: two vLLM OpenAI-compatible servers and a port nobody listens
on. Fallback when a deployment refuses connections or dies mid-run; the circuit breaker opens,
half-opens and closes, and its state reaches the other generate worker through `control`;
incompatible deployments are refused with their reason; a deadline too short for another attempt
returns the first error."""

from __future__ import annotations

import asyncio
import time

import jsonschema
import orjson
import pytest

from pipeline.contracts import BreakerUpdate, ControlRecord, Evidence
from pipeline.contracts.base import now_ms
from pipeline.contracts.request import (
    ChatBody,
    ChatMessage,
    RequestContext,
    ResponseFormat,
)
from pipeline.engines.vllm_server import VllmServer
from pipeline.ingress import Client
from pipeline.runtime.broker import free_port
from pipeline.runtime.codec import decode
from pipeline.runtime.launch import stage_worker
from pipeline.runtime.topics import TopicNames
from pipeline.runtime.topology import Topology
from tests.support.kafka import create_topics, read_topic, settings_for
from tests.support.waits import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

CITY_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
               "additionalProperties": False}


@pytest.fixture(scope="module")
def servers(prepared_model, tmp_path_factory):
    d = tmp_path_factory.mktemp("vllm-servers")
    pair = [VllmServer(prepared_model, cache_dir=d / "cache", log_path=d / f"{n}.log", max_num_seqs=4).spawn()
            for n in ("a", "b")]
    try:
        for s in pair:
            s.wait_ready()
        yield pair
    finally:
        for s in pair:
            s.stop()


def body(prompt: str, **kw) -> ChatBody:
    return ChatBody(messages=[ChatMessage(role="user", content=prompt)], **kw)


async def evidence_of(bootstrap: str, names: TopicNames) -> list[Evidence]:
    return [decode(r.value, Evidence) for r in await read_topic(bootstrap, names.evidence, 10**9, timeout=3)]


async def breaker_updates(bootstrap: str, names: TopicNames) -> list[BreakerUpdate]:
    recs = [decode(r.value, ControlRecord).root for r in await read_topic(bootstrap, names("control"), 10**9, timeout=3)]
    return [r for r in recs if isinstance(r, BreakerUpdate)]


def stack(tmp_path, prefix, bootstrap, deployments, policy):
    stages = [{"name": "generate", "policy": policy}, {"name": "postprocess", "policy": {"write_back": False}}]
    return settings_for(tmp_path, prefix, bootstrap, stages, deployments=deployments)


async def test_fallback_breaker_shared_and_recovery(broker, prefix, tmp_path, servers, prepared_model):
    a, b = servers
    deployments = [
        {"name": "dead", "engine": "openai", "base_url": f"http://127.0.0.1:{free_port()}/v1"},
        {"name": "A", "engine": "openai", "base_url": a.base_url, "cost_per_1k_input": 0.01, "cost_per_1k_output": 0.02},
        {"name": "B", "engine": "openai", "base_url": b.base_url, "json_schema": True},
    ]
    policy = {"prefer": ["dead", "A", "B"],
              "breaker": {"failures_to_open": 2, "window_ms": 120_000, "cooldown_ms": 3000},
              # generous: on a 2-core AVX2 host an attempt queued behind B's other 128-token requests passed
              # 30 s, and two timeouts open its breaker; this test is about connection failures (90 s, not more: a
              # deadline of 120 s still leaves room to fall back, next_step wants one attempt timeout left)
              "retry": {"attempt_timeout_ms": 90_000, "backoff_base_ms": 50, "fallback_reserve_ms": 500}}
    s = stack(tmp_path, prefix, broker.bootstrap, deployments, policy)
    s.engine.model_dir = prepared_model
    await create_topics(s)
    names = TopicNames(prefix)
    topo = Topology(s)
    gens = [stage_worker(s.model_copy(update={"worker_id": f"g{i}"}), topo, "generate", broker.bootstrap) for i in (1, 2)]
    post = stage_worker(s, topo, "postprocess", broker.bootstrap)
    for w in [*gens, post]:
        await w.start()
    stages = [w.handler.stage for w in gens]
    try:
        # a settled group first: a rebalance while the first requests are in flight hands them to the other
        # member too (at-least-once), and their attempts would be recorded twice (seen once in CI)
        def settled() -> bool:
            owned = [w.consumer.assignment() for w in gens]
            every = sum(len(w.consumer.partitions_for_topic(t) or ()) for w in gens[:1] for t in w.topics)
            return all(owned) and len(owned[0] | owned[1]) == every
        await wait_until(settled, 60, "generate group settled")
        async with Client(broker.bootstrap, topic_prefix=prefix) as client:
            # 1. `dead` refuses connections: every request falls back to A; dead's breaker opens
            first = [client.build(body=body(f"Say hello to number {i}.", max_tokens=8), tenant_id="acme",
                                  timeout_s=120) for i in range(6)]
            answers = await asyncio.gather(*(client.request(d, 120) for d in first))
            assert all(r.status == "ok" and r.deployment == "A" for r in answers), answers
            assert all(r.cost_usd > 0 for r in answers), "A is priced; the cost reaches the answer"
            # 2. breaker state travels on control: one worker's change reaches the other
            await stages[0]._record("B", False, "test")
            await stages[0]._record("B", False, "test")
            assert stages[0].breakers["B"].state == "open"
            await wait_until(lambda: stages[1].breakers["B"].state == "open", 30, "worker 2 adopts B's open breaker")
            await stages[0]._record("B", True, "test")
            await wait_until(lambda: stages[1].breakers["B"].state == "closed", 30, "worker 2 adopts B's recovery")
            await wait_until(lambda: all(st.breakers["dead"].state == "open" for st in stages), 30,
                             "both workers hold dead's breaker open")
            # 3. A dies mid-run: in-flight and later requests fall back to B; A's breaker opens
            mid = [client.build(body=body(f"Write a long story about a cat named {i}.", max_tokens=128),
                                tenant_id="acme", timeout_s=180) for i in range(6)]
            futs = await client.submit_many(mid)
            await asyncio.sleep(1.0)  # all six are in flight at A (128 tokens each, 4 at a time)
            a.kill()
            answers = [await client.wait(d.request_id, f, 180) for d, f in zip(mid, futs)]
            assert all(r.status == "ok" for r in answers), answers
            assert {r.deployment for r in answers} <= {"A", "B"} and any(r.deployment == "B" for r in answers)
            # 4. A comes back: after the cooldown one probe goes to A, succeeds, the breaker closes
            await asyncio.to_thread(a.start)
            served_by_a = None
            for i in range(40):
                r = await client.request(client.build(body=body(f"Name a color ({i}).", max_tokens=6),
                                                      tenant_id="acme", timeout_s=120), 120)
                assert r.status == "ok", r
                if r.deployment == "A":
                    served_by_a = r
                    break
                await asyncio.sleep(0.5)
            assert served_by_a is not None, "A never served again after it came back"
            # 5. incompatible deployments are refused with their reason, never attempted
            js = client.build(body=body("Return the capital of France as JSON.", max_tokens=40,
                                        response_format=ResponseFormat.model_validate(
                                            {"type": "json_schema", "json_schema": {"name": "c", "schema": CITY_SCHEMA}})),
                              tenant_id="acme", timeout_s=120)
            rj = await client.request(js, 120)
            assert rj.status == "ok" and rj.deployment == "B", rj
            jsonschema.validate(orjson.loads(rj.text), CITY_SCHEMA)
            nowhere = client.build(body=body("hello"), tenant_id="acme", timeout_s=60,
                                   context=RequestContext(residency=["mars"]))
            rn = await client.request(nowhere, 60)
            assert rn.status == "error" and rn.error_class == "no_compatible_deployment", rn
            assert "region local outside ['mars']" in (rn.reason or "")
            # 6. same seed and prompt: identical token ids and logprobs, which come back when asked
            seeded = [client.build(body=body("Tell me a fun fact.", max_tokens=12, temperature=0.9, seed=7,
                                             logprobs=True), tenant_id="acme", timeout_s=120) for _ in range(2)]
            r1, r2 = [await client.request(d, 120) for d in seeded]
            assert r1.token_ids and r1.logprobs and len(r1.logprobs) == len(r1.token_ids)
            assert r1.token_ids == r2.token_ids and r1.logprobs == r2.logprobs
    finally:
        for w in [post, *reversed(gens)]:
            await w.stop()

    ev = await evidence_of(broker.bootstrap, names)
    attempts = [e for e in ev if e.stage == "generate.attempt"]
    dead_rows = [e for e in attempts if e.candidates == ["dead"]]
    assert any(e.decision == "failed" and e.reason.startswith("connection_refused; next: fallback") for e in dead_rows)
    assert any(e.decision == "skipped" and e.reason == "circuit breaker open" for e in dead_rows), \
        "once open, the breaker spares dead further attempts"
    a_fail = {e.reason.split(";")[0] for e in attempts if e.candidates == ["A"] and e.decision == "failed"}
    assert a_fail and a_fail <= {"connection_reset", "connection_refused", "server_error"}, a_fail
    mid_ids = {d.request_id for d in mid}
    moved = [e for e in ev if e.stage == "generate" and e.request_id in mid_ids and e.scores.get("attempts", 1) > 1]
    assert moved and all(e.scores["added_latency_ms"] > 0 for e in moved), "fallbacks record what they added"
    js_rows = [e for e in attempts if e.request_id == js.request_id]
    refused = {e.candidates[0]: e.reason for e in js_rows if e.decision == "refused"}
    assert refused.get("A") == "incompatible: no JSON-schema output", refused
    assert not any(e.decision in ("failed", "ok") and e.candidates == ["A"] for e in js_rows), "never attempted"
    assert all(e.step >= 1 for e in attempts) and len({(e.request_id, e.step) for e in attempts}) == len(attempts)
    states = [(u.deployment, u.state) for u in await breaker_updates(broker.bootstrap, names)]
    a_states = [st for d, st in states if d == "A"]
    assert "open" in a_states and a_states.index("open") < len(a_states) - 1
    after_open = a_states[a_states.index("open"):]
    assert "half_open" in after_open and after_open[-1] == "closed", a_states
    assert ("dead", "open") in states


async def test_deadline_too_short_for_another_attempt_gets_the_first_error(broker, prefix, tmp_path, servers,
                                                                        prepared_model):
    a, _ = servers
    if a.proc is None or a.proc.poll() is not None:
        await asyncio.to_thread(a.start)  # the previous test kills and restarts it
    deployments = [
        {"name": "dead", "engine": "openai", "base_url": f"http://127.0.0.1:{free_port()}/v1"},
        {"name": "A", "engine": "openai", "base_url": a.base_url},
    ]
    policy = {"prefer": ["dead", "A"], "breaker": {"failures_to_open": 1000},
              "retry": {"attempt_timeout_ms": 10_000, "fallback_reserve_ms": 1000}}
    s = stack(tmp_path, prefix, broker.bootstrap, deployments, policy)
    s.engine.model_dir = prepared_model
    await create_topics(s)
    names = TopicNames(prefix)
    topo = Topology(s)
    workers = [stage_worker(s, topo, n, broker.bootstrap) for n in ("generate", "postprocess")]
    for w in workers:
        await w.start()
    try:
        async with Client(broker.bootstrap, topic_prefix=prefix) as client:
            short = client.build(body=body("Hi there", max_tokens=4), tenant_id="acme",
                                 deadline_ms=now_ms() + 4000)
            long = client.build(body=body("Hi there", max_tokens=4), tenant_id="acme", timeout_s=120)
            t0 = time.monotonic()
            rs = await client.request(short, 30)
            assert time.monotonic() - t0 < 4, "gave up at once instead of waiting for the deadline"
            rl = await client.request(long, 120)
    finally:
        for w in reversed(workers):
            await w.stop()
    assert rs.status == "error" and rs.error_class == "connection_refused", rs
    assert "cannot fit" in (rs.reason or "") and rs.deployment is None
    assert rl.status == "ok" and rl.deployment == "A", rl
    ev = await evidence_of(broker.bootstrap, names)
    short_attempts = [e for e in ev if e.request_id == short.request_id and e.stage == "generate.attempt"]
    assert [(e.candidates, e.decision) for e in short_attempts] == [(["dead"], "failed")], short_attempts
