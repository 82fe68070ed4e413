"""Stage workers and the warehouse sink as real child processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from pipeline.config.settings import Settings, worker_config_yaml
from pipeline.ingress.admin import ensure_admin_token, query_via_admin
from pipeline.runtime.broker.embedded import free_port
from tests.support.paths import ROOT
from tests.support.waits import wait_until


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

