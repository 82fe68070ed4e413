"""uvicorn inside a process that owns its signals (the stack supervisor, `llmpipe serve`, the sink's
admin endpoint): it never installs signal handlers of its own, binds its socket before it starts (so
port 0 yields a known port), and has an explicit start()/stop() lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import uvicorn

KEEP_ALIVE_S = 30


class _QuietSignals(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):  # the owning process handles SIGTERM/SIGINT and calls stop()
        yield


class AsgiServer:
    def __init__(self, app, host: str = "127.0.0.1", port: int = 0) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # accepted connections inherit it: without, a response written in two parts (headers, body)
        # waited for the caller's delayed ACK, 40 ms per request on a kept-alive connection (measured)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.bind((host, port))
        self.host = host
        self.port = self.sock.getsockname()[1]
        # an idle kept-alive connection outlives the callers' own idle expiry (httpx and the OpenAI SDK: 5 s,
        # uvicorn's default too): a caller reusing one the server had just closed got a ReadError (seen once)
        self.server = _QuietSignals(uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False,
                                                   timeout_keep_alive=KEEP_ALIVE_S))
        self._task: asyncio.Task | None = None

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> AsgiServer:
        self._task = asyncio.create_task(self.server.serve(sockets=[self.sock]))
        while not self.server.started:
            if self._task.done():
                await self._task  # raises what stopped it
                raise RuntimeError("the HTTP server stopped at start")
            await asyncio.sleep(0.02)
        return self

    async def stop(self) -> None:
        self.server.should_exit = True
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        self.sock.close()
