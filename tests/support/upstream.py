"""bench/mock_upstream.py as a child process: an OpenAI-compatible upstream over real HTTP that
answers at once, or fails, stalls or dies on purpose (its fault-injection options), for tests of
what generate does with its deployments, without a model.

    with mock_upstream("--fail-first", "2") as up:
        ... {"engine": "openai", "base_url": up.base_url} ...
        assert up.stats()["requests"] == 3
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from pipeline.runtime.broker.embedded import free_port
from tests.support.paths import ROOT
from tests.support.waits import poll

SCRIPT = ROOT / "bench" / "mock_upstream.py"


class Upstream:
    """One mock upstream on a fixed port: `start` it (again after `kill`, on the same port: the
    deployment came back), `kill` it (dies abruptly, mid-stream answers cut), read its `stats`
    (with `--control`, which is always passed here)."""

    def __init__(self, *args: str, port: int | None = None, log: Path | None = None) -> None:
        self.args, self.port, self.log = list(args), port or free_port(), log
        self.proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float = 30) -> Upstream:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        out = open(self.log, "ab") if self.log is not None else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen([sys.executable, str(SCRIPT), "--port", str(self.port), "--control",
                                          *self.args], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        finally:
            if self.log is not None:
                out.close()  # type: ignore[union-attr]  # the child keeps its own descriptor
        poll(self._health, bool, timeout, f"mock upstream {self.args} on port {self.port}", interval=0.05)
        return self

    def _health(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"mock upstream {self.args} exited with {self.proc.returncode}"
                                 + (f": {self.log.read_text(errors='replace')[-2000:]}" if self.log else ""))
        try:  # /health, not just an open port: free_port's port may have been taken by another process
            return httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=1, trust_env=False).status_code == 200
        except httpx.HTTPError:
            return False

    def stats(self) -> dict[str, Any]:
        """Chat completions received (`requests`), answering now (`in_flight`), `failed` on purpose,
        `served`, and the last 64 request `bodies`."""
        r = httpx.get(f"http://127.0.0.1:{self.port}/mock/stats", timeout=5, trust_env=False)
        r.raise_for_status()
        return r.json()

    def kill(self) -> None:
        """SIGKILL: connections reset mid-answer, new ones refused, as a crashed deployment."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


@contextmanager
def mock_upstream(*args: str, port: int | None = None, log: Path | None = None) -> Iterator[Upstream]:
    """A started mock upstream (`args`: bench/mock_upstream.py's options), stopped on exit."""
    up = Upstream(*args, port=port, log=log)
    try:
        yield up.start()
    finally:
        up.stop()
