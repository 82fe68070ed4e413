"""Shared fixtures: one embedded broker per session, unique topic prefixes per test, and helpers
to run stage workers and the warehouse sink as real processes."""

from __future__ import annotations

import asyncio
import http.server
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from pipeline.config.settings import Settings, StageSpec, worker_config_yaml
from pipeline.runtime.broker import EmbeddedBroker, free_port
from pipeline.runtime.topics import apply_topics
from pipeline.runtime.topology import Topology
from pipeline.stores.sql_gateway import ensure_admin_token, query_via_admin

ROOT = Path(__file__).resolve().parents[1]
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


def settings_for(tmp_path: Path, prefix: str, bootstrap: str, stages: list[dict[str, Any]], **extra: Any) -> Settings:
    return Settings(data_dir=tmp_path, topic_prefix=prefix, bootstrap=bootstrap,
                    stages=[StageSpec.model_validate(s) for s in stages], **extra)


async def create_topics(settings: Settings) -> None:
    assert settings.bootstrap
    await apply_topics(settings.bootstrap, settings.topic_prefix, Topology(settings).topic_registry())


async def wait_until(cond: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll a condition (sync or async) until truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = cond()
        if asyncio.iscoroutine(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


class Proc:
    """A `llmpipe worker` child process configured through a YAML file and environment."""

    def __init__(self, stage: str, settings: Settings, log: Path, env: dict[str, str] | None = None,
                 args: list[str] | None = None) -> None:
        cfg = log.with_suffix(".yaml")
        cfg.write_text(worker_config_yaml(settings))
        full_env = {**os.environ, "LLMPIPE_CONFIG": str(cfg), "LLMPIPE_BOOTSTRAP": settings.bootstrap or "",
                    "LLMPIPE_TOPIC_PREFIX": settings.topic_prefix, "LLMPIPE_DATA_DIR": str(settings.data_dir),
                    **(env or {})}
        self.log = log
        with open(log, "ab") as out:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "worker", stage, *(args or [])],
                                         cwd=ROOT, env=full_env, stdout=out, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill9(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def tail(self, n: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


class Sink:
    """The warehouse sink as its own process (it owns its chDB directory), queried over its admin API."""

    def __init__(self, settings: Settings, tmp_path: Path) -> None:
        self.port = free_port()
        s = settings.model_copy(update={"data_dir": tmp_path / "sink"})
        (tmp_path / "sink").mkdir(exist_ok=True)
        self.proc = Proc("sink", s, tmp_path / "sink.log", args=["--admin-port", str(self.port)])
        self.url = f"http://127.0.0.1:{self.port}"
        self.data_dir = tmp_path / "sink"

    async def ready(self) -> None:
        def ok() -> bool:
            if self.proc.proc.poll() is not None:
                raise AssertionError(f"sink exited: {self.proc.tail()}")
            try:
                return httpx.get(f"{self.url}/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        await wait_until(ok, 60, "sink admin endpoint")

    def query(self, sql: str, params: dict[str, Any] | None = None) -> list[tuple]:
        # the sink process's admin token: the same DATA_DIR/secrets/admin.token (created by whoever is first)
        return query_via_admin(self.url, sql, params, token=ensure_admin_token(self.data_dir)).rows

    def scalar(self, sql: str) -> Any:
        return self.query(sql)[0][0]

    def stop(self) -> None:
        self.proc.stop()


async def read_topic(bootstrap: str, topic: str, count: int, timeout: float = 60,
                     quiet_s: float | None = None) -> list:
    """Read `topic` from the beginning (all partitions) until `count` records arrived, or with
    `quiet_s`, until none arrived for that long after the first."""
    from aiokafka import AIOKafkaConsumer

    # a fetch returns as soon as it has records; a short wait lets the embedded broker answer a
    # slow read (a loaded host, a long partition) with none (runtime/bellpoll.py, step 2a)
    c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False,
                         fetch_max_wait_ms=100, group_id=None)
    await c.start()
    got: list = []
    try:
        deadline = last = time.monotonic()
        deadline += timeout
        while len(got) < count and time.monotonic() < deadline:
            if quiet_s is not None and got and time.monotonic() - last >= quiet_s:
                break
            batches = await asyncio.wait_for(c.getmany(timeout_ms=200), 10)
            for recs in batches.values():
                got.extend(recs)
                last = time.monotonic()
    finally:
        await c.stop()
    return got


async def read_until_quiet(bootstrap: str, topic: str, quiet_s: float = 2.0, timeout: float = 120) -> list:
    """Every record of `topic`, duplicates included (what a table read with FINAL would hide), until
    none arrives for `quiet_s`. Not up to `end_offsets()`: the embedded broker under-reports them
    after a multi-record batch (DESIGN.md)."""
    return await read_topic(bootstrap, topic, 10**9, timeout, quiet_s=quiet_s)


@pytest_asyncio.fixture(loop_scope="session")
async def image_server():
    """A local image server (tests/media_servers.py); allow-list it with `test_allow`."""
    from tests.media_servers import ImageServer

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
