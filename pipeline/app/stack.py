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

from pipeline.app.assemble import check_policies, topology_for
from pipeline.app.children import READY_TIMEOUT_S, STABLE_S, ChildWorkers, Restarts, StackError
from pipeline.app.dev_key import ensure_dev_tenant
from pipeline.app.launch import open_group, stack_groups, start_all
from pipeline.config.settings import Settings
from pipeline.ingress.admin import admin_token_for, warehouse_query
from pipeline.ingress.http import FrontDoor, HttpServer
from pipeline.runtime.broker import gate
from pipeline.runtime.broker.embedded import EmbeddedBroker, free_port, private_dir
from pipeline.runtime.broker.epoch import EPOCH_FILE
from pipeline.runtime.broker.gate import GATE_FILE
from pipeline.runtime.broker.keeper import BrokerKeeper, BrokerRestart
from pipeline.runtime.broker.roll import ROLL_FILE, RollClock, RollEvent, RollHooks, compacted
from pipeline.runtime.serve.metrics import serve_metrics
from pipeline.runtime.service import serve
from pipeline.runtime.stack_events import publish_stack_event, stack_event
from pipeline.runtime.topics import apply_topics, repair_topics
from pipeline.runtime.topology import Topology
from pipeline.runtime.wakeup.doorbell import default_dir as default_doorbell_dir
from pipeline.stages.sink.warehouse import SINK_STAGE
from pipeline.stores.owners import Owners

log = logging.getLogger(__name__)

STACK_FILE = "stack.json"
HEALTH_FILE = "run/health.json"  # the supervisor's view, rewritten every second (`llmpipe status`)




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
    def read(cls, data_dir: Path) -> StackInfo | None:
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


async def run_stack(settings: Settings, processes: bool = False,
                    on_ready: Callable[[StackInfo], None] | None = None) -> None:
    """The supervisor.

    1. Refuse a second stack on the data dir, and a topology with a stage that does not load.
       With the embedded broker, give every process of the stack one doorbell dir
       (runtime/wakeup/doorbell.py), unless one is configured or `consumer.doorbell` is off.
    2. Start the broker (embedded unless `bootstrap` names one), apply the topics, ensure the dev tenant.
    3. Start the stages: one child process per group (`processes`), or workers in this loop with
       the sink and the admin endpoint.
    4. Open the front door, write stack.json, call `on_ready`.
    5. On SIGTERM/SIGINT: remove stack.json, close the door, drain the stages, then stop the rest in
       reverse order of start (every part is a Service on one AsyncExitStack).
    """
    data_dir = settings.resolved_data_dir()
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # keys, evidence, blobs: the owner's alone
    private_dir(data_dir)  # an existing one too: ours, and nobody else may write it (runtime/broker/embedded.py)
    if running_stack(data_dir):
        raise StackError(f"a stack is already running for {data_dir} (llmpipe down first)")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with AsyncExitStack() as parts:
        parts.callback(_forget, data_dir)  # however it ends
        settings = _with_doorbell(settings, data_dir, parts)
        topology = topology_for(settings)
        check_policies(topology)  # a policy typo fails here, before the broker starts
        up = _Up(settings, topology, stop, on_ready)
        broker = None
        if not settings.bootstrap:
            broker = await serve(parts, EmbeddedBroker(data_dir, settings.broker_port))
            up.bootstrap = broker.bootstrap
            if broker.proc is not None:
                up.pids["broker"] = broker.proc.pid
        await apply_topics(up.bootstrap, settings.topic_prefix, up.topology.topic_registry())
        up.dev_key_new = bool(await ensure_dev_tenant(settings, up.bootstrap))
        if broker is not None:  # stopped before the broker (LIFO): a stopping stack restarts nothing
            gate.open_(data_dir / GATE_FILE)  # one left by a stack that died while its broker restarted
            up.keeper = await serve(parts, BrokerKeeper(
                broker, lambda: _topics_restored(up), lambda ev: _broker_restored(up, broker, ev),
                data_dir / EPOCH_FILE, data_dir / GATE_FILE, roll=_roll_hooks(up, broker, data_dir)))
        for name in up.stages:
            up.topology.stage_class(name)  # fail fast on a bad topology, before anything runs
        admin_port = settings.admin_port or free_port()
        admin_token = admin_token_for(settings)  # created before a sink child reads the same file
        if processes:
            await _run_children(up, parts, admin_port)
        else:
            await _run_in_loop(up, parts, admin_port, admin_token)


