"""Shared fixtures: one embedded broker per session, the prepared model, unique topic prefixes per
test, local servers. Helpers live in tests/support."""

from __future__ import annotations

import asyncio
import http.server
import os
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import pytest_asyncio

from pipeline.runtime.broker import EmbeddedBroker

# Every process we start (and this one) keeps torch/BLAS to one thread on 2 cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _dump_asyncio_tasks(what: str) -> None:
    """Print the stack of every pending asyncio task (pytest-timeout prints only threads, and a
    hung async test sits idle in the loop's select, so its threads say nothing)."""
    import traceback

    tasks: list[asyncio.Task] = []
    for _ in range(3):  # the WeakSet may change while another thread runs the loop
        try:
            tasks = [t for t in list(asyncio.tasks._all_tasks) if not t.done()]  # type: ignore[attr-defined]
            break
        except RuntimeError:
            time.sleep(0.01)
    else:
        return
    out = [f"==== {what}: {len(tasks)} pending asyncio tasks ===="]
    for t in tasks:
        out.append(f"--- {t.get_name()} {t.get_coro()!r}")
        aw = t.get_coro()
        while aw is not None:  # follow the await chain down to the future it waits on
            frame = getattr(aw, "cr_frame", None) or getattr(aw, "gi_frame", None)
            if frame is None:
                out.append(f"    waits on {aw!r}"[:300])
                break
            out.append("".join(traceback.format_stack(frame, limit=1)).rstrip())
            aw = getattr(aw, "cr_await", None) or getattr(aw, "gi_yieldfrom", None)
    print("\n".join(out), file=sys.stderr, flush=True)


@pytest.fixture(autouse=True)
def _task_dump_before_timeout(request: pytest.FixtureRequest):
    """Shortly before pytest-timeout fails a test, say where each asyncio task waits."""
    marker = request.node.get_closest_marker("timeout")
    limit = float(marker.args[0]) if marker and marker.args else float(request.config.getini("timeout") or 0)
    if limit <= 30:
        yield
        return
    timer = threading.Timer(limit - 20, _dump_asyncio_tasks, args=(request.node.nodeid,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def broker(tmp_path_factory: pytest.TempPathFactory) -> EmbeddedBroker:
    b = await EmbeddedBroker(tmp_path_factory.mktemp("broker")).start()
    yield b
    b.stop()


@pytest.fixture(scope="session")
def prepared_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2 prepared once per session from the packaged GGUF (what `llmpipe models prepare` does)."""
    from pipeline.engines.model_prep import prepare

    return Path(prepare(tmp_path_factory.mktemp("models")).path)


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}."










@pytest_asyncio.fixture(loop_scope="session")
async def image_server():
    """A local image server (tests/support/media_servers.py); allow-list it with `test_allow`."""
    from tests.support.media_servers import ImageServer

    server = await ImageServer().start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
def listener():
    """A local HTTP server that counts every request made to it (it stands in for the cloud
    metadata address when a test proves that nothing connects there)."""
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            hits.append(self.path)
            body = b'{"type": "string"}'
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", hits
    server.shutdown()
