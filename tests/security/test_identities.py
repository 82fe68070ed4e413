"""Identities are the tenant's (issue 35, findings 5, 6 and 7): ids chosen by callers never let one
tenant replace another's rows, take another's answers or deltas, or cancel another's request.

Units first (the door's matching, the cancel watch, mask's refusals), then exploit attempts
against the running review stack. The warehouse keys themselves are tested in chDB in
tests/test_warehouse.py.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from pathlib import Path

import httpx
import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from pipeline.config.tenants import TenantSpec
from pipeline.contracts import Cancel, Delta, RequestDoc, Response, Status
from pipeline.contracts.request import ChatBody, ChatMessage
from pipeline.ingress.client import Client
from pipeline.ingress.stream_follow import Ended, Piece
from pipeline.registries.tenants import TenantRegistry, key_hash, new_api_key
from pipeline.runtime.codec import encode
from pipeline.runtime.follow.cancels import CancelWatch
from pipeline.stages.mask.auth import authenticate

pytestmark = pytest.mark.integration

BODY = ChatBody(messages=[ChatMessage(role="user", content="hi")])


# ---- the door takes answers and deltas from the tenant it sent as (finding 6) -------------------

class _Producer:
    """Takes every record (the client under test publishes; nothing reads them)."""

    async def send_and_wait(self, *a, **kw) -> None:
        return None


def _client() -> Client:
    c = Client("127.0.0.1:1")  # never started: the tests feed its reader's delivery functions
    c.producer, c.reply_partition, c.streams_on = _Producer(), 0, True  # type: ignore[assignment]
    return c


def _answer(rid: str, tenant: str | None, status: Status = Status.ok, text: str = "an answer", **kw) -> bytes:
    return encode(Response(request_id=rid, tenant_id=tenant, status=status, answered_by="postprocess",
                           text=text if status == Status.ok else None, **kw))


async def test_the_door_drops_an_answer_of_another_tenant_for_a_pending_id():
    c = _client()
    doc = c.build(body=BODY, tenant_id="acme")
    fut = await c.submit(doc)
    c._deliver(_answer(doc.request_id, "globex"))  # another tenant's request that reused the id
    c._deliver(_answer(doc.request_id, None))  # an ok answer must name its tenant
    assert not fut.done() and c.foreign == 2
    c._deliver(_answer(doc.request_id, "acme"))
    assert fut.done() and fut.result().tenant_id == "acme"


async def test_an_error_without_a_tenant_ends_the_request_and_no_tenant_claimed_takes_any():
    c = _client()
    doc = c.build(body=BODY, tenant_id="acme")
    fut = await c.submit(doc)
    # refused before mask knew who sent it (a revoked key): no tenant, no text
    c._deliver(_answer(doc.request_id, None, Status.rejected, error_class="unauthenticated"))
    assert fut.done() and fut.result().error_class == "unauthenticated" and c.foreign == 0
    anyone = c.build(body=BODY)  # a Kafka producer known by its key alone: the key decides the tenant
    fut = await c.submit(anyone)
    c._deliver(_answer(anyone.request_id, "globex"))
    assert fut.done() and fut.result().tenant_id == "globex"


async def test_a_stream_shows_no_delta_of_another_tenant():
    c = _client()
    doc = c.build(body=BODY, tenant_id="acme")
    got: list[Piece | Ended] = []

    async def follow() -> None:
        async for ev in c.stream(doc, timeout_s=10):
            got.append(ev)

    task = asyncio.create_task(follow())
    while doc.request_id not in c._streams:  # the stream is open (it registers before publishing)
        await asyncio.sleep(0.001)
    for tenant, text in (("globex", "forged "), ("acme", "mine")):
        c._deliver_delta(encode(Delta(request_id=doc.request_id, tenant_id=tenant, attempt="w:1",
                                      seq=0, text=text)))
    c._deliver(_answer(doc.request_id, "acme", text="mine", finish_reason="stop"))
    await asyncio.wait_for(task, 10)
    shown = "".join(ev.text for ev in got if isinstance(ev, Piece))
    assert "forged" not in shown and shown.startswith("mine"), got
    assert c.foreign == 1


# ---- mask: a refusal carries no claimed tenant (finding 6) ------------------------------------

def test_a_refused_request_keeps_no_claimed_tenant():
    alice, bob = new_api_key(), new_api_key()
    reg = TenantRegistry([TenantSpec(name="acme", api_keys=[{"key_sha256": key_hash(alice), "principal": "alice"}]),
                          TenantSpec(name="globex", api_keys=[{"key_sha256": key_hash(bob), "principal": "bob"}])])
    for claim in ({"api_key": bob}, {"api_key": "sk-unknown"}, {}, {"caller_assertion": "forged"}):
        d = RequestDoc(request_id="r1", tenant_id="acme", body=BODY, **claim)
        out, refused, _ = authenticate(d, reg, required=True)
        assert refused == "unauthenticated" and out.tenant_id is None, (claim, out.tenant_id)


# ---- cancels: only the request's sender can withdraw it (finding 7) ---------------------------

def test_a_cancel_applies_only_with_the_senders_secret():
    sender, other = _client(), _client()
    doc = sender.build(body=BODY, request_id="req-1", tenant_id="globex")
    watch = CancelWatch("127.0.0.1:1", "cancel")
    fired: list[Cancel] = []
    unwatch = watch.watch(doc, fired.append)
    for forged in (Cancel(request_id="req-1"),  # no secret
                   Cancel(request_id="req-1", secret=other.cancel_secret("req-1")),  # another sender's
                   Cancel(request_id="req-1", secret="x" * 64)):
        watch.apply(forged)
    assert watch.cancelled(doc) is None and not fired and watch.unsigned == 1
    assert watch.cancelled(doc.model_copy(update={"cancel_digest": None})) is None  # no digest: nobody can
    watch.apply(Cancel(request_id="req-1", reason="caller", secret=sender.cancel_secret("req-1")))
    assert watch.cancelled(doc) is not None and [c.reason for c in fired] == ["caller"]
    unwatch()


# ---- against the running stack -----------------------------------------------------------------

def _feedback(stack, who: str, body: dict) -> httpx.Response:
    return httpx.post(stack.http_url + "/v1/feedback", json=body, timeout=30,
                      headers={"authorization": f"Bearer {stack.keys[who]}"})


def test_two_tenants_feedback_with_one_feedback_id_are_both_kept(review_stack):
    s = review_stack
    rid = {}
    for who in ("alice", "bob"):
        r = s.chat(who, f"identities feedback {who}")
        assert r.status_code == 200, r.text
        rid[who] = r.headers["x-request-id"]
    fb_id = f"fb-{uuid.uuid4().hex[:8]}"
    for who, value in (("alice", True), ("bob", False)):  # bob second: under the old key his row won
        r = _feedback(s, who, {"feedback_id": fb_id, "request_id": rid[who], "metric": "thumbs_up", "value": value})
        assert r.status_code == 200 and r.json()["feedback_id"] == fb_id, r.text
    rows = s.rows_when(f"SELECT tenant_id, request_id, value_float FROM feedback FINAL WHERE feedback_id = '{fb_id}' "
                       "ORDER BY tenant_id", lambda rows: len(rows) >= 2 or any(r[0] == "globex" for r in rows))
    assert rows == [["acme", rid["alice"], 1.0], ["globex", rid["bob"], 0.0]], rows
    assert s.chat("alice", "still serving after the feedback").status_code == 200


async def _kafka_request(stack, key: str, request_id: str, tenant: str | None = None) -> Response:
    async with Client(stack.info["bootstrap"], topic_prefix=stack.info["topic_prefix"]) as c:
        return await c.request(c.build("identities: reusing an id", request_id=request_id, api_key=key,
                                       tenant_id=tenant), timeout_s=60)


def test_a_kafka_request_reusing_another_tenants_id_replaces_none_of_its_rows(review_stack):
    s = review_stack
    r = s.chat("alice", "identities: alice's own request")
    assert r.status_code == 200, r.text
    rid = r.headers["x-request-id"]
    q = f"SELECT tenant_id, status FROM requests FINAL WHERE request_id = '{rid}' ORDER BY tenant_id"
    assert s.rows_when(q, lambda rows: ["acme", "ok"] in rows) == [["acme", "ok"]]
    # bob reuses the id: as himself (answered as globex), and claiming acme with his key (refused
    # before any tenant is verified: no tenant)
    as_bob = asyncio.run(_kafka_request(s, s.keys["bob"], rid))
    claimed = asyncio.run(_kafka_request(s, s.keys["bob"], rid, tenant="acme"))
    assert as_bob.tenant_id == "globex", as_bob
    assert claimed.status == "rejected" and claimed.error_class == "unauthenticated" and claimed.tenant_id is None
    tenants = {"acme", "globex", ""}
    rows = s.rows_when(q, lambda rows: {r[0] for r in rows} >= tenants or len(rows) >= 3)
    assert [r[0] for r in rows] == sorted(tenants) and ["acme", "ok"] in rows, rows
    # alice's feedback on her id still finds her own answer
    fb = _feedback(s, "alice", {"request_id": rid, "metric": "thumbs_up", "value": True})
    assert fb.status_code == 200, fb.text
    joined = s.rows_when(f"SELECT tenant_id, status FROM feedback_joined WHERE feedback_id = '{fb.json()['feedback_id']}'",
                         bool)
    assert joined == [["acme", "ok"]], joined


async def _cancel_race(stack) -> tuple[Response, Response]:
    """bob cancels alice's request X (he knows its id, not its secret); alice cancels her own Z.
    Both cancels are out before either request is sent: a stage that has read Z's has most likely
    read X's too (both are read by one poll of the cancel topic)."""
    info = stack.info
    # they ring the stack's doorbell as the door's client does: an unrung cancel may wait out a stage's
    # idle doze (up to consumer.idle_doze_max_ms), and the request would be answered before it is read
    bells = Path(info["doorbell_dir"]) if info.get("doorbell_dir") else None
    async with Client(info["bootstrap"], topic_prefix=info["topic_prefix"], doorbell_dir=bells) as alice, \
            Client(info["bootstrap"], topic_prefix=info["topic_prefix"], doorbell_dir=bells) as bob:
        x = alice.build("identities: keep me", api_key=stack.keys["alice"], tenant_id="acme")
        z = alice.build("identities: withdraw me", api_key=stack.keys["alice"], tenant_id="acme")
        await bob.cancel(x.request_id, "caller")  # with bob's own secret for that id
        await alice.cancel(z.request_id, "caller")
        return tuple(await asyncio.gather(alice.request(x, 60), alice.request(z, 60)))  # type: ignore[return-value]


