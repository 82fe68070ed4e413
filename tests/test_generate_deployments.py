"""generate across deployments over real HTTP: mock upstreams (bench/mock_upstream.py, started by
tests/support/upstream.py) that answer at once, fail with a status, trickle, or die mid-answer and
come back, and a port nobody listens on. Fallback when a deployment refuses connections or dies
mid-run; retries after a 5xx until the deployment is healthy, within the attempt budget; a
non-retryable error is not retried; an answer too slow for the attempt timeout is cut off into a
fallback; the circuit breaker opens, spares the upstream, half-opens for one probe and closes, and
its state reaches the other generate worker through `control`; incompatible deployments are refused
with their reason; a deadline too short for another attempt returns the first error.

None of that needs a model. What does (vLLM's server honouring the JSON schema the openai engine
sends, and its token ids and logprobs reproducible under a seed) is the last test, on one real vLLM
server."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import ExitStack
from dataclasses import dataclass

import jsonschema
import orjson
import pytest
import pytest_asyncio

from pipeline.app.assemble import topology_for
from pipeline.app.launch import stage_worker
from pipeline.config.settings import Settings
from pipeline.contracts import BreakerUpdate, ControlRecord, Evidence, Response
from pipeline.contracts.base import now_ms
from pipeline.contracts.request import (
    ChatBody,
    ChatMessage,
    RequestContext,
    ResponseFormat,
)
from pipeline.engines.chat_engine import Generation, Sampling
from pipeline.engines.model_prep import MODEL_NAME
from pipeline.engines.openai_engine import OpenAIEngine
from pipeline.engines.vllm_server import VllmServer
from pipeline.ingress import Client
from pipeline.runtime.broker.embedded import free_port
from pipeline.runtime.codec import decode
from pipeline.runtime.topics import TopicNames
from pipeline.stages.generate.stage import GenerateStage
from tests.support.kafka import create_topics, read_topic, settings_for
from tests.support.upstream import Upstream, mock_upstream
from tests.support.waits import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

CITY_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
               "additionalProperties": False}


def body(prompt: str, **kw) -> ChatBody:
    return ChatBody(messages=[ChatMessage(role="user", content=prompt)], **kw)


def stack(tmp_path, prefix, bootstrap, deployments, policy, model_dir) -> Settings:
    stages = [{"name": "generate", "policy": policy}, {"name": "postprocess", "policy": {"write_back": False}}]
    s = settings_for(tmp_path, prefix, bootstrap, stages, deployments=deployments)
    s.engine.model_dir = model_dir  # generate counts prompt tokens with the model's tokenizer
    return s


async def stats(up: Upstream) -> dict:
    return await asyncio.to_thread(up.stats)


async def evidence_of(bootstrap: str, names: TopicNames, ids: set[str] | None = None) -> list[Evidence]:
    """Every evidence row (of `ids`, once each of them has its final `generate` row: the rows travel
    with the answer, but may be readable a moment after it)."""
    seen: list[Evidence] = []

    async def read() -> bool:
        seen[:] = [decode(r.value, Evidence) for r in await read_topic(bootstrap, names.evidence, 10**9, timeout=30,
                                                                         quiet_s=0.5)]
        return ids is None or ids <= {e.request_id for e in seen if e.stage == "generate"}

    await wait_until(read, 60, f"the generate rows of {ids}")
    return [e for e in seen if ids is None or e.request_id in ids]


async def breaker_updates(bootstrap: str, names: TopicNames) -> list[BreakerUpdate]:
    recs = [decode(r.value, ControlRecord).root
            for r in await read_topic(bootstrap, names("control"), 10**9, timeout=30, quiet_s=0.5)]
    return [r for r in recs if isinstance(r, BreakerUpdate)]


async def states_until(bootstrap: str, names: TopicNames, deployment: str,
                       done: Callable[[list[str]], bool]) -> list[BreakerUpdate]:
    """`deployment`'s breaker updates on control, once their states satisfy `done`."""
    got: list[BreakerUpdate] = []

    async def read() -> bool:
        got[:] = [u for u in await breaker_updates(bootstrap, names) if u.deployment == deployment]
        return done([u.state for u in got])

    await wait_until(read, 30, f"{deployment}'s breaker updates")
    return got


