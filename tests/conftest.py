"""Shared fixtures: one embedded broker per session, the prepared model, unique topic prefixes per
test, local servers. Helpers live in tests/support."""

from __future__ import annotations

import asyncio
import http.server
import inspect
import os
import re
import sys
import sysconfig
import threading
import time
import uuid
from pathlib import Path

import pytest
import pytest_asyncio

from pipeline.runtime.broker.embedded import EmbeddedBroker

pytest_plugins = ["tests.support.fixtures", "tests.support.workers"]  # the shared product stack; two workers

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
    """SmolLM2 prepared once per run from the packaged GGUF (what `llmpipe models prepare` does). The
    xdist workers share one copy: prepare() serialises on a lock file and reuses a checksummed one."""
    from pipeline.engines.model_prep import prepare

    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent / "models"
        shared.mkdir(exist_ok=True)
        return Path(prepare(shared).path)
    return Path(prepare(tmp_path_factory.mktemp("models")).path)


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}."


# ---- lanes: `make test` runs everything; `make test-fast` runs `-m "not integration and not model"` --

# A test using one of these (directly or through another fixture) needs a broker, a stack or vLLM.
INTEGRATION_FIXTURES = frozenset({"broker", "prepared_model", "review_stack", "product_stack"})
# A test, or a fixture it uses, that constructs one of these loads a model in this process.
MODEL_LOADER = re.compile(r"\b(Embedder|Masker|TextAnalyzer|MobileNetEncoder|narrower_for)\(")
# What neither rule sees (a test's own broker or `llmpipe up`, a model behind a helper): a file or a
# test id, its marker and why. The fast lane's guard below fails a test that belongs here.
MARKED: dict[str, tuple[str, str]] = {
    "tests/test_doorbell.py::test_a_broker_that_is_not_ours_on_our_port_is_refused":
        ("integration", "starts two Tansu brokers of its own"),
    "tests/test_broker_gate.py::test_tansu_loses_an_acknowledged_record_produced_before_its_topic_exists":
        ("integration", "starts a Tansu broker of its own"),
    "tests/test_broker_gate.py::test_the_keeper_restarts_the_broker_behind_a_closed_gate_and_opens_it_once_the_topics_exist":
        ("integration", "its keeper starts a Tansu broker"),
    "tests/test_embedder.py": ("model", "the embedder, in ONNX and in torch"),
    "tests/test_cache_eval.py": ("model", "`llmpipe cache-eval` in this process loads the embedder"),
    "tests/test_mask_recall.py": ("model", "`llmpipe mask-eval` in this process loads the masker"),
    "tests/test_mask.py::test_stage_evidence_counts_types_and_never_text": ("model", "MaskStage builds a masker"),
    "tests/test_mask_redos.py::test_the_masker_fails_closed_on_a_timeout": ("model", "its helper builds a masker"),
}


def _source(fn: object, cache: dict[object, str] = {}) -> str:  # noqa: B006 - a cache on purpose
    if fn not in cache:
        try:
            cache[fn] = inspect.getsource(fn)  # type: ignore[arg-type]
        except (OSError, TypeError):
            cache[fn] = ""
    return cache[fn]


def _loads_model(item: pytest.Item) -> bool:
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    funcs = [getattr(item, "function", None), *(d.func for name in item.fixturenames for d in defs.get(name, ()))]
    return any(MODEL_LOADER.search(_source(f)) for f in funcs if f is not None)


@pytest.hookimpl(tryfirst=True)  # MARKED holds node ids as collected (xdist appends @group later)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if INTEGRATION_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
        if _loads_model(item):
            item.add_marker(pytest.mark.model)
        for key in (item.nodeid, item.nodeid.split("::")[0]):
            if key in MARKED:
                item.add_marker(getattr(pytest.mark, MARKED[key][0]))


def _fast_lane(config: pytest.Config) -> bool:
    return "not integration" in (config.getoption("markexpr", "") or "")


class _LaneGuard:
    """The fast lane's audit hook: a broker (Tansu), a stack or worker (`llmpipe up|worker|...`), vLLM
    or a model-loading command started as a process, vLLM imported, or model weights opened in this
    process (the embedder's, spaCy's, Kiwi's, the vision encoder's, SmolLM2's) fail the test that did
    it (an error at its teardown)."""

    STACK_COMMANDS = frozenset({"up", "worker", "broker", "serve", "demo"})
    MODEL_COMMANDS = frozenset({"cache-eval", "cache-fit", "mask", "mask-eval", "models", "profile"})
    # the packaged models' files (a test's own small adapter in tmp is not a model load)
    PACKAGES = tuple({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})
    WEIGHTS = (".safetensors", ".gguf", ".pth", ".pt", ".onnx", ".mdl", "/model")  # spaCy's: <pipe>/model

    def __init__(self) -> None:
        self.current = "collection"
        self.seen: list[tuple[str, str]] = []  # (test id, what it started)
        self.lock = threading.Lock()

    def what(self, event: str, args: tuple) -> str | None:
        if event == "import":
            return "vLLM (import vllm)" if args[0] == "vllm" else None
        if event == "open":
            path = args[0] if isinstance(args[0], str) else None
            if path and path.endswith(self.WEIGHTS) and path.startswith(self.PACKAGES):
                return f"a model (opened {path})"
            return None
        argv = [str(a) for a in (args[1] if isinstance(args[1], (list, tuple)) else [args[1] or args[0]])]
        shown = " ".join(argv)[:200]
        if "tansu" in Path(argv[0]).name:
            return f"a broker: {shown}"
        if Path(argv[0]).name == "vllm" or any(a == "-m" and b.split(".")[0] == "vllm" for a, b in zip(argv, argv[1:])):
            return f"vLLM: {shown}"
        if "pipeline.cli" in argv:
            sub = argv[argv.index("pipeline.cli") + 1:][:1]
            if set(sub) & self.STACK_COMMANDS:
                return f"a stack or worker: {shown}"
            if set(sub) & self.MODEL_COMMANDS:
                return f"a model (in a child): {shown}"
        return None

    def __call__(self, event: str, args: tuple) -> None:
        if event not in ("subprocess.Popen", "import", "open"):
            return
        try:
            found = self.what(event, args)
        except Exception:
            return
        if found:
            with self.lock:
                self.seen.append((self.current, found))

    def take(self, nodeid: str) -> list[str]:
        with self.lock:
            mine = [w for n, w in self.seen if n == nodeid]
            self.seen = [(n, w) for n, w in self.seen if n != nodeid]
        return mine


_guard: _LaneGuard | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _guard
    if _fast_lane(config) and _guard is None:
        _guard = _LaneGuard()
        sys.addaudithook(_guard)  # for the life of this process, which is this run


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    if _guard is not None:
        _guard.current = nodeid


@pytest.fixture(autouse=True)
def _fast_lane_starts_nothing(request: pytest.FixtureRequest):
    yield
    if _guard is not None and (started := _guard.take(request.node.nodeid)):
        unique = list(dict.fromkeys(started))
        shown = "; ".join(unique[:3]) + (f" (and {len(unique) - 3} more)" if len(unique) > 3 else "")
        pytest.fail(f"the fast lane must start no broker, stack, vLLM or model, and this test started "
                    f"{shown}: mark it (MARKED in tests/conftest.py) or give it a fixture the "
                    "lanes know", pytrace=False)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    left = _guard.seen if _guard is not None else []
    if left:  # outside a test's own teardown: at collection, or a module or session fixture's
        sys.stderr.write("fast lane: started outside a test: " + "; ".join(f"{n}: {w}" for n, w in left) + "\n")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


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
        def do_GET(self):
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
