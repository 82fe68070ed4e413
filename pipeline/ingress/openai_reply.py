"""Terminal answers in OpenAI's wire format: the chat.completion body and the
HTTP status and error body for every error class the pipeline answers with."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from pipeline.contracts import Response, Status
from pipeline.contracts.request import Choice

# error_class -> HTTP status. The vocabulary is the stages' (mask, admit, media, generate,
# postprocess, the runtime's DLQ answer); a class not listed falls back by status (see http_status).
STATUS_BY_CLASS: dict[str, int] = {
    "unauthenticated": 401,
    "forbidden": 403, "adapter_forbidden": 403, "blob_forbidden": 403, "tool_not_allowed": 403,
    "in_progress": 409, "actor_revision_unavailable": 409, "duplicate_request": 409,
    "too_large": 413, "body_too_large": 413, "too_many_pixels": 413, "too_many_images": 413,
    "context_too_long": 413,
    "invalid_request": 422, "fetch_refused": 422, "unsupported_format": 422, "decode_error": 422,
    "blob_not_found": 422,
    "rate_limited": 429, "concurrency_limited": 429, "budget_exhausted": 429, "too_many_idempotency_keys": 429,
    "tool_call_invalid": 502, "tool_call_refused": 502,
    "processing_failed": 500, "unmask_failed": 500, "no_answer": 500, "mask_failed": 500,
    "overloaded": 503, "engine_dead": 503, "no_compatible_deployment": 503, "original_lost": 503,
    "adapter_unavailable": 503, "broker_unavailable": 503, "broker_restarted": 503,
    "deadline_exceeded": 504, "no_answer_in_time": 504,
}
# cancelled: 499 (nginx's "client closed request"); only a caller that published a `cancel` record and
# still waits over HTTP for the same request_id could see it
FALLBACK_BY_STATUS = {Status.rejected: 400, Status.error: 502, Status.deadline_exceeded: 504, Status.cancelled: 499}

ERROR_TYPE = {401: "authentication_error", 403: "permission_error", 409: "conflict_error",
              413: "invalid_request_error", 422: "invalid_request_error", 400: "invalid_request_error",
              429: "rate_limit_error", 504: "timeout_error"}


def http_status(resp: Response) -> int:
    if resp.status is Status.ok:
        return 200
    if resp.status is Status.deadline_exceeded:
        return 504
    return STATUS_BY_CLASS.get(resp.error_class or "", FALLBACK_BY_STATUS[resp.status])


def error_body(status: int, message: str, code: str | None, request_id: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape; `code` is the pipeline's error_class."""
    err: dict[str, Any] = {"message": message, "type": ERROR_TYPE.get(status, "api_error" if status >= 500
                                                                          else "invalid_request_error"),
                           "param": None, "code": code}
    if request_id:
        err["request_id"] = request_id
    return {"error": err}


def retry_after_s(resp: Response) -> int | None:
    """Retry-After in whole seconds (rounded up) for a 429, from admit's retry_after_ms."""
    if resp.retry_after_ms is None:
        return 1 if http_status(resp) == 429 else None
    return max(1, math.ceil(resp.retry_after_ms / 1000))


def llmpipe_extension(resp: Response) -> dict[str, Any]:
    """What the pipeline decided for this request: extra fields OpenAI clients ignore and operators read."""
    return {"request_id": resp.request_id, "route": resp.route, "deployment": resp.deployment,
            "adapter": resp.adapter, "placement": resp.placement, "cache": resp.cache, "cost_usd": resp.cost_usd,
            "duplicate_of": resp.duplicate_of, "answered_by": resp.answered_by,
            "timings": {k: v.model_dump() for k, v in resp.timings.items()},
            "engine": {"ttft_ms": resp.ttft_ms, "tpot_ms": resp.tpot_ms}}


TokenText = Callable[[int], str]


def logprobs_content(resp: Response, token_text: TokenText) -> list[dict[str, Any]] | None:
    if resp.token_ids is None or resp.logprobs is None:
        return None
    top = resp.top_logprobs or [[] for _ in resp.token_ids]
    out = []
    for tid, lp, alts in zip(resp.token_ids, resp.logprobs, top):
        tok = token_text(tid)
        out.append({"token": tok, "logprob": lp, "bytes": list(tok.encode()),
                    "top_logprobs": [{"token": t, "logprob": a, "bytes": list(t.encode())} for t, a in alts]})
    return out


def usage_of(resp: Response) -> dict[str, int]:
    u = resp.usage
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens}


def completion_id(resp: Response) -> str:
    return f"chatcmpl-{resp.request_id}"


def message(resp: Response | Choice) -> dict[str, Any]:
    """An answer's assistant message: its text, or its tool calls (content null, as OpenAI sends it)."""
    if resp.tool_calls:
        return {"role": "assistant", "content": resp.text or None,
                "tool_calls": [c.model_dump(mode="json") for c in resp.tool_calls]}
    return {"role": "assistant", "content": resp.text or ""}


def completion(resp: Response, requested_model: str | None, token_text: TokenText | None = None) -> dict[str, Any]:
    """A `chat.completion` for an ok answer."""
    lp = logprobs_content(resp, token_text) if token_text is not None else None
    return {
        "id": completion_id(resp), "object": "chat.completion", "created": resp.finished_ms // 1000,
        "model": resp.model or requested_model or "llmpipe",
        "choices": [{"index": 0, "message": message(resp),
                     "logprobs": {"content": lp} if lp is not None else None,
                     "finish_reason": resp.finish_reason or "stop"},
                    *({"index": c.index, "message": message(c), "logprobs": None, "finish_reason": c.finish_reason}
                      for c in resp.choices)],
        "usage": usage_of(resp), "system_fingerprint": resp.deployment, "llmpipe": llmpipe_extension(resp),
    }
