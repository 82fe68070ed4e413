"""An instant OpenAI-compatible upstream for overhead benchmarks (the method LiteLLM and TensorZero
use for their own gateway numbers): every chat completion is answered at once, as JSON or as SSE.

    .venv/bin/python bench/mock_upstream.py --port 8099

Plain asyncio HTTP/1.1 with keep-alive and no framework, so the mock itself costs as little CPU as
possible; it runs in its own process and its CPU is reported apart from the systems under test.
It answers `POST /v1/chat/completions` (and `/chat/completions`), `GET /v1/models`, `GET /health`.
The answer is a fixed short text split into `--tokens` chunks; with `stream: true` each chunk is
one SSE event, then a usage event (when `stream_options.include_usage`), then `[DONE]`. With
`--ttft-ms`/`--itl-ms` a stream is paced like an engine (chunked transfer, the first token after
ttft, one token per itl): the stream bench's run without the model (bench/stream_bench.py --mock).

Fault injection for the deployment tests (tests/test_generate_deployments.py), all off by default,
so the benchmarks see the same bytes as before: `--fail-first N --fail-status S` answers the first
N chat completions with HTTP S (then it is healthy), `--text T` makes every answer the one-token
text T (JSON for a schema, say), and `--control` counts what arrives and adds `GET /mock/stats`
(chat completions received, in flight, failed, and the last bodies). Killing the process is the
abrupt death of a deployment.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import http
import time

import orjson

WORDS = ["The", " answer", " is", " yes", ".", " It", " came", " from", " the", " mock", " upstream", "."]


def _completion(body: dict, n_tokens: int, words: list[str] = WORDS) -> bytes:
    text = "".join(words[i % len(words)] for i in range(n_tokens))
    return orjson.dumps({
        "id": "chatcmpl-mock", "object": "chat.completion", "created": int(time.time()),
        "model": body.get("model", "mock"),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 8, "completion_tokens": n_tokens, "total_tokens": 8 + n_tokens}})


def _sse_events(body: dict, n_tokens: int, words: list[str] = WORDS) -> list[bytes]:
    model, created = body.get("model", "mock"), int(time.time())
    out = []
    for i in range(n_tokens):
        delta = {"role": "assistant", "content": words[i % len(words)]} if i == 0 else {"content": words[i % len(words)]}
        out.append({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": "stop" if i == n_tokens - 1 else None}]})
    if (body.get("stream_options") or {}).get("include_usage"):
        out.append({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": n_tokens,
                                             "total_tokens": 8 + n_tokens}})
    return [b"data: " + orjson.dumps(e) + b"\n\n" for e in out] + [b"data: [DONE]\n\n"]


def _sse(body: dict, n_tokens: int, words: list[str] = WORDS) -> bytes:
    return b"".join(_sse_events(body, n_tokens, words))


def _response(status: str, ctype: bytes, payload: bytes) -> bytes:
    return (b"HTTP/1.1 " + status.encode() + b"\r\ncontent-type: " + ctype + b"\r\ncontent-length: "
            + str(len(payload)).encode() + b"\r\nconnection: keep-alive\r\n\r\n" + payload)


class MockUpstream:
    def __init__(self, n_tokens: int = 8, delay_ms: float = 0.0, ttft_ms: float = 0.0, itl_ms: float = 0.0, *,
                 fail_first: int = 0, fail_status: int = 503, text: str | None = None, control: bool = False) -> None:
        self.n_tokens, self.delay_s = (1 if text is not None else n_tokens), delay_ms / 1000
        self.ttft_s, self.itl_s = ttft_ms / 1000, itl_ms / 1000
        self.words = WORDS if text is None else [text]
        self.fail_left, self.fail_status = fail_first, http.HTTPStatus(fail_status)
        self.served = 0
        # what reached this upstream: counted only with --control (the benchmarks pay nothing for it)
        self.control = control
        self.requests = self.in_flight = self.failed = 0
        self.bodies: collections.deque[object] = collections.deque(maxlen=64)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ")[:2]
                length = 0
                for line in lines[1:]:
                    if line[:15].lower() == "content-length:":
                        length = int(line[15:].strip())
                raw = await reader.readexactly(length) if length else b""
                if self.control or self.fail_left:
                    if (injected := self.injected(method, path.split("?")[0], raw)) is not None:
                        writer.write(injected)
                        await writer.drain()
                        continue
                    self.in_flight += method == "POST"
                    try:
                        await self.respond(writer, method, path, raw)
                    finally:
                        self.in_flight -= method == "POST"
                    continue
                await self.respond(writer, method, path, raw)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def respond(self, writer: asyncio.StreamWriter, method: str, path: str, raw: bytes) -> None:
        if (self.ttft_s or self.itl_s) and method == "POST" and (events := _paced(raw)) is not None:
            await self.paced(writer, events)
            return
        writer.write(await self.answer(method, path.split("?")[0], raw))
        await writer.drain()

    def injected(self, method: str, path: str, raw: bytes) -> bytes | None:
        """--control's stats, or --fail-first's failure; None: answered as usual. With --control every
        chat completion is counted (and its body kept) here, failed or not."""
        if self.control and method == "GET" and path == "/mock/stats":
            return _response("200 OK", b"application/json", orjson.dumps(
                {"requests": self.requests, "in_flight": self.in_flight, "failed": self.failed,
                 "served": self.served, "bodies": list(self.bodies)}))
        if method != "POST" or not path.endswith("/chat/completions"):
            return None
        if self.control:
            self.requests += 1
            try:
                self.bodies.append(orjson.loads(raw))
            except orjson.JSONDecodeError:
                self.bodies.append(None)
        if self.fail_left <= 0:
            return None
        self.fail_left -= 1
        self.failed += 1
        s = self.fail_status
        return _response(f"{s.value} {s.phrase}", b"application/json",
                         orjson.dumps({"error": {"message": f"injected failure {self.failed}", "code": s.value}}))

    async def paced(self, writer: asyncio.StreamWriter, body: dict) -> None:
        """A stream as an engine makes it: one chunk of the chunked transfer per event, the first
        token after ttft, the others one itl apart (usage and [DONE] right after the last)."""
        self.served += 1
        n = max(1, min(self.n_tokens, int(body.get("max_tokens") or body.get("max_completion_tokens") or self.n_tokens)))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
                     b"connection: keep-alive\r\n\r\n")
        await asyncio.sleep(self.ttft_s)
        for i, event in enumerate(_sse_events(body, n, self.words)):
            if 0 < i < n:
                await asyncio.sleep(self.itl_s)
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def answer(self, method: str, path: str, raw: bytes) -> bytes:
        if method == "GET" and path in ("/health", "/v1/models", "/models"):
            return _response("200 OK", b"application/json",
                             orjson.dumps({"object": "list", "data": [{"id": "mock", "object": "model"}]}))
        if method != "POST" or not path.endswith("/chat/completions"):
            return _response("404 Not Found", b"application/json", b'{"error": {"message": "not found"}}')
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return _response("400 Bad Request", b"application/json", b'{"error": {"message": "bad json"}}')
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        self.served += 1
        n = max(1, min(self.n_tokens, int(body.get("max_tokens") or body.get("max_completion_tokens")
                                          or self.n_tokens)))
        if body.get("stream"):
            return _response("200 OK", b"text/event-stream", _sse(body, n, self.words))
        return _response("200 OK", b"application/json", _completion(body, n, self.words))


def _paced(raw: bytes) -> dict | None:
    """The body of a streamed chat completion, else None (answered at once as before)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return body if isinstance(body, dict) and body.get("stream") else None