async def _topics_restored(up: _Up) -> list[str]:
    """BrokerKeeper step 4, the stack's produce gate still closed: the topics the memory storage lost."""
    s = up.settings
    registry = up.topology.topic_registry()
    await apply_topics(up.bootstrap, s.topic_prefix, registry)
    repaired = await repair_topics(up.bootstrap, s.topic_prefix, registry)
    if up.door is not None:
        # acknowledged by the old broker, which is gone (the gate kept every later publish waiting)
        up.door_lost = up.door.client.lost_before(time.time(), "the event broker restarted and lost this request "
                                                               "before it was answered; retry it (with an "
                                                               "Idempotency-Key a retry never runs a request twice)")
    if repaired:
        log.warning("after the broker restart: %d topic(s) had been auto-created by a reconnecting client with "
                    "the wrong partition count and were created again: %s", len(repaired), ", ".join(repaired))
    return repaired


async def _broker_restored(up: _Up, broker: EmbeddedBroker, ev: BrokerRestart) -> None:
    """BrokerKeeper step 5, the gate open: the development tenant, then the event where operators look."""
    s = up.settings
    lost, repaired = up.door_lost, ev.repaired
    await ensure_dev_tenant(s, up.bootstrap)
    up.broker_started(broker)
    await publish_stack_event(s, up.bootstrap, stack_event(
        "broker", "broker_restarted",
        f"the embedded broker exited with {ev.exit_code} and was started again after {ev.down_s:.1f} s; its memory "
        "storage lost every record in flight: requests in flight then got no pipeline answer (their callers got "
        f"503 or 504 from the front door: {lost} waiting at this door were answered 503 broker_restarted at once), "
        "and keys issued at run time since the start must be issued again",
        scores={"down_s": round(ev.down_s, 2), "restart": float(ev.restart), "door_requests_lost": float(lost),
                "topics_repaired": float(len(repaired))},
        labels={"exit_code": str(ev.exit_code)}))


