"""Rollout hooks against the running stack (issue 35, findings 2 and 11): a caller with the rollout
role names a module of its choice as the verifier, a reward argument that gives any score, and a
pattern that backtracks for minutes; each is answered at once (refused, or scored within its
bounds), and the stack answers a normal rollout and a normal chat afterwards.

Rollout requests travel on Kafka (the door takes chat completions only), sent here as
`llmpipe rollouts submit` sends them: a `request/v1` with the trainer key and a `rollout` section.
generate's openai engine draws the n samples as n calls to the mock upstream, whose answer is
"The answer is yes. It came from" (31 characters)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from pipeline.contracts import Response
from pipeline.contracts.request import ChatBody, ChatMessage, HookSpec, RolloutRequest
from pipeline.ingress.client import Client

pytestmark = pytest.mark.integration

Hooks = tuple[HookSpec | None, HookSpec | None]  # verifier, reward


def _rollouts(stack, hooks: list[Hooks], key: str = "trainer") -> list[tuple[Response, float]]:
    """Send one rollout request (n=4) per (verifier, reward) at once; each answer and its seconds."""

    async def one(client: Client, verifier: HookSpec | None, reward: HookSpec | None) -> tuple[Response, float]:
        body = ChatBody(messages=[ChatMessage(role="user", content="What is 2+2?")], max_tokens=8, logprobs=True)
        doc = client.build(body=body, timeout_s=90, api_key=stack.keys[key],
                           rollout=RolloutRequest(group_id=f"sec-{uuid.uuid4().hex[:8]}", n=4, verifier=verifier,
                                                  reward=reward))
        t0 = time.monotonic()
        resp = await client.request(doc, 90)
        return resp, time.monotonic() - t0

    async def run() -> list[tuple[Response, float]]:
        async with Client(stack.info["bootstrap"], topic_prefix=stack.info["topic_prefix"]) as client:
            return list(await asyncio.gather(*(one(client, v, r) for v, r in hooks)))

    return asyncio.run(run())


def test_a_caller_picks_only_among_the_operators_hooks_within_bounds(review_stack):
    hostile: list[Hooks] = [
        (HookSpec(name="python:this:s"), None),  # module code of the caller's choosing, in the worker
        (None, HookSpec(name="python:pipeline.cli.__main__:app")),  # the CLI with the worker's argv
        (None, HookSpec(name="length_penalty", args={"per_token": -1.0})),  # any score the caller likes
        (HookSpec(name="regex", args={"pattern": "(.+)+X"}), None),  # `re`: minutes on 31 characters
        (HookSpec(name="regex", args={"pattern": "^(.|..)+[0-9]$"}), None),  # exponential in `regex` too
    ]
    (imported, cli, negative, backtrack, exponential) = _rollouts(review_stack, hostile)
    for resp, _ in (imported, cli, negative):
        assert resp.status == "rejected" and resp.error_class == "invalid_request", resp
    assert "is not allowed here" in imported[0].reason and "is not allowed here" in cli[0].reason
    assert "per_token = -1.0 is outside [0.0, 1.0]" in negative[0].reason
    resp, took = backtrack
    assert resp.status == "ok" and [s.verified for s in resp.samples] == [False] * 4 and took < 15, (resp, took)
    resp, took = exponential
    assert resp.status == "rejected" and resp.error_class == "rollout_hook_timeout" and took < 15, (resp, took)
    assert resp.usage.completion_tokens == 4 * 8  # the samples were made: admit settles the hold with them

    # the stack still serves: a normal rollout, scored within the reward's range, and a chat
    ((resp, _),) = _rollouts(review_stack, [(HookSpec(name="regex", args={"pattern": r"\byes\b"}),
                                             HookSpec(name="length_penalty", args={"per_token": 0.5}))])
    assert resp.status == "ok" and len(resp.samples) == 4, resp
    # verified (1) minus 0.5 for each of 8 tokens: -3 by the formula, the declared floor -1 in the data
    assert [(s.verified, s.score) for s in resp.samples] == [(True, -1.0)] * 4, resp.samples
    r = review_stack.chat("alice", "hello after the rollouts")
    assert r.status_code == 200, r.text
