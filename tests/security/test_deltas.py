"""A streamed answer on `deltas` is sealed (issue 35, finding 8): the topic's partitions are shared
by every caller whose reply partition has that number, so a reader of the topic saw the un-masked
text of every answer streamed through it. Generate now seals each delta's text, tokens and
logprobs under the request's delta key (`stream.seal`, on by default); the door opens them.

Against the running review stack: a caller streams over HTTP, the test reads `deltas` directly
(as any consumer of the topic can) and finds ids, sizes and times, never the text; the caller's
SSE stream is the answer, and a Kafka client with the stack's keyring streams it piece by piece.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import orjson
import pytest
from aiokafka import AIOKafkaConsumer

from pipeline.contracts.request import ChatBody, ChatMessage
from pipeline.contracts.stream import Delta
from pipeline.ingress.client import Client
from pipeline.ingress.stream_follow import Ended, Piece
from pipeline.security.sealing import Keyring, open_delta

pytestmark = pytest.mark.integration

PROMPT = "Write to jane.doe@example.com about card 4111 1111 1111 1111, please."


def _sse_stream(stack, prompt: str) -> tuple[str, str]:
    """(request_id, the text the caller was shown) of one streamed chat completion."""
    body = {"messages": [{"role": "user", "content": prompt}], "stream": True}
    shown = []
    with httpx.stream("POST", stack.http_url + "/v1/chat/completions", json=body, timeout=60,
                      headers={"authorization": f"Bearer {stack.keys['alice']}"}) as r:
        assert r.status_code == 200, r.read()
        rid = r.headers["x-request-id"]
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = orjson.loads(line[6:])
            assert "error" not in event, event
            shown += [c["delta"].get("content") or "" for c in event.get("choices", [])]
    return rid, "".join(shown)


async def _deltas_of(stack, request_id: str, timeout: float = 30) -> list[bytes]:
    """The raw `deltas` records of one request, read as any consumer of the topic can, up to its last."""
    c = AIOKafkaConsumer(stack.info["topic_prefix"] + "deltas", bootstrap_servers=stack.info["bootstrap"],
                         auto_offset_reset="earliest", enable_auto_commit=False, fetch_max_wait_ms=100, group_id=None)
    await c.start()
    got: list[bytes] = []
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not any(Delta.model_validate_json(v).last for v in got):
            for recs in (await c.getmany(timeout_ms=200)).values():
                got += [r.value for r in recs if r.key == request_id.encode()]
    finally:
        await c.stop()
    assert got, f"no deltas of {request_id} within {timeout:.0f} s"
    return got


def test_a_reader_of_deltas_sees_no_text_and_the_caller_sees_the_answer(review_stack):
    rid, shown = _sse_stream(review_stack, PROMPT)
    raw = asyncio.run(_deltas_of(review_stack, rid))
    deltas = [Delta.model_validate_json(v) for v in raw]
    assert shown.strip(), "the caller was shown an answer"
    for word in {w.strip(".,") for w in shown.split() if len(w.strip(".,")) >= 4}:  # shorter: base64 may hold it
        assert not any(word.encode() in v for v in raw), f"{word!r} is readable on the deltas topic"
    assert all(d.sealed and d.text == "" and d.token_ids == [] for d in deltas)
    keyring = Keyring.local(review_stack.data_dir / "secrets")  # the stack's: the door's
    assert "".join(open_delta(d, keyring).text for d in deltas) == shown  # the door showed what was sealed


async def _kafka_stream(stack, keyring: Keyring | None) -> list[Piece | Ended]:
    async with Client(stack.info["bootstrap"], topic_prefix=stack.info["topic_prefix"]) as client:
        client.delta_keyring = keyring
        body = ChatBody(messages=[ChatMessage(role="user", content=PROMPT)])
        doc = client.build(body=body, api_key=stack.keys["alice"], timeout_s=60)
        return [ev async for ev in client.stream(doc, 60)]


def test_a_kafka_client_streams_pieces_only_with_the_keyring(review_stack):
    for keyring in (Keyring.local(review_stack.data_dir / "secrets"), None):
        events = asyncio.run(_kafka_stream(review_stack, keyring))
        end = events[-1]
        assert isinstance(end, Ended) and end.ok, end
        pieces = [ev for ev in events[:-1] if isinstance(ev, Piece)]
        assert "".join(p.text for p in pieces) == end.response.text  # whole either way
        from_deltas = [p for p in pieces if p.attempt is not None]
        # with the key, the pieces come from the (opened) deltas; without it, only the terminal answer shows
        assert bool(from_deltas) is (keyring is not None), pieces
