"""admit's state beyond one process: the `admit.state` changelog restored after kill -9,
idempotency keys (duplicates get the original's result), and deployment limits (per tenant and
global shares) on a real broker."""

from __future__ import annotations

import asyncio
import re
from collections import Counter

import pytest

from pipeline.app.assemble import topology_for
from pipeline.app.launch import stage_worker
from pipeline.contracts import Evidence
from pipeline.engines.chat_engine import chat_prompt_ids
from pipeline.engines.tokenizer import load_chat_tokenizer
from pipeline.ingress import Client
from pipeline.runtime.codec import decode
from pipeline.runtime.topics import TopicNames
from tests.support.admit import body, burst, stack
from tests.support.kafka import create_topics, read_topic
from tests.support.procs import Proc

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


async def evidence(broker, names: TopicNames) -> list[Evidence]:
    return [decode(r.value, Evidence) for r in await read_topic(broker.bootstrap, names.evidence, 10**9, timeout=3)]


async def test_kill9_of_admit_leaks_no_slot_and_counts_no_budget_twice(broker, prefix, tmp_path, prepared_model):
    """An admit worker is killed with holds in flight; their completions arrive while it is dead. The
    replacement restores the changelog before deciding: afterwards every slot is free and the budget
    used equals exactly what the requests that ran spent (no lost and no double settlement)."""
    s0 = stack(tmp_path, prefix, broker, prepared_model, [])
    tokens_in = len(chat_prompt_ids(load_chat_tokenizer(s0), [{"role": "user", "content": "Hello there"}]))
    worst = (tokens_in + 16) / 1000
    budget, limit = 30 * worst + 1e-9, 4
    s = stack(tmp_path, prefix, broker, prepared_model,
              [{"name": "steady", "limits": {"concurrency": limit, "daily_budget_usd": budget}}],
              answer="tests.stages:Spend", answer_policy={"sleep_ms": 400})
    names = TopicNames(prefix)
    await create_topics(s)
    answer = stage_worker(s, topology_for(s), "answer", broker.bootstrap)
    await answer.start()
    first = Proc("admit", s, tmp_path / "admit-a.log", env={"LLMPIPE_WORKER_ID": "admit-a"})
    second: Proc | None = None
    try:
        async with Client(broker.bootstrap, topic_prefix=prefix) as client:
            warm = client.build(body=body(), tenant_id="warmup", timeout_s=120)  # an unconfigured tenant: tenant_defaults
            await client.wait(warm.request_id, (await client.submit_many([warm]))[0], 120)
            docs, futs = [], []
            for i in range(80):  # 40/s; the worker dies after 24, while holds are in flight
                d = client.build(body=body(), tenant_id="steady", timeout_s=180)
                docs.append(d)
                futs += await client.submit_many([d])
                if i == 24:
                    first.kill9()
                    second = Proc("admit", s, tmp_path / "admit-b.log", env={"LLMPIPE_WORKER_ID": "admit-b"})
                await asyncio.sleep(0.025)
            answers = [await client.wait(d.request_id, f, 180) for d, f in zip(docs, futs)]
            by = Counter((a.status.value, a.error_class) for a in answers)
            ok = sum(a.status == "ok" for a in answers)
            assert 0 < ok <= 30 and sum(by.values()) == 80, by
            assert set(by) <= {("ok", None), ("rejected", "concurrency_limited"), ("rejected", "budget_exhausted")}, by
            await asyncio.sleep(3)  # the last completions reach admit.release
            final = client.build(body=body(), tenant_id="steady", timeout_s=60)
            await client.wait(final.request_id, (await client.submit_many([final]))[0], 60)
        assert second is not None
        restored = re.findall(r"admit restored partitions \[[\d, ]+\]: (\d+) state records", second.log.read_text())
        assert restored and int(restored[-1]) > 0, second.tail()
        rows = [e for e in await evidence(broker, names) if e.request_id == final.request_id and e.stage == "admit"]
        assert len(rows) == 1, rows
        scores = rows[0].scores
        print(f"\nkill -9 mid-load: {dict(by)}; after recovery: concurrency left {scores['concurrency']:.0f}/{limit}, "
              f"budget left {scores['daily_budget_usd']:.6f} = {budget:.6f} - {ok} x {worst:.6f}")
        assert scores["concurrency"] == limit, "a slot leaked"
        assert abs(scores["daily_budget_usd"] - (budget - ok * worst)) < 1e-6, "the budget counts a request twice or not at all"
    finally:
        for p in (first, second):
            if p is not None:
                p.stop()
        await answer.stop()