def _roll_hooks(up: _Up, broker: EmbeddedBroker, data_dir: Path) -> RollHooks:
    """What the keeper's planned roll needs from this stack (runtime/broker/roll.py)."""
    s = up.settings
    (data_dir / ROLL_FILE).unlink(missing_ok=True)  # asked of a stack that is gone

    def hold() -> None:
        if up.door is not None:
            up.door.hold_max_s = s.embedded_broker.roll_drain_s + 30.0  # the drain, then the restart
            up.door.hold()

    async def release() -> None:
        if up.door is not None:
            await up.door.release()

    async def rolled(ev: RollEvent) -> None:
        up.broker_started(broker)
        await publish_stack_event(s, up.bootstrap, stack_event(
            "broker", "broker_rolled",
            f"the embedded broker was rolled ({ev.why}): the stack went quiet in {ev.drain_s:.1f} s with new requests "
            f"held at the door, the broker was down {ev.down_s:.1f} s, and {ev.carried} record(s) of the compacted "
            "topics were carried over; nothing in flight was lost",
            scores={"roll": float(ev.roll), "rss_mib": ev.rss_mib, "drain_s": ev.drain_s, "down_s": ev.down_s,
                    "carried": float(ev.carried)}))

    return RollHooks(RollClock(s.embedded_broker, data_dir / ROLL_FILE), hold, release,
                     lambda: up.door.in_flight() if up.door is not None else 0, stack_groups(s, up.topology),
                     {s.topic_prefix + name: schema for name, schema in compacted(up.topology.topic_registry()).items()},
                     rolled, s.kafka)


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
    keeper: BrokerKeeper | None = None  # the embedded broker's, once the topics are applied
    door: FrontDoor | None = None
    door_lost: int = 0  # callers answered 503 at the last broker restart
    workers: Callable[[], dict[str, dict]] | None = None  # --processes: each child's state
    _tasks: set[asyncio.Task] = field(default_factory=set)

    def event_soon(self, event) -> None:
        """Publish a stack event without waiting (the broker may be the part that is down)."""
        task = asyncio.get_running_loop().create_task(publish_stack_event(self.settings, self.bootstrap, event))
        self._tasks.add(task)

        def done(t: asyncio.Task) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.warning("a stack event (%s) could not be published: %s", event.decision, t.exception())

        task.add_done_callback(done)

    def broker_started(self, broker: EmbeddedBroker) -> None:
        """A restarted or rolled broker is a new process: stack.json names it (`llmpipe down` reaps it)."""
        if broker.proc is not None:
            self.pids["broker"] = broker.proc.pid
            self.rewrite_pids()

    def rewrite_pids(self) -> None:
        """stack.json names the processes running now (`llmpipe down` reaps them and what they started)."""
        info = StackInfo.read(self.settings.resolved_data_dir())
        if info is not None:
            info.pids = dict(self.pids)
            info.write(self.settings.resolved_data_dir())

    def not_ready_because(self) -> str | None:
        """The door's readiness, beyond its own view of the broker: not while the broker restarts."""
        if self.keeper is not None and self.keeper.down_since is not None:
            return "the embedded broker is restarting"
        return None

    def health(self) -> dict:
        """What `llmpipe status` shows: the broker, each worker, the door's view of the broker."""
        broker = self.keeper.state() if self.keeper is not None else {"state": "external", "bootstrap": self.bootstrap}
        workers = self.workers() if self.workers is not None else \
            {name: {"state": "running", "pid": os.getpid(), "in": "supervisor"} for name in self.groups}
        return {"at": round(time.time(), 3), "broker": broker, "workers": workers,
                "door": {"broker": self.door.broker.state()} if self.door is not None and self.door.broker else None}

    async def write_health(self, stop: asyncio.Event) -> None:
        path = self.settings.resolved_data_dir() / HEALTH_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        while not stop.is_set():
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.health(), indent=2))
            tmp.replace(path)
            try:
                async with asyncio.timeout(1.0):
                    await stop.wait()
            except TimeoutError:
                pass

    def __post_init__(self) -> None:
        self.bootstrap = self.bootstrap or self.settings.bootstrap or ""

    @property
    def stages(self) -> list[str]:
        return list(self.topology.order)

    @property
    def groups(self) -> list[str]:
        """One worker group per chain (a stage not chained is a chain of one)."""
        return self.topology.groups()

    def announce(self, admin_url: str, http_url: str, metrics_url: str | None = None) -> None:
        s = self.settings
        info = StackInfo(self.bootstrap, admin_url, http_url, s.topic_prefix, s.resolved_warehouse_dsn(), self.stages,
                         self.pids, metrics_url, dev_key_new=self.dev_key_new,
                         doorbell_dir=str(s.doorbell_dir) if s.doorbell_dir else None)
        info.write(s.resolved_data_dir())
        writer = asyncio.get_running_loop().create_task(self.write_health(self.stop), name="stack-health")
        self._tasks.add(writer)
        writer.add_done_callback(self._tasks.discard)
        if self.on_ready is not None:
            self.on_ready(info)
        log.info("stack ready: broker %s, admin %s, stages %s", self.bootstrap, admin_url, self.stages or "none")


def _with_doorbell(settings: Settings, data_dir: Path, parts: AsyncExitStack) -> Settings:
    """The embedded broker never wakes a waiting fetch: without hints every consumer polls
    (docs/decisions/0002-doorbell-wake-up.md). A configured dir is kept as it is."""
    if settings.bootstrap or settings.doorbell_dir or not settings.consumer.doorbell:
        return settings
    bells = default_doorbell_dir(data_dir)
    if bells is None:
        log.warning("no doorbell: no private short directory for its sockets; consumers poll instead")
        return settings
    parts.callback(shutil.rmtree, bells, True)  # after every process of the stack stopped
    return settings.model_copy(update={"doorbell_dir": bells})


def read_health(data_dir: Path, http_url: str | None) -> dict:
    """The supervisor's last health.json (stale after `stale_s`: said so) and the door's /readyz now."""
    path = data_dir / HEALTH_FILE
    try:
        health = json.loads(path.read_text())
    except (OSError, ValueError):
        health = {"error": f"no readable {path}"}
    if health.get("at") and time.time() - health["at"] > 5:
        health["stale"] = f"written {time.time() - health['at']:.0f} s ago: is the supervisor stuck?"
    if http_url:
        try:
            r = httpx.get(http_url.rstrip("/") + "/readyz", timeout=3)
            health["ready"] = r.json()
        except (httpx.HTTPError, ValueError) as exc:
            health["ready"] = {"ready": False, "reason": f"the door did not answer /readyz: {type(exc).__name__}"}
    return health