def attempts_on(rows: list[Evidence], deployment: str) -> list[tuple[str, str]]:
    """(decision, reason) of each generate.attempt row on `deployment`, in step order."""
    return [(e.decision, e.reason) for e in sorted(rows, key=lambda e: e.step)
            if e.stage == "generate.attempt" and e.candidates == [deployment]]


def final(rows: list[Evidence], request_id: str) -> Evidence:
    [row] = [e for e in rows if e.request_id == request_id and e.stage == "generate"]
    return row


# ---- two generate workers: fallback on refused and dying deployments, a breaker shared on control ----


async def test_fallback_breaker_shared_and_recovery(broker, prefix, tmp_path, prepared_model):
    with ExitStack() as ups:
        # A streams one token per 100 ms: a 128-token answer is still under way when A is killed
        a = ups.enter_context(mock_upstream("--tokens", "200", "--itl-ms", "100", log=tmp_path / "A.log"))
        b = ups.enter_context(mock_upstream("--text", orjson.dumps({"city": "Paris"}).decode(), log=tmp_path / "B.log"))
        await _fallback_breaker_shared_and_recovery(broker, prefix, tmp_path, prepared_model, a, b)


async def _fallback_breaker_shared_and_recovery(broker, prefix, tmp_path, prepared_model, a: Upstream, b: Upstream):
    deployments = [
        {"name": "dead", "engine": "openai", "base_url": f"http://127.0.0.1:{free_port()}/v1"},
        {"name": "A", "engine": "openai", "base_url": a.base_url, "cost_per_1k_input": 0.01, "cost_per_1k_output": 0.02},
        {"name": "B", "engine": "openai", "base_url": b.base_url, "json_schema": True},
    ]
    policy = {"prefer": ["dead", "A", "B"],
              "breaker": {"failures_to_open": 2, "window_ms": 120_000, "cooldown_ms": 3000},
              "retry": {"attempt_timeout_ms": 60_000, "backoff_base_ms": 50, "fallback_reserve_ms": 500}}
    s = stack(tmp_path, prefix, broker.bootstrap, deployments, policy, prepared_model)
    await create_topics(s)
    names = TopicNames(prefix)
    topo = topology_for(s)
    gens = [stage_worker(s.model_copy(update={"worker_id": f"g{i}"}), topo, "generate", broker.bootstrap) for i in (1, 2)]
    for w in gens:  # postprocess runs in generate's chain
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
            for r in answers:  # A is priced: the cost of the tokens A reported reaches the answer
                assert r.usage.completion_tokens == 8 and r.cost_usd == pytest.approx(
                    (r.usage.prompt_tokens * 0.01 + r.usage.completion_tokens * 0.02) / 1000) and r.cost_usd > 0, r
            assert (await stats(a))["requests"] == 6 and (await stats(b))["requests"] == 0
            # 2. breaker state travels on control: one worker's change reaches the other
            await stages[0]._record("B", False, "test")
            await stages[0]._record("B", False, "test")
            assert stages[0].breakers["B"].state == "open"
            await wait_until(lambda: stages[1].breakers["B"].state == "open", 30, "worker 2 adopts B's open breaker")
            await stages[0]._record("B", True, "test")
            await wait_until(lambda: stages[1].breakers["B"].state == "closed", 30, "worker 2 adopts B's recovery")
            await wait_until(lambda: all(st.breakers["dead"].state == "open" for st in stages), 30,
                             "both workers hold dead's breaker open")
            # 3. A dies mid-run: the six answers under way there fall back to B; A's breaker opens
            mid = [client.build(body=body(f"Write a long story about a cat named {i}.", max_tokens=128),
                                tenant_id="acme", timeout_s=180) for i in range(6)]
            futs = await client.submit_many(mid)

            async def all_six_at_a() -> bool:
                return (await stats(a))["in_flight"] == 6

            await wait_until(all_six_at_a, 60, "six answers streaming from A")
            a.kill()
            answers = [await client.wait(d.request_id, f, 180) for d, f in zip(mid, futs)]
            assert all(r.status == "ok" and r.deployment == "B" for r in answers), answers
            # 4. A comes back: after the cooldown one probe goes to A, succeeds, the breaker closes
            await asyncio.to_thread(a.start)
            served_by_a: list[Response] = []

            async def a_serves_again() -> bool:
                r = await client.request(client.build(body=body("Name a color.", max_tokens=6),
                                                      tenant_id="acme", timeout_s=120), 120)
                assert r.status == "ok" and r.deployment in ("A", "B"), r
                served_by_a.extend([r] if r.deployment == "A" else [])
                return bool(served_by_a)

            await wait_until(a_serves_again, 60, "A serving again after it came back", interval=0.5)
            # 5. incompatible deployments are refused with their reason, never attempted
            js = client.build(body=body("Return the capital of France as JSON.", max_tokens=40,
                                        response_format=ResponseFormat.model_validate(
                                            {"type": "json_schema", "json_schema": {"name": "c", "schema": CITY_SCHEMA}})),
                              tenant_id="acme", timeout_s=120)
            rj = await client.request(js, 120)
            assert rj.status == "ok" and rj.deployment == "B", rj
            jsonschema.validate(orjson.loads(rj.text or ""), CITY_SCHEMA)
            sent = [x for x in (await stats(b))["bodies"] if x and x.get("response_format")]
            assert [x["response_format"]["json_schema"]["schema"] for x in sent] == [CITY_SCHEMA], \
                "the caller's schema reached B, once"
            nowhere = client.build(body=body("hello"), tenant_id="acme", timeout_s=60,
                                   context=RequestContext(residency=["mars"]))
            rn = await client.request(nowhere, 60)
            assert rn.status == "error" and rn.error_class == "no_compatible_deployment", rn
            assert "region local outside ['mars']" in (rn.reason or "")
    finally:
        for w in reversed(gens):
            await w.stop()

    ev = await evidence_of(broker.bootstrap, names, {d.request_id for d in [*first, *mid, js, nowhere]})
    attempts = [e for e in ev if e.stage == "generate.attempt"]
    dead_rows = [e for e in attempts if e.candidates == ["dead"]]
    assert any(e.decision == "failed" and e.reason.startswith("connection_refused; next: fallback") for e in dead_rows)
    assert any(e.decision == "skipped" and e.reason == "circuit breaker open" for e in dead_rows), \
        "once open, the breaker spares dead further attempts"
    for d in mid:  # cut mid-stream, then answered by B
        mine = [e for e in attempts if e.request_id == d.request_id]
        at_a = attempts_on(mine, "A")
        assert len(at_a) == 1 and at_a[0][0] == "failed" and at_a[0][1].startswith("connection_reset; next: fallback"), \
            at_a
        assert attempts_on(mine, "B") == [("ok", "stop")], mine
    moved = [final(ev, d.request_id) for d in mid]
    assert all(e.scores["attempts"] >= 2 and e.scores["added_latency_ms"] > 0 and "A" in e.candidates
               for e in moved), "fallbacks record what they added"
    js_rows = [e for e in attempts if e.request_id == js.request_id]
    refused = {e.candidates[0]: e.reason for e in js_rows if e.decision == "refused"}
    assert refused.get("A") == "incompatible: no JSON-schema output", refused
    assert not any(e.decision in ("failed", "ok") and e.candidates == ["A"] for e in js_rows), "never attempted"
    assert all(e.step >= 1 for e in attempts) and len({(e.request_id, e.step) for e in attempts}) == len(attempts)
    a_states = [u.state for u in await states_until(broker.bootstrap, names, "A", lambda st: "closed" in st)]
    assert "open" in a_states and a_states.index("open") < len(a_states) - 1
    after_open = a_states[a_states.index("open"):]
    assert "half_open" in after_open and after_open[-1] == "closed", a_states
    assert "open" in [u.state for u in await breaker_updates(broker.bootstrap, names) if u.deployment == "dead"]


