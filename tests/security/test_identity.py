"""Caller assertions and request ids against the running stack (issue 35, finding 4 and the replay
part of 6): a request the door published, captured from `requests` and published again with its
reply_to, rollout or deadline changed, is refused by mask; published again verbatim, it is not run
a second time; a `rollout` section needs the role from the key's config. Every refusal is a clean
answer, and the stack serves the next request."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from pipeline.contracts import RequestDoc, Response
from pipeline.contracts.request import ChatBody, ChatMessage, RolloutRequest
from pipeline.ingress.client import Client, ClientTimeout
from pipeline.runtime.topics import TopicNames
from tests.support.cli import last_json, llmpipe
from tests.support.kafka import read_topic

pytestmark = pytest.mark.integration


async def _raw(stack, request_id: str) -> bytes:
    """The record published on `requests` for this request (what any reader of the topic sees)."""
    topic = TopicNames(stack.info["topic_prefix"]).requests
    for rec in await read_topic(stack.info["bootstrap"], topic, 10**6, timeout=20, quiet_s=2):
        if rec.key == request_id.encode():
            return rec.value
    raise AssertionError(f"no record for {request_id} on {topic}")


async def _captured(stack, request_id: str) -> RequestDoc:
    return RequestDoc.model_validate_json(await _raw(stack, request_id))


async def _send(stack, doc: RequestDoc, reply_partition: int | None = None, timeout_s: float = 30) -> Response | None:
    """Publish `doc` as it is (its reply_to included) and wait for an answer to its id on
    `reply_partition` (the door's, when the doc still names it); None when none came."""
    info = stack.info
    async with Client(info["bootstrap"], topic_prefix=info["topic_prefix"], reply_partition=reply_partition) as c:
        try:
            return await c.request(doc, timeout_s)
        except ClientTimeout:
            return None


def test_a_captured_request_cannot_be_changed_or_run_again(review_stack):
    s = review_stack
    r = s.chat("alice", f"identity: a captured request {uuid.uuid4().hex[:6]}",
               llmpipe={"context": {"volatile": True}})  # past the cache: a replay would reach admit
    assert r.status_code == 200, r.text
    rid = r.headers["x-request-id"]
    cap = asyncio.run(_captured(s, rid))
    assert cap.caller_assertion and cap.api_key is None and cap.reply_to is not None
    door = cap.reply_to.partition
    mine = 0 if door else 1

    # changed: the answer redirected to the sender's partition, 64 samples, a deadline an hour on
    redirected = cap.model_copy(update={"reply_to": cap.reply_to.model_copy(update={"partition": mine})})
    enlarged = cap.model_copy(update={"rollout": RolloutRequest(group_id="stolen", n=64)})
    later = cap.model_copy(update={"deadline_ms": (cap.deadline_ms or 0) + 3_600_000})
    for doc, partition in ((redirected, mine), (enlarged, door), (later, door)):
        resp = asyncio.run(_send(s, doc, partition))
        assert resp is not None and resp.status == "rejected" and resp.error_class == "unauthenticated", resp
        assert "does not match this request" in (resp.reason or "") and resp.tenant_id is None

    # verbatim: the id is taken and answered, so the copy is refused (or, were its answer still to
    # come, dropped): never run or charged again
    again = asyncio.run(_send(s, cap, door))
    if again is not None:
        assert again.status == "rejected" and again.error_class == "duplicate_request", again
    q = f"SELECT decision, reason FROM decisions WHERE request_id = '{rid}' AND stage = 'admit.replay'"
    [[decision, reason]] = s.rows_when(q, bool)
    assert decision in ("rejected", "duplicate_dropped") and "taken by record" in reason
    admitted = s.sql(f"SELECT decision FROM decisions FINAL WHERE request_id = '{rid}' AND stage = 'admit'")
    assert admitted == [["admitted"]], "the original's admission row stays, and it was admitted once"
    rows = s.sql(f"SELECT tenant_id, status FROM requests FINAL WHERE request_id = '{rid}' AND tenant_id = 'acme'")
    assert rows == [["acme", "ok"]], "the refusals never replace alice's answer in the warehouse"
    assert s.chat("alice", "identity: still serving").status_code == 200


async def _rollout(stack, key: str) -> Response:
    info = stack.info
    async with Client(info["bootstrap"], topic_prefix=info["topic_prefix"]) as c:
        body = ChatBody(messages=[ChatMessage(role="user", content="What is 2+2?")], max_tokens=8)
        # the sender claims the role itself: only the key's config counts
        doc = c.build(body=body, timeout_s=60, api_key=stack.keys[key], roles=["rollouts"],
                      rollout=RolloutRequest(group_id=f"identity-{uuid.uuid4().hex[:8]}", n=2))
        return await c.request(doc, 60)


def test_a_rollout_needs_the_role_from_the_keys_config(review_stack):
    s = review_stack
    refused = asyncio.run(_rollout(s, "alice"))
    assert refused.status == "rejected" and refused.error_class == "forbidden", refused
    assert "`rollouts`" in (refused.reason or "") and refused.answered_by == "mask"
    granted = asyncio.run(_rollout(s, "trainer"))
    assert granted.error_class not in ("forbidden", "unauthenticated"), granted
    assert s.chat("alice", "identity: still serving after a refused rollout").status_code == 200


def test_the_cli_on_the_stack_signs_instead_of_publishing_the_key(review_stack):
    """Low 15: `llmpipe submit` on the data dir of the stack it talks to holds the keyring, so it
    sends a caller assertion like the door; the key never rests on `requests`."""
    s = review_stack
    res = llmpipe("submit", "--prompt", "identity: from the cli", "--api-key", s.keys["alice"], "--json",
                  "--config", str(s.data_dir / "llmpipe.yaml"), data_dir=s.data_dir, timeout=120)
    assert res.returncode == 0, res.stderr + res.stdout
    answer = last_json(res)
    assert answer["status"] == "ok", answer
    raw = asyncio.run(_raw(s, answer["request_id"]))
    assert s.keys["alice"].encode() not in raw
    doc = RequestDoc.model_validate_json(raw)
    assert doc.api_key is None and doc.caller_assertion and doc.tenant_id == "acme"


def test_a_streamed_request_through_the_door_verifies(review_stack):
    """The door signs after it marks the reply_to for streaming (the assertion covers reply_to)."""
    r = review_stack.chat("alice", "identity: a streamed request", stream=True)
    assert r.status_code == 200, r.text
    assert r.text.rstrip().endswith("data: [DONE]") and "unauthenticated" not in r.text, r.text