def ask_broker_roll(data_dir: Path, wait_s: float) -> dict:
    """`llmpipe roll-broker`: ask the supervisor's keeper for a roll (ROLL_FILE) and wait for its health
    to count one more; the broker's health then. StackError when it does not roll in time."""
    info = running_stack(data_dir)
    if info is None:
        raise StackError(f"no stack is running for {data_dir}")
    before = read_health(data_dir, None).get("broker") or {}
    if before.get("state") == "external" or "rolls" not in before:
        raise StackError("this stack's broker is not the embedded one: a Kafka cluster applies its own retention")
    path = data_dir / ROLL_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("asked by llmpipe roll-broker\n")
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        time.sleep(0.5)
        broker = read_health(data_dir, None).get("broker") or {}
        if broker.get("rolls", 0) > before["rolls"]:
            return broker
        if broker.get("rolls_put_off", 0) > before.get("rolls_put_off", 0):
            raise StackError("the broker roll was put off: the stack did not go quiet (see the supervisor's log)")
    raise StackError(f"the broker did not roll within {wait_s:.0f} s (see the supervisor's log)")


def _forget(data_dir: Path) -> None:
    (data_dir / STACK_FILE).unlink(missing_ok=True)
    (data_dir / HEALTH_FILE).unlink(missing_ok=True)


async def _run_children(up: _Up, parts: AsyncExitStack, admin_port: int) -> None:
    s = up.settings
    children = await serve(parts, ChildWorkers(s, up.groups, up.bootstrap, admin_port))
    up.pids.update({f"worker:{name}": p.pid for name, p in children.procs.items()})
    up.workers = children.state

    def restarted(stage: str, r: Restarts) -> None:
        up.pids[f"worker:{stage}"] = children.procs[stage].pid
        up.rewrite_pids()
        up.event_soon(stack_event(
            "worker", "worker_restarted",
            f"worker {stage} exited with {r.last_exit} and was started again (restart {r.count}; {r.in_a_row} "
            f"death(s) in a row within {STABLE_S:.0f} s of their start)",
            scores={"restarts": float(r.count), "deaths_in_a_row": float(r.in_a_row)},
            labels={"worker": stage, "exit_code": str(r.last_exit)}))

    supervise = asyncio.create_task(children.supervise(up.stop, restarted))
    # unwound before the children stop (LIFO): a supervisor still running would restart each child
    # as it exits and leave the new one behind when the door fails to open
    parts.push_async_callback(_cancel, supervise)
    admin_url = f"http://127.0.0.1:{admin_port}"
    http = await serve(parts, HttpServer(FrontDoor(s, up.bootstrap, door_owners(s, admin_url)), s.http.host,
                                         s.http.port))
    up.door = http.door
    up.door.not_ready_because = up.not_ready_because
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
    metrics_url = None
    if s.metrics_port is not None:
        metrics_url = f"http://127.0.0.1:{serve_metrics(s.metrics_port, s.metrics_host)}/metrics"
    workers = []
    for group in (SINK_STAGE, *up.groups):
        workers += await open_group(parts, s, up.topology, group, up.bootstrap, admin_port, admin_token)
    admin_url = f"http://127.0.0.1:{admin_port}"
    ready = asyncio.Event()
    door: list[HttpServer] = []

    async def announce() -> None:
        await ready.wait()
        door.append(await HttpServer(FrontDoor(s, up.bootstrap, door_owners(s, admin_url)), s.http.host,
                                     s.http.port).start())
        up.door = door[0].door
        up.door.not_ready_because = up.not_ready_because
        up.announce(admin_url, door[0].url, metrics_url)

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
            os.kill(pid, signal.SIGKILL)
    reap_groups([p for name, p in info.pids.items() if name != "supervisor"])
    (data_dir / STACK_FILE).unlink(missing_ok=True)
    (data_dir / HEALTH_FILE).unlink(missing_ok=True)
    return info


def reap_groups(leaders: list[int], grace_s: float = 10.0) -> None:
    """What is left of the stack's process groups (each worker and the broker lead one; vLLM's engine
    processes are in their worker's), after a supervisor that stopped them, or died without doing so:
    SIGTERM, then SIGKILL after `grace_s`."""
    def left() -> list[int]:
        alive = []
        for g in leaders:
            try:
                os.killpg(g, 0)
                alive.append(g)
            except (ProcessLookupError, PermissionError):
                pass
        return alive

    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        groups = left()
        if not groups:
            return
        for g in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(g, sig)
        deadline = time.monotonic() + wait_s
        while left() and time.monotonic() < deadline:
            time.sleep(0.1)