# ---- one generate worker, upstreams that fail in each way: one region each, so a request picks its case ----


@dataclass
class Failing:
    bootstrap: str
    names: TopicNames
    client: Client
    ups: dict[str, Upstream]
    stage: GenerateStage  # to read its breakers

    async def send(self, region: str, max_tokens: int = 4, **kw) -> Response:
        """A request that only `region`'s deployments may serve, and its answer."""
        doc = self.client.build(body=body("Hello.", max_tokens=max_tokens), tenant_id="acme",
                                context=RequestContext(residency=[region]), **{"timeout_s": 60, **kw})
        return await self.client.request(doc, 60)

    async def rows(self, *answers: Response) -> list[Evidence]:
        return await evidence_of(self.bootstrap, self.names, {r.request_id for r in answers})

    async def ask(self, region: str, **kw) -> tuple[Response, list[Evidence]]:
        r = await self.send(region, **kw)
        return r, await self.rows(r)


FAILING = {  # name: (region, mock upstream options)
    "flaky": ("r-retry", ["--fail-first", "2", "--fail-status", "503"]),
    "broken": ("r-breaker", ["--fail-first", "3", "--fail-status", "500"]),
    "strict": ("r-strict", ["--fail-first", "1", "--fail-status", "400"]),
    # one token a second: each well inside the engine's read timeout, the whole far past the attempt's
    "slow": ("r-slow", ["--tokens", "100", "--itl-ms", "1000"]),
    "spare": ("r-slow", []),
    "effect": ("r-effect", ["--tokens", "100", "--itl-ms", "1000"]),  # times out after it took the request
    "dead": ("r-deadline", None),  # nobody listens
    "healthy": ("r-deadline", []),
    "textonly": ("r-tools", []),  # preferred, but it says it does not serve tool calls
    "tooled": ("r-tools", []),
}
ATTEMPT_TIMEOUT_MS, COOLDOWN_MS = 5000, 3000


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def failing(broker, prepared_model, tmp_path_factory) -> AsyncIterator[Failing]:
    tmp = tmp_path_factory.mktemp("failing")
    prefix = f"t{uuid.uuid4().hex[:10]}."
    with ExitStack() as es:
        ups = {name: es.enter_context(mock_upstream(*args, log=tmp / f"{name}.log"))
               for name, (_, args) in FAILING.items() if args is not None}
        deployments = [{"name": name, "engine": "openai", "region": region, "tools": name != "textonly",
                        "base_url": ups[name].base_url if name in ups else f"http://127.0.0.1:{free_port()}/v1"}
                       for name, (region, _) in FAILING.items()]
        policy = {"prefer": list(FAILING),
                  "breaker": {"failures_to_open": 3, "window_ms": 60_000, "cooldown_ms": COOLDOWN_MS},
                  "retry": {"attempt_timeout_ms": ATTEMPT_TIMEOUT_MS, "backoff_base_ms": 50,
                            "fallback_reserve_ms": 1000, "max_attempts": 3},
                  "side_effect_tools": ["send_*"]}
        s = stack(tmp, prefix, broker.bootstrap, deployments, policy, prepared_model)
        await create_topics(s)
        topo = topology_for(s)
        workers = [stage_worker(s, topo, "generate", broker.bootstrap)]  # postprocess runs in its chain
        for w in workers:
            await w.start()
        try:
            async with Client(broker.bootstrap, topic_prefix=prefix) as client:
                yield Failing(broker.bootstrap, TopicNames(prefix), client, ups, workers[0].handler.stage)
        finally:
            for w in reversed(workers):
                await w.stop()


