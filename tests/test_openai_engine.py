"""The OpenAI-compatible engine's reading of a chat completion stream (the wire format, no server)."""

from __future__ import annotations

import pytest


def _sse(events: list[dict]) -> bytes:
    import orjson

    return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"


@pytest.mark.parametrize("usage,ids,expect", [
    ({"prompt_tokens": 8, "completion_tokens": 3, "total_tokens": 11}, False, (8, 3)),  # e.g. OpenAI itself
    (None, True, (2, 3)),  # vLLM's token ids, no usage chunk
    (None, False, (0, 0)),  # a server that reports neither
])
def test_openai_engine_counts_the_servers_usage_when_it_sends_no_token_ids(usage, ids, expect):
    """Token counts drive cost, budgets and TPM: an OpenAI-compatible server that returns no token
    ids (most are not vLLM) must still be charged for the tokens it reports."""
    import asyncio

    import httpx

    from pipeline.engines.chat_engine import Sampling
    from pipeline.engines.openai_engine import OpenAIEngine

    words = ["Nine", " to", " six"]
    events = [{"choices": [{"index": 0, "delta": {"content": w}, "finish_reason": None,
                            **({"token_ids": [i]} if ids else {})}],
               **({"prompt_token_ids": [1, 2]} if ids and i == 0 else {})} for i, w in enumerate(words)]
    events[-1]["choices"][0]["finish_reason"] = "stop"
    if usage:
        events.append({"choices": [], "usage": usage})
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=_sse(events), headers={"content-type": "text/event-stream"})

    async def run():
        engine = OpenAIEngine("http://upstream.test/v1", "m")
        engine.client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        try:
            return await engine.generate([{"role": "user", "content": "hours?"}], Sampling(max_tokens=8))
        finally:
            await engine.stop()

    g = asyncio.run(run())
    assert g.text == "Nine to six" and g.finish_reason == "stop"
    assert (g.tokens_in, g.tokens_out) == expect
    assert b'"include_usage":true' in seen[0].content  # the engine asks for the usage chunk


def test_openai_engine_keeps_its_connection_to_the_server_between_requests():
    """Leaving the SSE body unread after [DONE] makes httpx close the connection, so every request
    paid a new TCP connect (generate's profile, issue 18); the engine reads the stream to its end."""
    import asyncio

    from pipeline.engines.chat_engine import Sampling
    from pipeline.engines.openai_engine import OpenAIEngine

    body = _sse([{"choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}]}])
    chunked = hex(len(body))[2:].encode() + b"\r\n" + body + b"\r\n0\r\n\r\n"
    accepted = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.lower().split(b"\r\n")
                                  if line.startswith(b"content-length")))
                await reader.readexactly(length)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             b"transfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n" + chunked)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def run() -> list[str]:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        engine = await OpenAIEngine(f"http://127.0.0.1:{port}/v1", "m").start()
        try:
            return [(await engine.generate([{"role": "user", "content": "hi"}], Sampling(max_tokens=4))).text
                    for _ in range(5)]
        finally:
            await engine.stop()
            server.close()

    assert asyncio.run(run()) == ["ok"] * 5
    assert len(accepted) == 1, f"{len(accepted)} connections for 5 requests"