async def test_an_idempotency_key_executes_once_and_every_duplicate_gets_its_result(broker, prefix, tmp_path,
                                                                                     prepared_model):
    s = stack(tmp_path, prefix, broker, prepared_model, [{"name": "shop", "limits": {"rpm": 100}}],
              answer="tests.stages:Unique", answer_policy={"sleep_ms": 800})
    names = TopicNames(prefix)
    await create_topics(s)
    topo = topology_for(s)
    workers = [stage_worker(s, topo, "admit", broker.bootstrap), stage_worker(s, topo, "answer", broker.bootstrap)]
    await asyncio.gather(*(w.start() for w in workers))
    try:
        async with Client(broker.bootstrap, topic_prefix=prefix) as client:
            docs = [client.build(body=body("Refund order 42"), tenant_id="shop", timeout_s=60, idempotency_key="refund-42")
                    for _ in range(5)]
            futs = await client.submit_many(docs)  # all five at once
            answers = [await client.wait(d.request_id, f, 60) for d, f in zip(docs, futs)]
            later = client.build(body=body("Refund order 42"), tenant_id="shop", timeout_s=60, idempotency_key="refund-42")
            late = await client.wait(later.request_id, (await client.submit_many([later]))[0], 60)
            other = client.build(body=body("Refund order 43"), tenant_id="shop", timeout_s=60, idempotency_key="refund-43")
            fresh = await client.wait(other.request_id, (await client.submit_many([other]))[0], 60)
    finally:
        for w in reversed(workers):
            await w.stop()
    assert all(a.status == "ok" for a in answers + [late, fresh])
    assert len({a.text for a in answers + [late]}) == 1, "one execution's result for every caller"
    assert fresh.text != late.text, "another key executes"
    owners = [a for a in answers if a.duplicate_of is None]
    assert len(owners) == 1 and all(a.duplicate_of == owners[0].request_id for a in answers + [late] if a is not owners[0])
    assert {a.request_id for a in answers} == {d.request_id for d in docs}, "each caller answered under its own id"
    rows = await evidence(broker, names)
    executed = [e for e in rows if e.stage == "answer" and e.decision == "executed"]
    assert len(executed) == 2, "refund-42 once, refund-43 once"
    decisions = Counter(e.decision for e in rows if e.stage == "admit")
    assert decisions["duplicate_parked"] == 4 and decisions["duplicate_answered"] == 4, decisions
    assert decisions["duplicate_replayed"] == 1, decisions
    # the kept result is an un-masked answer: on the changelog it is sealed, never in the clear
    state = [r.value for r in await read_topic(broker.bootstrap, names("admit.state"), 10_000, timeout=5) if r.value]
    assert any(b'"response_sealed":"v1.' in v for v in state)
    assert not [v for v in state if late.text.encode() in v or b'"response":{' in v]
    # ... and a restarted admit opens it: a duplicate after the restart still gets the one result
    workers = [stage_worker(s, topo, "admit", broker.bootstrap), stage_worker(s, topo, "answer", broker.bootstrap)]
    await asyncio.gather(*(w.start() for w in workers))
    try:
        async with Client(broker.bootstrap, topic_prefix=prefix) as client:
            again = client.build(body=body("Refund order 42"), tenant_id="shop", timeout_s=60, idempotency_key="refund-42")
            restored = await client.wait(again.request_id, (await client.submit_many([again]))[0], 60)
    finally:
        for w in reversed(workers):
            await w.stop()
    assert restored.status == "ok" and restored.text == late.text and restored.duplicate_of == owners[0].request_id


async def test_deployment_limits_spill_to_the_next_deployment_and_never_fall_back_past_a_limit(
        broker, prefix, tmp_path, prepared_model):
    """Tenant limit rpm 3 on `a`; `b` has a global rpm 6, i.e. 1 per admit partition (6 partitions);
    `c` has none. Ten requests: 3 on a, 1 on b, 6 on c; fallbacks only to unlimited deployments."""
    s = stack(tmp_path, prefix, broker, prepared_model,
              [{"name": "spill", "limits": {"deployments": {"a": {"rpm": 3}}}}], answer="tests.stages:Placement",
              deployments=[{"name": "a"}, {"name": "b", "limits": {"rpm": 6}}, {"name": "c"}])
    names = TopicNames(prefix)
    _, answers = await burst(s, broker, prefix, 1, "spill", [f"p{i}" for i in range(10)])
    placed = Counter(a.text for a in answers)
    assert placed == {"a|a,c": 3, "b|b,c": 1, "c|c": 6}, placed
    rows = [e for e in await evidence(broker, names) if e.stage == "admit" and e.decision == "admitted"]
    assert Counter(e.reason for e in rows) == {"within limits on a": 3, "within limits on b": 1, "within limits on c": 6}


# ---- request ids: a replay is refused, a redelivery is not (in process, no broker) -----------------

class _Tokens:
    """A stand-in for the chat tokenizer: admit only counts the prompt's tokens."""

    class _Ids:
        def __init__(self, text: str) -> None:
            self.ids = text.split()

    class _Backend:
        def encode(self, text: str, add_special_tokens: bool = False):
            return _Tokens._Ids(text)

    backend_tokenizer = _Backend()

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, tokenize: bool = False) -> str:
        return " ".join(m["content"] for m in messages)


def _admit(tmp_path, **limits):
    from pipeline.config.settings import Settings, StageSpec
    from pipeline.runtime.stage import StageContext
    from pipeline.stages.admit.stage import AdmitStage

    s = Settings(data_dir=tmp_path, stages=[StageSpec(name="admit")],
                 tenants=[{"name": t, "limits": limits or None} for t in ("acme", "globex")])
    stage = AdmitStage(StageContext(spec=s.stage("admit"), settings=s, runtime=s.runtime))
    stage.tokenizer = _Tokens()
    return stage


