"""The front door's wire mapping as pure functions: OpenAI bodies in, completions, chunks and error
statuses out (no infrastructure)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from pipeline.contracts import Response, Status
from pipeline.contracts.response import Usage
from pipeline.ingress.openai_body import BodyError, chat_request
from pipeline.ingress.openai_reply import completion, http_status, retry_after_s, stream_chunks, text_pieces


def answer(**kw) -> Response:
    base = dict(request_id="r1", status=Status.ok, text="Hello there, 세계!  Bye.", answered_by="postprocess",
                model="m", finish_reason="stop", usage=Usage(prompt_tokens=5, completion_tokens=4))
    return Response(**{**base, **kw})


@pytest.mark.parametrize("text", ["", "one", " lead and trail  ", "a\n\nb\tc", "한국어 문장입니다.", "  "])
def test_text_pieces_concatenate_back_exactly(text):
    assert "".join(text_pieces(text)) == text


def test_stream_chunks_role_pieces_finish_usage():
    chunks = list(stream_chunks(answer(), "asked", include_usage=True))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    body = [c for c in chunks if c["choices"]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in body) == "Hello there, 세계!  Bye."
    assert [c["choices"][0]["finish_reason"] for c in body].count("stop") == 1
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 9
    assert {c["id"] for c in chunks} == {"chatcmpl-r1"} and chunks[0]["model"] == "m"
    assert all(c["choices"] for c in stream_chunks(answer(), None, include_usage=False))


def test_completion_logprobs_spelled_by_the_given_tokenizer():
    r = answer(token_ids=[7, 8], logprobs=[-0.5, -1.0])
    doc = completion(r, None, token_text=lambda t: f"t{t}")
    assert doc["choices"][0]["logprobs"]["content"][1] == {"token": "t8", "logprob": -1.0, "bytes": [116, 56],
                                                          "top_logprobs": []}
    assert completion(answer(), None)["choices"][0]["logprobs"] is None


@pytest.mark.parametrize("status,error_class,http", [
    (Status.rejected, "unauthenticated", 401), (Status.rejected, "blob_forbidden", 403),
    (Status.rejected, "too_large", 413), (Status.rejected, "fetch_refused", 422),
    (Status.rejected, "rate_limited", 429), (Status.rejected, "budget_exhausted", 429),
    (Status.rejected, "in_progress", 409), (Status.deadline_exceeded, "deadline_exceeded", 504),
    (Status.error, "connection_refused", 502), (Status.error, "schema_invalid", 502),
    (Status.error, "no_compatible_deployment", 503), (Status.error, "processing_failed", 500),
    (Status.rejected, "something_new", 400),
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
    for bad, why in [({"n": 2}, "`n`"), ({"tools": [{"type": "function"}]}, "`tools`"), ({"stop": "x"}, "`stop`"),
                     ({"stream": "yes"}, "`stream`"), ({"messages": []}, "messages")]:
        with pytest.raises(BodyError, match=why):
            chat_request({"messages": [{"role": "user", "content": "hi"}], **bad})
    with pytest.raises(ValidationError):
        chat_request({"messages": [{"role": "user", "content": "hi"}], "llmpipe": {"unknown": 1}})
    with pytest.raises(BodyError, match="role"):
        chat_request({"messages": [{"role": "wizard", "content": "hi"}]})