async def test_a_5xx_is_retried_on_the_same_deployment_until_it_answers(failing: Failing):
    r, rows = await failing.ask("r-retry")
    assert r.status == "ok" and r.deployment == "flaky", r
    tried = attempts_on(rows, "flaky")
    assert [d for d, _ in tried] == ["failed", "failed", "ok"], tried
    assert all(why.startswith("overloaded; next: retry") for _, why in tried[:2]), tried
    waits = [e.scores["wait_ms"] for e in rows if e.decision == "failed"]
    row = final(rows, r.request_id)
    assert row.decision == "generated" and row.scores["attempts"] == 3, row
    assert all(w > 0 for w in waits) and row.scores["added_latency_ms"] >= sum(waits), (waits, row.scores)
    up = await stats(failing.ups["flaky"])
    assert (up["requests"], up["failed"]) == (3, 2), "each retry reached the upstream"
    assert failing.stage.breakers["flaky"].state == "closed" and not failing.stage.breakers["flaky"].failures, \
        "the success forgot the failures"
    r2, rows2 = await failing.ask("r-retry")
    assert r2.status == "ok" and attempts_on(rows2, "flaky") == [("ok", "stop")] and final(rows2, r2.request_id).scores[
        "attempts"] == 1
    assert (await stats(failing.ups["flaky"]))["requests"] == 4