def _req(rid: str, origin: str | None, tenant: str = "acme", **kw):
    from pipeline.contracts import RequestDoc
    return RequestDoc(request_id=rid, tenant_id=tenant, origin=origin,
                      body={"messages": [{"role": "user", "content": "hi there"}]}, **kw)


def _released(stage, rid: str, tenant: str = "acme"):
    from pipeline.contracts import AdmitRelease
    return stage.on_side_input("admit.release", AdmitRelease(request_id=rid, tenant_id=tenant, status="ok",
                                                             answered_by="postprocess"))


async def test_a_replayed_request_id_is_refused_and_a_redelivered_record_is_not(tmp_path):
    stage = _admit(tmp_path)
    first = await stage.process(_req("r1", "0:10"))
    assert first.response is None and first.doc.admission is not None
    # the same record again (a rebalance, a crash before commit): goes on as before, counted once
    again = await stage.process(_req("r1", "0:10"))
    assert again.response is None and not again.parked and again.doc.admission is not None
    # another record with the id while the first runs: dropped, so the caller's one answer stays its own
    replay = await stage.process(_req("r1", "3:99"))
    assert replay.parked and replay.response is None and replay.evidence[0].decision == "duplicate_dropped"
    assert replay.evidence[0].stage == "admit.replay", "the original's admit row is not replaced"
    await _released(stage, "r1")
    # once answered: a replay gets a clean refusal; a redelivery of the first record is still silent
    late = await stage.process(_req("r1", "4:7"))
    assert late.response is not None and late.response.error_class == "duplicate_request"
    assert late.response.status == "rejected" and late.doc.admission is None
    assert late.doc.tenant_id is None, "answered tenant-less: its row never replaces the original's"
    redelivered = await stage.process(_req("r1", "0:10"))
    assert redelivered.parked and redelivered.evidence[0].decision == "already_answered"
    # another tenant's id never collides; a caller's retry (attempt + 1) is a new decision
    assert (await stage.process(_req("r1", "5:1", tenant="globex"))).doc.admission is not None
    assert (await stage.process(_req("r1", "5:2", attempt=1))).doc.admission is not None
    assert [h.decided_key for h in stage.book.states["acme"].holds.values()] == ["r1/1"], "r1/0 settled, counted once"


async def test_request_ids_are_bounded_per_tenant_and_survive_a_restart(tmp_path):
    from pipeline.contracts import AdmitStateRecord
    from pipeline.runtime.codec import encode

    stage = _admit(tmp_path, max_request_ids=2)
    side = []
    for i in range(3):
        side += (await stage.process(_req(f"r{i}", f"0:{i}"))).side
    assert list(stage.replays.ids.by_tenant["acme"]) == ["r1/0", "r2/0"], "the oldest is forgotten past the cap"
    # the hold records carry the record that took each id: a restarted admit refuses the replay too
    fresh = _admit(tmp_path, max_request_ids=2)
    for rec in side:
        if rec.topic == "admit.state" and rec.value is not None:
            fresh.changelog._restore_one(0, decode(encode(rec.value), AdmitStateRecord).root)
    assert fresh.replays.ids.origin_of("acme", "r2/0") == "0:2"
    await _released(fresh, "r2")
    out = await fresh.process(_req("r2", "1:50"))
    assert out.response is not None and out.response.error_class == "duplicate_request"


async def test_idempotency_claims_are_bounded_per_tenant(tmp_path):
    from pipeline.contracts import Response, Status

    stage = _admit(tmp_path, max_idempotency_claims=2)
    for i in range(2):
        out = await stage.process(_req(f"k{i}", f"0:{i}", idempotency_key=f"key-{i}"))
        assert out.doc.admission is not None
    # both still running: a third key is refused with a clear error, not held
    full = await stage.process(_req("k2", "0:2", idempotency_key="key-2"))
    assert full.response is not None and full.response.error_class == "too_many_idempotency_keys"
    assert len(stage.keys.claims["acme"]) == 2
    # k0 finished: a new key forgets the oldest finished claim (a tombstone on the changelog)
    from pipeline.contracts import AdmitRelease
    await stage.on_side_input("admit.release", AdmitRelease(
        request_id="k0", tenant_id="acme", status="ok", answered_by="postprocess",
        response=Response(request_id="k0", tenant_id="acme", status=Status.ok, answered_by="postprocess")))
    out = await stage.process(_req("k3", "0:3", idempotency_key="key-3"))
    assert out.doc.admission is not None and len(stage.keys.claims["acme"]) == 2
    assert any(r.key and r.key.startswith(b"i/acme/") and r.value is None for r in out.side), "k0's claim dropped"
    await _released(stage, "k1")
    again = await stage.process(_req("k4", "0:4", idempotency_key="key-0"))
    assert again.response is None and again.doc.admission is not None, "a forgotten key runs afresh"