async def serve(port: int, n_tokens: int, delay_ms: float, ttft_ms: float = 0.0, itl_ms: float = 0.0, *,
                fail_first: int = 0, fail_status: int = 503, text: str | None = None, control: bool = False) -> None:
    mock = MockUpstream(n_tokens, delay_ms, ttft_ms, itl_ms, fail_first=fail_first, fail_status=fail_status,
                        text=text, control=control)
    server = await asyncio.start_server(mock.handle, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--tokens", type=int, default=8, help="completion tokens per answer (capped by max_tokens)")
    ap.add_argument("--delay-ms", type=float, default=0.0, help="time to answer (0: instant)")
    ap.add_argument("--ttft-ms", type=float, default=0.0, help="a stream's first token after this (paced streams)")
    ap.add_argument("--itl-ms", type=float, default=0.0, help="a stream's later tokens this far apart (paced streams)")
    ap.add_argument("--fail-first", type=int, default=0, help="answer the first N chat completions with --fail-status")
    ap.add_argument("--fail-status", type=int, default=503, help="the HTTP status of an injected failure")
    ap.add_argument("--text", default=None, help="every answer is this text, as one token")
    ap.add_argument("--control", action="store_true", help="count what arrives; GET /mock/stats reports it")
    a = ap.parse_args()
    asyncio.run(serve(a.port, a.tokens, a.delay_ms, a.ttft_ms, a.itl_ms, fail_first=a.fail_first,
                      fail_status=a.fail_status, text=a.text, control=a.control))


if __name__ == "__main__":
    main()