async def test_the_attempt_budget_ends_retries_then_the_breaker_spares_the_upstream_until_one_probe(
        failing: Failing):
    up = failing.ups["broken"]
    r = await failing.send("r-breaker")
    r2 = await failing.send("r-breaker")  # at once: well inside the cooldown
    assert r.status == "error" and r.error_class == "server_error", r
    assert "attempt budget (3) spent" in (r.reason or ""), r
    tried = attempts_on(await failing.rows(r), "broken")
    assert [d for d, _ in tried] == ["failed"] * 3 and tried[-1][1].startswith("server_error; next: give_up"), tried
    # open: a request is refused here without reaching the upstream, until the cooldown is over
    assert r2.status == "error" and r2.error_class == "all_deployments_unavailable", r2
    assert attempts_on(await failing.rows(r2), "broken") == [("skipped", "circuit breaker open")]
    assert (await stats(up))["requests"] == 3
    [opened] = await states_until(failing.bootstrap, failing.names, "broken", lambda st: bool(st))
    assert opened.state == "open"
    answers: list[Response] = []

    async def answered() -> bool:
        rn, rows_n = await failing.ask("r-breaker")
        answers.append(rn)
        if rn.status != "ok":  # still open: skipped, the upstream untouched
            assert attempts_on(rows_n, "broken") == [("skipped", "circuit breaker open")], rows_n
            assert (await stats(up))["requests"] == 3
        return rn.status == "ok"

    await wait_until(answered, 30, "broken answering after its cooldown", interval=0.3)
    assert answers[-1].deployment == "broken" and answers[-1].finished_ms - opened.opened_ms >= COOLDOWN_MS, \
        (answers[-1], opened)
    assert (await stats(up))["requests"] == 4, "one probe, which closed the breaker"
    updates = await states_until(failing.bootstrap, failing.names, "broken", lambda st: "closed" in st)
    assert [u.state for u in updates] == ["open", "half_open", "closed"], updates


async def test_a_non_retryable_error_is_answered_at_once_and_does_not_count_against_the_deployment(
        failing: Failing):
    r, rows = await failing.ask("r-strict")
    assert r.status == "error" and r.error_class == "invalid_request", r
    assert "invalid_request is not retryable" in (r.reason or ""), r
    tried = attempts_on(rows, "strict")
    assert len(tried) == 1 and tried[0][1].startswith("invalid_request; next: give_up"), tried
    assert (await stats(failing.ups["strict"]))["requests"] == 1, "never retried"
    assert failing.stage.breakers["strict"].failures == (), "the caller's error is no failure of the deployment"
    r2, _ = await failing.ask("r-strict")
    assert r2.status == "ok" and r2.deployment == "strict", r2


async def test_a_deployment_too_slow_for_the_attempt_timeout_is_cut_off_and_the_request_falls_back(
        failing: Failing):
    r, rows = await failing.ask("r-slow", max_tokens=100)
    assert r.status == "ok" and r.deployment == "spare", r
    [(decision, why)] = attempts_on(rows, "slow")
    assert decision == "failed" and why.startswith("timeout; next: fallback"), why
    slow_row = next(e for e in rows if e.candidates == ["slow"] and e.decision == "failed")
    assert ATTEMPT_TIMEOUT_MS * 0.9 <= slow_row.scores["latency_ms"] < ATTEMPT_TIMEOUT_MS * 2, slow_row.scores
    assert final(rows, r.request_id).scores["added_latency_ms"] >= ATTEMPT_TIMEOUT_MS * 0.9
    assert ((await stats(failing.ups["slow"]))["requests"], (await stats(failing.ups["spare"]))["requests"]) == (1, 1)


async def test_deadline_too_short_for_another_attempt_gets_the_first_error(failing: Failing):
    t0 = time.monotonic()
    rs, rows = await failing.ask("r-deadline", deadline_ms=now_ms() + 4000)
    assert time.monotonic() - t0 < 4, "gave up at once instead of waiting for the deadline"
    assert rs.status == "error" and rs.error_class == "connection_refused", rs
    assert "cannot fit" in (rs.reason or "") and rs.deployment is None
    assert [(e.candidates, e.decision) for e in rows if e.stage == "generate.attempt"
            and e.candidates in (["dead"], ["healthy"])] == [(["dead"], "failed")], rows
    rl, _ = await failing.ask("r-deadline")
    assert rl.status == "ok" and rl.deployment == "healthy", rl
    assert (await stats(failing.ups["healthy"]))["requests"] == 1, "the short request never reached it"


