"""`llmpipe up` / `llmpipe down`: the embedded stack and its record in DATA_DIR/stack.json.

The supervisor (the `up` process) owns, in start order: the broker (embedded Tansu unless
--bootstrap names one), the topics, the warehouse with its admin/SQL endpoint (in whichever
process runs the sink), and the stage workers - in-process by default, or one child process
per stage group with --processes (restarted if they die). It writes stack.json once all are
ready, and on SIGTERM stops them in reverse order and removes the file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from pipeline.config.settings import CONFIG_ENV, Settings
from pipeline.dev_key import ensure_dev_tenant
from pipeline.ingress.http import FrontDoor, HttpServer
from pipeline.runtime.broker import EmbeddedBroker, free_port
from pipeline.runtime.doorbell import default_dir as default_doorbell_dir
from pipeline.runtime.launch import FEEDBACK_HOST, feedback_worker, sink_worker, stage_worker, start_all
from pipeline.runtime.metrics import serve_metrics
from pipeline.runtime.service import serve
from pipeline.runtime.topics import apply_topics
from pipeline.runtime.topology import Topology
from pipeline.stores.owners import Owners
from pipeline.stores.sql_gateway import AdminServer, admin_token_for, warehouse_query
from pipeline.stores.warehouse import open_warehouse
from pipeline.stores.warehouse_sink import SINK_STAGE

log = logging.getLogger(__name__)

STACK_FILE = "stack.json"


# Ten processes (model preparation, vLLM, three embedders, Presidio, chDB) start together on the
# 2-core reference host: the HTTP-door topology measured 165-200 s to ready, so 180 s was a coin flip.
READY_TIMEOUT_S = 300.0


class StackError(RuntimeError):
    pass


@dataclass
class StackInfo:
    bootstrap: str
    admin_url: str
    http_url: str | None
    topic_prefix: str
    warehouse_dsn: str
    stages: list[str]
    pids: dict[str, int] = field(default_factory=dict)
    metrics_url: str | None = None
    started_at: float = field(default_factory=time.time)
    doorbell_dir: str | None = None  # the stack's wake-up hints; CLI clients ring and doze there too
    dev_key_new: bool = False  # this start created the development key (`llmpipe up` shows it once)

    def write(self, data_dir: Path) -> None:
        tmp = data_dir / (STACK_FILE + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(data_dir / STACK_FILE)

    @classmethod
    def read(cls, data_dir: Path) -> "StackInfo | None":
        path = data_dir / STACK_FILE
        if not path.exists():
            return None
        return cls(**json.loads(path.read_text()))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def running_stack(data_dir: Path) -> StackInfo | None:
    info = StackInfo.read(data_dir)
    if info is None or not pid_alive(info.pids.get("supervisor", -1)):
        return None
    return info


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


class _ChildWorkers:
    """--processes: one `llmpipe worker` child per stage group, restarted when one dies."""

    def __init__(self, settings: Settings, stages: list[str], bootstrap: str, admin_port: int) -> None:
        self.settings = settings
        self.stages = stages
        self.bootstrap = bootstrap
        self.admin_port = admin_port
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs = settings.resolved_data_dir() / "logs"

    def _spawn(self, stage: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, "LLMPIPE_BOOTSTRAP": self.bootstrap,
               "LLMPIPE_DATA_DIR": str(self.settings.resolved_data_dir()),
               "LLMPIPE_TOPIC_PREFIX": self.settings.topic_prefix,
               "LLMPIPE_ADMIN_PORT": str(self.admin_port)}  # the feedback worker asks the warehouse who owns what
        if self.settings.doorbell_dir:
            env["LLMPIPE_DOORBELL_DIR"] = str(self.settings.doorbell_dir)
        if self.settings._config_file:  # the workers read the supervisor's config file
            env[CONFIG_ENV] = self.settings._config_file
        cmd = [sys.executable, "-m", "pipeline.cli", "worker", stage, "--ready-file", str(self.ready_file(stage))]
        self.ready_file(stage).unlink(missing_ok=True)
        if stage == SINK_STAGE:
            cmd += ["--admin-port", str(self.admin_port)]
        log_file = open(self.logs / f"worker-{stage}.log", "ab")
        try:
            # its own process group: when it dies, what it started (vLLM's engine core) goes with it
            return subprocess.Popen(cmd, env=env, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        finally:
            log_file.close()

    def ready_file(self, stage: str) -> Path:
        return self.settings.resolved_data_dir() / "run" / f"worker-{stage}.ready"

    async def wait_ready(self, timeout_s: float) -> None:
        """Every child consumes (models loaded, changelogs caught up) before the stack says ready."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for stage, proc in self.procs.items():
                if proc.poll() is not None:
                    raise StackError(f"worker {stage} exited with {proc.returncode} at start; see "
                                     f"{self.logs / f'worker-{stage}.log'}")
            if all(self.ready_file(s).exists() for s in self.procs):
                return
            await asyncio.sleep(0.1)
        raise StackError(f"workers not ready within {timeout_s:.0f}s: "
                         f"{[s for s in self.procs if not self.ready_file(s).exists()]}")

    async def start(self) -> "_ChildWorkers":
        """Spawn the sink (with the admin endpoint) and every stage group; return when all consume."""
        self.logs.mkdir(parents=True, exist_ok=True)
        for stage in [SINK_STAGE, *self.stages]:
            self.procs[stage] = self._spawn(stage)
        await _wait_http(f"http://127.0.0.1:{self.admin_port}/health", 120)
        await self.wait_ready(READY_TIMEOUT_S)
        return self

    async def supervise(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            for stage, proc in list(self.procs.items()):
                if proc.poll() is not None:
                    log.warning("worker %s exited with %s; restarting", stage, proc.returncode)
                    _kill_group(proc.pid)  # a worker killed -9 leaves vLLM's engine core running, orphaned
                    self.procs[stage] = self._spawn(stage)
            try:
                async with asyncio.timeout(1.0):
                    await stop.wait()
            except TimeoutError:
                pass

    async def stop(self) -> None:
        """SIGTERM every child (they drain), SIGKILL what is left after the drain timeout."""
        timeout_s = self.settings.runtime.drain_timeout_s + 10
        for stage in reversed(list(self.procs)):
            proc = self.procs[stage]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in self.procs.values():
            while proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            _kill_group(proc.pid)  # anything it left behind


async def _wait_http(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient() as client:
        while time.monotonic() < deadline:
            try:
                if (await client.get(url, timeout=1.0)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
    raise StackError(f"{url} did not become healthy within {timeout_s:.0f}s")


async def run_stack(settings: Settings, processes: bool = False,
                    on_ready: Callable[[StackInfo], None] | None = None) -> None:
    """The supervisor.

    1. Refuse a second stack on the data dir, and a topology with a stage that does not load.
       With the embedded broker, give every process of the stack one doorbell dir
       (runtime/doorbell.py), unless one is configured or `consumer.doorbell` is off.
    2. Start the broker (embedded unless `bootstrap` names one), apply the topics, ensure the dev tenant.
    3. Start the stages: one child process per group (`processes`), or workers in this loop with
       the sink and the admin endpoint.
    4. Open the front door, write stack.json, call `on_ready`.
    5. On SIGTERM/SIGINT: remove stack.json, close the door, drain the stages, then stop the rest in
       reverse order of start (every part is a Service on one AsyncExitStack).
    """
    data_dir = settings.resolved_data_dir()
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # keys, evidence, blobs: the owner's alone
    if running_stack(data_dir):
        raise StackError(f"a stack is already running for {data_dir} (llmpipe down first)")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with AsyncExitStack() as parts:
        parts.callback(_forget, data_dir)  # however it ends
        settings = _with_doorbell(settings, data_dir, parts)
        up = _Up(settings, Topology(settings), stop, on_ready)
        if not settings.bootstrap:
            broker = await serve(parts, EmbeddedBroker(data_dir, settings.broker_port))
            up.bootstrap = broker.bootstrap
            if broker.proc is not None:
                up.pids["broker"] = broker.proc.pid
        await apply_topics(up.bootstrap, settings.topic_prefix, up.topology.topic_registry())
        up.dev_key_new = bool(await ensure_dev_tenant(settings, up.bootstrap))
        for name in up.stages:
            up.topology.stage_class(name)  # fail fast on a bad topology, before anything runs
        admin_port = settings.admin_port or free_port()
        admin_token = admin_token_for(settings)  # created before a sink child reads the same file
        if processes:
            await _run_children(up, parts, admin_port)
        else:
            await _run_in_loop(up, parts, admin_port, admin_token)


@dataclass
class _Up:
    """What run_stack has started so far, for the step that announces it."""

    settings: Settings
    topology: Topology
    stop: asyncio.Event
    on_ready: Callable[[StackInfo], None] | None
    bootstrap: str = ""
    dev_key_new: bool = False
    pids: dict[str, int] = field(default_factory=lambda: {"supervisor": os.getpid()})

    def __post_init__(self) -> None:
        self.bootstrap = self.bootstrap or self.settings.bootstrap or ""

    @property
    def stages(self) -> list[str]:
        return list(self.topology.order)

    def announce(self, admin_url: str, http_url: str, metrics_url: str | None = None) -> None:
        s = self.settings
        info = StackInfo(self.bootstrap, admin_url, http_url, s.topic_prefix, s.resolved_warehouse_dsn(), self.stages,
                         self.pids, metrics_url, dev_key_new=self.dev_key_new,
                         doorbell_dir=str(s.doorbell_dir) if s.doorbell_dir else None)
        info.write(s.resolved_data_dir())
        if self.on_ready is not None:
            self.on_ready(info)
        log.info("stack ready: broker %s, admin %s, stages %s", self.bootstrap, admin_url, self.stages or "none")


def _with_doorbell(settings: Settings, data_dir: Path, parts: AsyncExitStack) -> Settings:
    """The embedded broker never wakes a waiting fetch: without hints every consumer polls
    (docs/ARCHITECTURE.md, "The doorbell"). A configured dir is kept as it is."""
    if settings.bootstrap or settings.doorbell_dir or not settings.consumer.doorbell:
        return settings
    bells = default_doorbell_dir(data_dir)
    if bells is None:
        log.warning("no doorbell: no private short directory for its sockets; consumers poll instead")
        return settings
    parts.callback(shutil.rmtree, bells, True)  # after every process of the stack stopped
    return settings.model_copy(update={"doorbell_dir": bells})


def _forget(data_dir: Path) -> None:
    (data_dir / STACK_FILE).unlink(missing_ok=True)


async def _run_children(up: _Up, parts: AsyncExitStack, admin_port: int) -> None:
    s = up.settings
    children = await serve(parts, _ChildWorkers(s, up.stages, up.bootstrap, admin_port))
    up.pids.update({f"worker:{name}": p.pid for name, p in children.procs.items()})
    supervise = asyncio.create_task(children.supervise(up.stop))
    # unwound before the children stop (LIFO): a supervisor still running would restart each child
    # as it exits and leave the new one behind when the door fails to open
    parts.push_async_callback(_cancel, supervise)
    admin_url = f"http://127.0.0.1:{admin_port}"
    http = await serve(parts, HttpServer(FrontDoor(s, up.bootstrap, door_owners(s, admin_url)), s.http.host,
                                         s.http.port))
    up.announce(admin_url, http.url)
    await up.stop.wait()
    await supervise
    _forget(s.resolved_data_dir())  # then the door closes, then the children drain (the exit stack)


def door_owners(s: Settings, admin_url: str) -> Owners:
    """The front door asks the warehouse who owns a request before it takes feedback on it."""
    return Owners(warehouse_query(s, admin_url), wait_s=s.feedback.owner_wait_s)


async def _cancel(task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _run_in_loop(up: _Up, parts: AsyncExitStack, admin_port: int, admin_token: str) -> None:
    s = up.settings
    warehouse = open_warehouse(s)
    parts.callback(warehouse.close)
    await asyncio.to_thread(warehouse.migrate)
    admin = await serve(parts, AdminServer(warehouse, admin_port, admin_token))
    metrics_url = None
    if s.metrics_port is not None:
        metrics_url = f"http://127.0.0.1:{serve_metrics(s.metrics_port, s.metrics_host)}/metrics"
    workers = [sink_worker(s, up.bootstrap, warehouse)] + [stage_worker(s, up.topology, n, up.bootstrap)
                                                           for n in up.stages]
    if FEEDBACK_HOST in up.stages:
        workers.append(feedback_worker(s, up.bootstrap, admin.url))
    ready = asyncio.Event()
    door: list[HttpServer] = []

    async def announce() -> None:
        await ready.wait()
        door.append(await HttpServer(FrontDoor(s, up.bootstrap, door_owners(s, admin.url)), s.http.host,
                                     s.http.port).start())
        up.announce(admin.url, door[0].url, metrics_url)

    async def close_door() -> None:  # before the stages drain: no new requests meanwhile
        _forget(s.resolved_data_dir())
        while door:
            await door.pop().stop()

    parts.push_async_callback(close_door)  # also when a stage fails to start
    announcer = asyncio.create_task(announce())
    try:
        await _run_workers(workers, up.stop, ready, close_door)
        await announcer
    finally:
        announcer.cancel()


async def _run_workers(workers, stop: asyncio.Event, ready: asyncio.Event, before_stop) -> None:
    # upstream stages first in the stop order: reverse the start order except the sink, which goes last
    ordered = workers[1:] + workers[:1]
    started = []
    try:
        started = await start_all(workers)
        ready.set()
        await stop.wait()
        await before_stop()
    finally:
        for w in ordered:
            if w in started:
                await w.stop()


def start_detached(argv: list[str], data_dir: Path, timeout_s: float = READY_TIMEOUT_S + 60) -> StackInfo:
    """Run `llmpipe up` (argv without --detach) in the background; return once stack.json is written."""
    logs = data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / "stack.log", "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", *argv], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, env=dict(os.environ))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = StackInfo.read(data_dir)
        if info is not None and info.pids.get("supervisor") == proc.pid:
            return info
        if proc.poll() is not None:
            tail = (logs / "stack.log").read_text(errors="replace").strip().splitlines()[-5:]
            raise StackError(f"llmpipe up exited with {proc.returncode}: " + " | ".join(tail))
        time.sleep(0.1)
    _stop_group(proc)  # nothing half-started may outlive the failed start
    raise StackError(f"the stack was not ready within {timeout_s:.0f}s; see {logs / 'stack.log'}")


def _stop_group(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM the supervisor's whole process group (workers, engines), SIGKILL what is left after `grace_s`."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            continue
        try:  # the supervisor is gone; give its children the rest of the grace period
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                os.killpg(proc.pid, 0)
                time.sleep(0.2)
        except ProcessLookupError:
            return


def stop_stack(data_dir: Path, timeout_s: float = 90.0) -> StackInfo | None:
    info = StackInfo.read(data_dir)
    if info is None:
        return None
    pid = info.pids.get("supervisor", -1)
    if pid_alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if pid_alive(pid):
            for p in info.pids.values():
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    (data_dir / STACK_FILE).unlink(missing_ok=True)
    return info
