"""The front door's wire mapping as pure functions: OpenAI bodies in, completions, chunks and error
statuses out (no infrastructure)."""

from __future__ import annotations

import time

import orjson
import pytest
from pydantic import ValidationError

from pipeline.contracts import Response, Status
from pipeline.contracts.response import Usage
from pipeline.ingress.openai_body import BodyError, chat_request
from pipeline.ingress.openai_reply import completion, http_status, retry_after_s
from pipeline.ingress.sse import SseReply
from pipeline.ingress.stream_follow import Ended, Piece


def answer(**kw) -> Response:
    base = dict(request_id="r1", status=Status.ok, text="Hello there, 세계!  Bye.", answered_by="postprocess",
                model="m", finish_reason="stop", usage=Usage(prompt_tokens=5, completion_tokens=4))
    return Response(**{**base, **kw})


def _events(raw: list[bytes]) -> list:
    """The SSE `data:` payloads, parsed (DONE as the string)."""
    out = []
    for block in b"".join(raw).split(b"\n\n"):
        if block.startswith(b"data: "):
            body = block[6:]
            out.append("[DONE]" if body == b"[DONE]" else orjson.loads(body))
    return out


def test_sse_role_pieces_finish_usage_done():
    reply = SseReply("r1", "asked", include_usage=True, token_text=None, t0=time.perf_counter())
    raw = [*reply.on(Piece("Hello there, ", "a1")), *reply.on(Piece("세계!  ", "a1")),
           *reply.on(Piece("Bye.", None)), *reply.on(Ended(answer()))]
    ev = _events(raw)
    assert ev[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""} and ev[-1] == "[DONE]"
    body = [c for c in ev[:-1] if c["choices"]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in body) == "Hello there, 세계!  Bye."
    assert [c["choices"][0]["finish_reason"] for c in body].count("stop") == 1
    assert ev[-2]["choices"] == [] and ev[-2]["usage"]["total_tokens"] == 9
    assert {c["id"] for c in ev[:-1]} == {"chatcmpl-r1"} and reply.ended and reply.outcome == "ok"
    assert len(reply.sent_at) == 3 and len(reply.gaps_ms()) == 2
    plain = SseReply("r1", None, include_usage=False, token_text=None, t0=time.perf_counter())
    assert all(c["choices"] for c in _events(plain.on(Ended(answer())))[:-1])


def test_sse_error_after_text_is_an_openai_error_event():
    reply = SseReply("r2", "asked", include_usage=False, token_text=None, t0=time.perf_counter())
    raw = [*reply.on(Piece('{"city": ', "a1")),
           *reply.on(Ended(answer(status=Status.error, error_class="schema_invalid", text=None,
                                  reason="the answer does not satisfy the requested JSON schema"), "schema_invalid"))]
    ev = _events(raw)
    assert ev[-1] == "[DONE]" and ev[-2]["error"]["code"] == "schema_invalid"
    assert ev[-2]["error"]["type"] == "api_error" and "JSON schema" in ev[-2]["error"]["message"]
    assert not any(c.get("choices") and c["choices"][0]["finish_reason"] for c in ev[:-2] if isinstance(c, dict))
    assert reply.outcome == "schema_invalid"


def test_completion_logprobs_spelled_by_the_given_tokenizer():
    r = answer(token_ids=[7, 8], logprobs=[-0.5, -1.0])
    doc = completion(r, None, token_text=lambda t: f"t{t}")
    assert doc["choices"][0]["logprobs"]["content"][1] == {"token": "t8", "logprob": -1.0, "bytes": [116, 56],
                                                          "top_logprobs": []}
    assert completion(answer(), None)["choices"][0]["logprobs"] is None
    top = answer(token_ids=[7], logprobs=[-0.1], top_logprobs=[[("a", -0.1), ("b", -2.5)]])
    assert completion(top, None, token_text=str)["choices"][0]["logprobs"]["content"][0]["top_logprobs"] == [
        {"token": "a", "logprob": -0.1, "bytes": [97]}, {"token": "b", "logprob": -2.5, "bytes": [98]}]
    assert chat_request({"messages": [{"role": "user", "content": "hi"}], "logprobs": True,
                         "top_logprobs": 5}).body.top_logprobs == 5


@pytest.mark.parametrize("status,error_class,http", [
    (Status.rejected, "unauthenticated", 401), (Status.rejected, "blob_forbidden", 403),
    (Status.rejected, "too_large", 413), (Status.rejected, "fetch_refused", 422),
    (Status.rejected, "rate_limited", 429), (Status.rejected, "budget_exhausted", 429),
    (Status.rejected, "in_progress", 409), (Status.deadline_exceeded, "deadline_exceeded", 504),
    (Status.error, "connection_refused", 502), (Status.error, "schema_invalid", 502),
    (Status.error, "no_compatible_deployment", 503), (Status.error, "processing_failed", 500),
    (Status.rejected, "something_new", 400), (Status.cancelled, "cancelled", 499),
])
def test_http_status_by_error_class(status, error_class, http):
    assert http_status(answer(status=status, error_class=error_class, text=None)) == http


def test_retry_after_rounds_up_to_seconds():
    assert retry_after_s(answer(status=Status.rejected, error_class="rate_limited", retry_after_ms=1001)) == 2
    assert retry_after_s(answer(status=Status.rejected, error_class="rate_limited")) == 1


def test_body_parsing_refuses_what_it_cannot_honour():
    ok = chat_request({"messages": [{"role": "developer", "content": "be brief"}, {"role": "user", "content": [
        {"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}],
        "stream": True, "stream_options": {"include_usage": True}, "user": "someone@example.com",
        "llmpipe": {"timeout_s": 5, "context": {"domain": "faq"}}})
    assert ok.body.messages[0].role == "system" and ok.body.images == ["https://x/y.png"]
    assert ok.stream and ok.include_usage and ok.timeout_s == 5 and ok.extension.context.domain == "faq"
    assert "someone@example.com" not in ok.body.model_dump_json()  # `user` is not kept
    for bad, why in [({"n": 9}, "`n`"), ({"tools": [{"type": "function"}]}, r"tools\[0\] function"),
                     ({"top_logprobs": 3}, "`top_logprobs` needs `logprobs: true`"),
                     ({"top_logprobs": 21, "logprobs": True}, "`top_logprobs` must be"),
                     ({"top_logprobs": 2, "logprobs": True, "stream": True}, "with `stream`"),
                     ({"audio": {"voice": "x"}}, "`audio` is not supported"),
                     ({"stream": "yes"}, "`stream`"), ({"messages": []}, "messages")]:
        with pytest.raises(BodyError, match=why):
            chat_request({"messages": [{"role": "user", "content": "hi"}], **bad})
    with pytest.raises(ValidationError):
        chat_request({"messages": [{"role": "user", "content": "hi"}], "llmpipe": {"unknown": 1}})
    with pytest.raises(BodyError, match="role"):
        chat_request({"messages": [{"role": "wizard", "content": "hi"}]})