async def test_a_side_effecting_tool_request_that_timed_out_upstream_is_repeated_only_with_an_idempotency_key(
        failing: Failing):
    from pipeline.contracts.request import Tool
    from tests.support.tools import EMAIL

    async def ask(**kw) -> tuple[Response, list[Evidence]]:
        b = body("Email the team that the release slipped.", max_tokens=100).model_copy(
            update={"tools": [Tool.model_validate(EMAIL)], "tool_choice": "required"})
        doc = failing.client.build(body=b, tenant_id="acme", context=RequestContext(residency=["r-effect"]),
                                   timeout_s=60, **kw)
        r = await failing.client.request(doc, 60)
        return r, await failing.rows(r)

    r, rows = await ask()
    assert r.status == "error" and r.error_class == "timeout", r
    [(decision, why)] = attempts_on(rows, "effect")
    assert decision == "failed" and "never repeated without an idempotency key" in why, why
    assert (await stats(failing.ups["effect"]))["requests"] == 1, "not sent a second time"
    r, rows = await ask(idempotency_key="release-mail-1")
    tried = [d for d, _ in attempts_on(rows, "effect")]
    # with a key the repeats are safe: it was sent again (until the breaker, which counts the first
    # request's failure too, opened on the third)
    assert r.status == "error" and tried[:2] == ["failed", "failed"], tried
    assert (await stats(failing.ups["effect"]))["requests"] == 1 + tried.count("failed") >= 3


async def test_a_deployment_without_tool_calling_is_passed_over_for_a_tools_request_and_evidence_says_why(
        failing: Failing):
    from pipeline.contracts.request import Tool
    from tests.support.tools import WEATHER

    b = body("Is it cold in Oslo?", max_tokens=20).model_copy(update={"tools": [Tool.model_validate(WEATHER)]})
    doc = failing.client.build(body=b, tenant_id="acme", context=RequestContext(residency=["r-tools"]), timeout_s=60)
    r = await failing.client.request(doc, 60)
    rows = await failing.rows(r)
    assert r.status == "ok" and r.deployment == "tooled", r
    assert attempts_on(rows, "textonly") == [("refused", "incompatible: no tool calling")]
    assert (await stats(failing.ups["textonly"]))["requests"] == 0, "never sent to the one without tool calling"
    plain, rows = await failing.ask("r-tools")  # without tools it is the first choice again
    assert plain.status == "ok" and plain.deployment == "textonly", plain


# ---- the one check that needs a model: the openai engine against a real vLLM server ----


async def test_openai_engine_gets_schema_output_and_seeded_tokens_from_a_real_vllm_server(prepared_model, tmp_path):
    """What the mock cannot say: vLLM's server honours the response_format the engine sends, and its
    token ids and logprobs (vLLM's extensions, which rollouts and replays rely on) come back through
    the stream, the same for the same seed. The path from these into an answer is the product path's."""
    server = VllmServer(prepared_model, cache_dir=tmp_path / "cache", log_path=tmp_path / "vllm.log", max_num_seqs=4)
    await asyncio.to_thread(server.start)
    engine = await OpenAIEngine(server.base_url, MODEL_NAME).start()
    try:
        def run(prompt: str, s: Sampling) -> Awaitable[Generation]:
            return engine.generate([{"role": "user", "content": prompt}], s)

        js = await run("Return the capital of France as JSON.", Sampling(max_tokens=40, json_schema=CITY_SCHEMA))
        jsonschema.validate(orjson.loads(js.text), CITY_SCHEMA)
        seeded = Sampling(max_tokens=12, temperature=0.9, seed=7, logprobs=True)
        g1, g2 = [await run("Tell me a fun fact.", seeded) for _ in range(2)]
        assert g1.token_ids and g1.logprobs and len(g1.logprobs) == len(g1.token_ids), g1
        assert g1.token_ids == g2.token_ids and g1.logprobs == g2.logprobs
        assert g1.prompt_token_ids and g1.tokens_out == len(g1.token_ids), g1
        ranked = await run("Tell me a fun fact.", Sampling(max_tokens=6, logprobs=True, top_logprobs=2))
        assert ranked.top_logprobs is not None and len(ranked.top_logprobs) == len(ranked.token_ids), ranked
        assert all(len(alts) == 2 and alts[0][1] >= alts[1][1] for alts in ranked.top_logprobs), ranked.top_logprobs
    finally:
        await engine.stop()
        await asyncio.to_thread(server.stop)
