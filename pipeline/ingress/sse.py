"""A streamed answer in OpenAI's server-sent events, chunk by chunk as the pipeline sends it, and
what the caller experienced (time to the first text, gaps between chunks).

The stream a caller reads:
1. `chat.completion.chunk` with the role, then one chunk per piece of text as it arrives;
2. on the terminal answer: the rest of its text (when the deltas did not carry all of it: a cache
   hit, an attempt that changed), a chunk with finish_reason, the per-token logprobs and the
   `llmpipe` extension, then the usage chunk when `stream_options.include_usage` asked for it;
3. on a terminal error after the stream began (e.g. an answer that fails its JSON schema, the
   deadline): one `data: {"error": {...}}` event in OpenAI's error shape (the `openai` client
   raises it as an APIError), never a silent repair;
4. `data: [DONE]`.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import orjson

from pipeline.contracts import Evidence, RequestDoc, Status
from pipeline.ingress.openai_reply import (
    TokenText,
    completion_id,
    error_body,
    http_status,
    llmpipe_extension,
    logprobs_content,
    usage_of,
)
from pipeline.ingress.stream_follow import Ended, Piece

DONE = b"data: [DONE]\n\n"


ARGUMENT_PIECE = 64  # characters of a tool call's arguments per streamed chunk


def _data(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class SseReply:
    def __init__(self, request_id: str, model: str | None, include_usage: bool, token_text: TokenText | None,
                 t0: float) -> None:
        self.request_id, self.model, self.include_usage, self.token_text = request_id, model, include_usage, token_text
        self.t0 = t0  # perf_counter when the door received the request
        self.created = int(time.time())
        self.ended = False
        self.timed_out = False
        self.outcome = "disconnected"  # until the stream ends otherwise
        self.first_text_s: float | None = None  # perf_counter of the first chunk with text
        self.sent_at: list[float] = []  # perf_counter of every chunk with text
        self._role_sent = False

    def _chunk(self, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
        return {"id": f"chatcmpl-{self.request_id}", "object": "chat.completion.chunk", "created": self.created,
                "model": extra.pop("model", None) or self.model or "llmpipe",
                "choices": [{"index": 0, "delta": delta, "logprobs": extra.pop("logprobs", None),
                             "finish_reason": finish}], **extra}

    def _text(self, text: str) -> list[bytes]:
        out = []
        if not self._role_sent:
            self._role_sent = True
            out.append(_data(self._chunk({"role": "assistant", "content": ""})))
        if text:
            now = time.perf_counter()
            if self.first_text_s is None:
                self.first_text_s = now
            self.sent_at.append(now)
            out.append(_data(self._chunk({"content": text})))
        return out

    def _tool_calls(self, resp) -> list[bytes]:
        """The answer's tool calls as OpenAI streams them: per call, its id and name, then its arguments
        in pieces (they come checked, with the answer: a call is never streamed half-made)."""
        out = []
        for i, call in enumerate(resp.tool_calls or ()):
            out.append(_data(self._chunk({"tool_calls": [{"index": i, "id": call.id, "type": "function",
                                                          "function": {"name": call.function.name, "arguments": ""}}]})))
            args = call.function.arguments
            for at in range(0, len(args), ARGUMENT_PIECE):
                out.append(_data(self._chunk({"tool_calls": [{"index": i, "function": {
                    "arguments": args[at:at + ARGUMENT_PIECE]}}]})))
        return out

    def on(self, event: Piece | Ended) -> list[bytes]:
        """Steps 1-4 for one event of the followed stream."""
        if isinstance(event, Piece):
            return self._text(event.text)
        resp = event.response
        if not event.ok:
            status = http_status(resp) if resp.status is not Status.ok else 502
            code = event.error or resp.error_class or resp.status.value
            message = resp.reason or ("the answer is not the text that was streamed" if code == "stream_diverged"
                                      else code)
            return [*self._text(""), self.error(status, code, message)]
        lp = logprobs_content(resp, self.token_text) if self.token_text is not None else None
        out = self._text("")
        out += self._tool_calls(resp)
        out.append(_data(self._chunk({}, resp.finish_reason or "stop", model=resp.model,
                                     logprobs={"content": lp} if lp is not None else None,
                                     system_fingerprint=resp.deployment, llmpipe=llmpipe_extension(resp))))
        if self.include_usage:
            out.append(_data({"id": completion_id(resp), "object": "chat.completion.chunk", "created": self.created,
                              "model": resp.model or self.model or "llmpipe", "choices": [],
                              "usage": usage_of(resp)}))
        self.ended, self.outcome = True, "ok"
        return [*out, DONE]

    def error(self, status: int, code: str, message: str) -> bytes:
        """Step 3 (the caller of a timeout sends DONE after it)."""
        self.ended, self.outcome = True, code
        self.timed_out = code == "no_answer_in_time"
        return _data(error_body(status, message, code, self.request_id)) + DONE

    def gaps_ms(self) -> list[float]:
        return [(b - a) * 1000 for a, b in zip(self.sent_at, self.sent_at[1:])]


def stream_evidence(doc: RequestDoc, reply: SseReply) -> Evidence | None:
    """The caller-side timing as a `frontdoor` evidence row: receive → first text chunk (caller TTFT)
    and the gaps between text chunks. None when no text was sent."""
    if reply.first_text_s is None:
        return None
    gaps = sorted(reply.gaps_ms())
    scores = {"caller_ttft_ms": round((reply.first_text_s - reply.t0) * 1000, 2),
              "chunks": float(len(reply.sent_at)),
              "stream_ms": round((reply.sent_at[-1] - reply.t0) * 1000, 2)}
    if gaps:
        scores |= {"chunk_gap_p50_ms": round(statistics.median(gaps), 2),
                   "chunk_gap_p95_ms": round(gaps[min(len(gaps) - 1, int(0.95 * len(gaps)))], 2),
                   "chunk_gap_max_ms": round(gaps[-1], 2)}
    finished = int(time.time() * 1000)
    return Evidence(request_id=doc.request_id, tenant_id=doc.tenant_id or "", stage="frontdoor",
                    decision="streamed", reason=reply.outcome, scores=scores, attempt=doc.attempt,
                    labels={"ended": reply.outcome}, worker="frontdoor", enqueued_ms=doc.created_ms,
                    started_ms=doc.created_ms, finished_ms=finished,
                    service_ms=float(max(0, finished - doc.created_ms)))