def test_a_cancel_from_another_tenant_is_ignored(review_stack):
    for _ in range(3):  # a round counts once a stage had read the cancels: the sender's own one worked
        kept, withdrawn = asyncio.run(_cancel_race(review_stack))
        if withdrawn.status == "cancelled":
            break
    assert withdrawn.status == "cancelled", withdrawn
    assert kept.status == "ok" and kept.tenant_id == "acme", kept
    assert review_stack.chat("bob", "still serving after the cancels").status_code == 200


# ---- the race the finding describes: another tenant answers an HTTP caller's pending id ---------

SLOW_PROMPT = "identities: race me, call 010-1234-5678 " * 700  # ~29k characters: seconds in mask


async def _race_into_the_door(stack) -> httpx.Response:
    """alice posts a prompt mask takes seconds over; bob, reading `requests` like any reader of the
    topic, publishes his own short request under her id with her reply_to (the door's partition),
    on another key (so another partition of `requests`): his answer reaches the door first."""
    info = stack.info
    topic = f"{info['topic_prefix']}requests"
    reader = AIOKafkaConsumer(bootstrap_servers=info["bootstrap"], group_id=None, enable_auto_commit=False,
                              fetch_max_wait_ms=50)
    await reader.start()
    producer = AIOKafkaProducer(bootstrap_servers=info["bootstrap"])
    await producer.start()
    try:
        parts = [TopicPartition(topic, p) for p in sorted(await producer.partitions_for(topic))]
        reader.assign(parts)
        await reader.seek_to_end(*parts)
        for tp in parts:
            await reader.position(tp)
        alice = asyncio.create_task(asyncio.to_thread(stack.chat, "alice", SLOW_PROMPT, 120))
        seen, seen_partition = None, -1
        deadline = asyncio.get_running_loop().time() + 30
        while seen is None and asyncio.get_running_loop().time() < deadline:
            for recs in (await reader.getmany(timeout_ms=200)).values():
                for r in recs:
                    doc = orjson.loads(r.value)
                    if "race me" in doc["body"]["messages"][0]["content"]:
                        seen, seen_partition = doc, r.partition
        assert seen is not None, "alice's request never showed on requests"
        forged = RequestDoc(request_id=seen["request_id"], api_key=stack.keys["bob"], reply_to=seen["reply_to"],
                            body=ChatBody(messages=[ChatMessage(role="user", content="Say hello")], max_tokens=1))
        # another partition than alice's: on hers, bob's record would wait behind her slow one
        other = next(tp.partition for tp in parts if tp.partition != seen_partition)
        bob_sent = asyncio.get_running_loop().time()
        await producer.send_and_wait(topic, encode(forged), key=b"bob-" + uuid.uuid4().hex.encode(), partition=other)
        answered = await alice
        assert asyncio.get_running_loop().time() - bob_sent > 0.5, "alice was answered too soon for a race"
        return answered
    finally:
        await producer.stop()
        await reader.stop()


def _foreign_answers(stack) -> float:
    metrics = httpx.get(stack.http_url + "/metrics", timeout=10).text
    found = re.search(r'^llmpipe_client_foreign_records_total\{kind="answer"\} (\S+)$', metrics, re.M)
    return float(found.group(1)) if found else 0.0


def test_another_tenant_cannot_answer_an_http_callers_pending_request(review_stack):
    """Every round: alice gets her own answer. A round counts once bob's answer reached the door
    while hers was pending (the door counted it as foreign); which one the stages finish first is
    up to them, so up to three rounds are run for one that raced."""
    raced = 0
    for _ in range(3):
        before = _foreign_answers(review_stack)
        answered = asyncio.run(_race_into_the_door(review_stack))
        assert answered.status_code == 200, answered.text
        text = answered.json()["choices"][0]["message"]["content"]
        # the mock upstream answers max_tokens words: bob's forged answer was one word, alice's is several
        assert len(text.split()) > 1, f"alice got bob's one-token answer: {text!r}"
        if _foreign_answers(review_stack) > before:
            raced += 1
            break
    assert raced, "in three rounds bob's answer never reached the door while alice's request was pending"
