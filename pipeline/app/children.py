"""`llmpipe up --processes`: one `llmpipe worker` child process per stage group, restarted when
one dies, with a growing backoff while it keeps dying soon after its start."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client import Counter

from pipeline.config.settings import CONFIG_ENV, Settings
from pipeline.stages.sink.warehouse import SINK_STAGE

log = logging.getLogger(__name__)

_WORKER_RESTARTS = Counter("llmpipe_worker_restarts", "stage worker processes restarted by the supervisor", ("stage",))


# Ten processes (model preparation, vLLM, three embedders, Presidio, chDB) start together on the
# 2-core reference host: the HTTP-door topology measured 165-200 s to ready, so 180 s was a coin flip.
READY_TIMEOUT_S = 300.0


class StackError(RuntimeError):
    pass


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


@dataclass
class Restarts:
    """One worker's deaths, for the crash-loop backoff and `llmpipe status`."""

    started_at: float = field(default_factory=time.monotonic)
    count: int = 0  # restarts since the stack started
    in_a_row: int = 0  # deaths within STABLE_S of their start, in a row
    last_exit: int | None = None
    next_start: float | None = None  # monotonic; set while a restart waits out its backoff


# a worker that lived this long before dying is not crash-looping: its next restart is at once
STABLE_S = 60.0
MAX_RESTART_BACKOFF_S = 60.0


def restart_backoff_s(in_a_row: int) -> float:
    """0 for the first death after a stable run, then 1, 2, 4 ... s, at most MAX_RESTART_BACKOFF_S."""
    return 0.0 if in_a_row <= 1 else min(MAX_RESTART_BACKOFF_S, 2.0 ** (in_a_row - 2))


class ChildWorkers:
    """--processes: one `llmpipe worker` child per stage group, restarted when one dies (with a
    growing backoff while it keeps dying soon after its start)."""

    def __init__(self, settings: Settings, stages: list[str], bootstrap: str, admin_port: int) -> None:
        self.settings = settings
        self.stages = stages
        self.bootstrap = bootstrap
        self.admin_port = admin_port
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.restarts: dict[str, Restarts] = {}
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

    async def start(self) -> ChildWorkers:
        """Spawn the sink (with the admin endpoint) and every stage group; return when all consume."""
        self.logs.mkdir(parents=True, exist_ok=True)
        for stage in [SINK_STAGE, *self.stages]:
            self.procs[stage] = self._spawn(stage)
        await _wait_http(f"http://127.0.0.1:{self.admin_port}/health", 120)
        await self.wait_ready(READY_TIMEOUT_S)
        return self

    async def supervise(self, stop: asyncio.Event, on_restart: Callable[[str, Restarts], None] | None = None) -> None:
        """1. A worker that exited: its process group is killed (what it started dies with it) and its
           restart is due after restart_backoff_s (at once unless it keeps dying within STABLE_S).
        2. A restart that is due: spawn it again, count it, tell `on_restart`."""
        while not stop.is_set():
            now = time.monotonic()
            for stage, proc in list(self.procs.items()):
                r = self.restarts.setdefault(stage, Restarts())
                if r.next_start is None and proc.poll() is not None:  # step 1
                    _kill_group(proc.pid)  # a worker killed -9 leaves vLLM's engine core running, orphaned
                    r.in_a_row = r.in_a_row + 1 if now - r.started_at < STABLE_S else 1
                    r.last_exit = proc.returncode
                    wait_s = restart_backoff_s(r.in_a_row)
                    r.next_start = now + wait_s
                    log.warning("worker %s exited with %s (%d in a row within %.0f s of their start); restarting "
                                "in %.0f s", stage, proc.returncode, r.in_a_row, STABLE_S, wait_s)
                if r.next_start is not None and now >= r.next_start:  # step 2
                    self.procs[stage] = self._spawn(stage)
                    r.count, r.next_start, r.started_at = r.count + 1, None, time.monotonic()
                    _WORKER_RESTARTS.labels(stage).inc()
                    if on_restart is not None:
                        on_restart(stage, r)
            try:
                async with asyncio.timeout(0.5):
                    await stop.wait()
            except TimeoutError:
                pass

    def _broker_view(self, stage: str, pid: int) -> dict:
        """What the running child last wrote (write_worker_health); stale or another pid's: unknown."""
        try:
            doc = json.loads(worker_health_file(self.settings.resolved_data_dir(), stage).read_text())
        except (OSError, ValueError):
            return {"state": "unknown"}
        if doc.get("pid") != pid or time.time() - doc.get("at", 0) > 5:
            return {"state": "unknown", "reason": "no recent report from this worker"}
        return doc["broker"]

    def state(self) -> dict[str, dict]:
        out = {}
        for stage, proc in self.procs.items():
            r = self.restarts.get(stage, Restarts())
            state = "waiting to restart" if r.next_start is not None else \
                "running" if proc.poll() is None else "exited"
            out[stage] = {"state": state, "pid": proc.pid, "restarts": r.count, "deaths_in_a_row": r.in_a_row,
                          "last_exit_code": r.last_exit, "broker": self._broker_view(stage, proc.pid)}
        return out

    async def stop(self) -> None:
        """SIGTERM every child (they drain), SIGKILL what is left after the drain timeout."""
        timeout_s = self.settings.runtime.drain_timeout_s + 10
        for stage in reversed(list(self.procs)):
            proc = self.procs[stage]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in self.procs.values():
            while proc.poll() is None and time.monotonic() < deadline:  # noqa: ASYNC110 - an exit has no event
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


def worker_health_file(data_dir: Path, stage: str) -> Path:
    return data_dir / "run" / f"worker-{stage}.health.json"


async def write_worker_health(data_dir: Path, stage: str, workers: list, every_s: float = 1.0) -> None:
    """In a worker child: its broker view (each StageWorker's BrokerWatch), for the supervisor."""
    path = worker_health_file(data_dir, stage)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        views = [w.broker.state() for w in workers if getattr(w, "broker", None) is not None]
        down = [v for v in views if v["state"] != "up"]
        doc = {"at": round(time.time(), 3), "pid": os.getpid(), "broker": (down or views or [{"state": "unknown"}])[0]}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(path)
        await asyncio.sleep(every_s)


async def run_reported(data_dir: Path, stage: str, workers: list, run: Callable) -> None:
    """`await run()` while write_worker_health reports the workers' broker view every second."""
    report = asyncio.create_task(write_worker_health(data_dir, stage, workers))
    try:
        await run()
    finally:
        report.cancel()
