"""Wake-up hints for a broker that never wakes a waiting fetch (the embedded one, Tansu): a
producer rings the consumers of the topics it has just written, and an idle consumer stops
fetching until its bell rings. Without hints every consumer must poll every few milliseconds to
keep hops fast, and on this broker each poll costs about 1 ms of CPU (docs/decisions/0002-doorbell-wake-up.md).

Only for processes on one host that share `doorbell_dir` (the embedded stack). A Kafka cluster
wakes a waiting fetch itself, so a long fetch wait there needs no hints.

Protocol:

1. A consumer's `Bell` binds one unix datagram socket per topic it reads, at
   `doorbell_dir/<topic hash>/<pid>-<random>.sock`, and the event loop reads it.
2. A producer's `Ringer`, when the broker has acknowledged a send, sends one datagram to every
   socket of that topic (listed at most once a second). Rings of one loop turn are coalesced. A
   socket nobody reads any more (its process died) is unlinked; a full socket buffer means that
   bell is already ringing.
3. A consumer whose fetch found nothing pauses its partitions and waits for its bell, at most
   `doze_max_ms`, then resumes them and fetches (runtime/wakeup/bellpoll.py: fetches that never wait). A
   ring that came before the pause keeps the bell set, so that doze ends at once: a wake-up is
   never lost, and a lost datagram (or a producer that does not ring) costs at most `doze_max_ms`.
4. Hints are never needed for correctness: records are read from the broker as always.
5. Records fetched right after a doze that ended unrung, with no ring by the time the fetch
   returned (a ring follows its record within a fetch's round trip), came from a producer outside
   the doorbell (a client of the broker's own, a worker started without the dir). After
   `UNRUNG_TO_WAKE` such fetches within `UNRUNG_WINDOW_S` the bell stays awake for
   `AWAKE_AFTER_UNRUNG_S`: the consumer polls as it would without a bell, so such a producer's
   records wait for a fetch, not for doze_max. One is not enough: a doze can time out just as a
   ringing producer's record lands. A bell younger than `UNRUNG_GRACE_S` does not judge:
   producers list a new socket up to `LISTING_TTL_S` late.
6. The dir is this user's alone (`check_private`): a bell refuses to start in a dir that another
   user owns or that group or others may write (they could plant sockets that learn when the
   stack works, flood every ringer with sockets, or delete ours), and creates what it adds 0700.
   A ringer rings (and unlinks, when refused) only sockets this user owns, never a link, in a dir
   that passes the same check; in any other dir it rings nobody.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import stat
import tempfile
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

from aiokafka import AIOKafkaProducer

from pipeline.runtime.broker.gate import GatedProducer

MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes on Linux
LISTING_TTL_S = 1.0
UNRUNG_GRACE_S = 2 * LISTING_TTL_S
UNRUNG_TO_WAKE = 2
UNRUNG_WINDOW_S = 30.0
AWAKE_AFTER_UNRUNG_S = 60.0
# the longest socket name below a doorbell dir: "/<12 hex>/<pid, 7 digits>-<8 hex>.sock"
_LONGEST_NAME = 1 + 12 + 1 + 7 + 1 + 8 + 5


class DoorbellError(ValueError):
    """A doorbell dir that is not this user's alone (step 6)."""


def check_private(directory: Path) -> None:
    """Step 6: raise DoorbellError unless `directory` is a dir of this user that no one else may write."""
    st = directory.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise DoorbellError(f"doorbell_dir {directory} is not a directory")
    if st.st_uid != os.getuid():
        raise DoorbellError(f"doorbell_dir {directory} belongs to uid {st.st_uid}, not to this user ({os.getuid()})")
    if st.st_mode & 0o022:
        raise DoorbellError(f"doorbell_dir {directory} may be written by group or others (mode "
                            f"{stat.S_IMODE(st.st_mode):o}): `chmod go-w` it, or choose a private dir")


def _own_socket(path: Path) -> bool:
    try:
        st = path.lstat()  # a link is not followed: it is not a socket
    except OSError:
        return False
    return stat.S_ISSOCK(st.st_mode) and st.st_uid == os.getuid()


def topic_dir(directory: Path, topic: str) -> Path:
    # a hash, not the topic name: unix socket paths are short
    return directory / hashlib.sha1(topic.encode()).hexdigest()[:12]


class Bell:
    """A consumer's bell for `topics`: `await start()`, `await wait(timeout_s)`, `stop()`."""

    def __init__(self, directory: Path, topics: Iterable[str]) -> None:
        self.directory = directory
        self.topics = sorted(set(topics))
        self._socks: list[tuple[socket.socket, Path]] = []
        self._event: asyncio.Event | None = None
        self.rings = 0
        self.unrung = 0  # arrivals judged to come from a producer that does not ring (step 5)
        self._started = 0.0
        self._awake_until = 0.0
        self._timed_out = False
        self._unrung_at: list[float] = []

    async def start(self) -> Bell:
        self._event = asyncio.Event()
        self._started = time.monotonic()
        loop = asyncio.get_running_loop()
        name = f"{os.getpid()}-{uuid.uuid4().hex[:8]}.sock"
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        check_private(self.directory)
        try:
            for t in self.topics:
                d = topic_dir(self.directory, t)
                d.mkdir(mode=0o700, exist_ok=True)
                check_private(d)
                path = d / name
                if len(str(path)) > MAX_SOCKET_PATH:
                    raise ValueError(f"doorbell_dir {self.directory} is too long for a unix socket path "
                                     f"({len(str(path))} > {MAX_SOCKET_PATH} bytes): choose a shorter one")
                s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                s.setblocking(False)
                s.bind(str(path))
                self._socks.append((s, path))
                loop.add_reader(s.fileno(), self._on_ring, s)
        except BaseException:
            self.stop()
            raise
        return self

    def _on_ring(self, s: socket.socket) -> None:
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while s.recv(16):  # drain: any number of rings is one wake-up
                self.rings += 1
        assert self._event is not None
        self._event.set()

    def wake(self) -> None:
        """Ring from inside the process (e.g. partitions were just assigned)."""
        if self._event is not None:
            self._event.set()

    async def wait(self, timeout_s: float) -> bool:
        """True when the bell rang (now or since the last wait), False after `timeout_s`."""
        assert self._event is not None, "start() the bell first"
        rang = self._event.is_set()
        if not rang:
            try:
                async with asyncio.timeout(timeout_s):
                    await self._event.wait()
                rang = True
            except TimeoutError:
                pass
        self._event.clear()
        self._timed_out = not rang
        return rang

    def fetched(self, records: int) -> None:
        """Step 5: tell the bell what the fetch after a doze found."""
        now = time.monotonic()
        rang_since = self._event is not None and self._event.is_set()
        if records and self._timed_out and not rang_since and now - self._started >= UNRUNG_GRACE_S:
            self.unrung += 1
            self._unrung_at = [t for t in self._unrung_at if now - t < UNRUNG_WINDOW_S] + [now]
            if len(self._unrung_at) >= UNRUNG_TO_WAKE:
                self._awake_until = now + AWAKE_AFTER_UNRUNG_S
        self._timed_out = False

    @property
    def may_doze(self) -> bool:
        return time.monotonic() >= self._awake_until

    def stop(self) -> None:
        """Idempotent."""
        socks, self._socks = self._socks, []
        for s, path in socks:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(s.fileno())
            s.close()
            path.unlink(missing_ok=True)


class Ringer:
    """A producer's side: `ring_soon(topic)` after an acknowledged send."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.setblocking(False)
        self._listing: dict[str, tuple[float, list[str]]] = {}
        self._pending: set[str] = set()
        self._scheduled = False
        self.sent = 0

    def ring_soon(self, topic: str) -> None:
        self._pending.add(topic)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._ring)

    def _ring(self) -> None:
        self._scheduled = False
        topics, self._pending = self._pending, set()
        for t in topics:
            for path in self._listeners(t):
                try:
                    self._sock.sendto(b"!", path)
                    self.sent += 1
                except (BlockingIOError, InterruptedError):
                    pass  # its buffer is full: it has rings to read already
                except (ConnectionRefusedError, FileNotFoundError):
                    if _own_socket(Path(path)):  # its process is gone (listed: ours, in a private dir)
                        Path(path).unlink(missing_ok=True)
                    self._listing.pop(t, None)
                except OSError:
                    pass  # a hint: never fail a send for it

    def _listeners(self, topic: str) -> list[str]:
        now = time.monotonic()
        cached = self._listing.get(topic)
        if cached is None or cached[0] < now:
            d = topic_dir(self.directory, topic)
            try:
                check_private(self.directory)
                check_private(d)
                paths = [str(p) for p in d.glob("*.sock") if _own_socket(p)]
            except (OSError, DoorbellError):
                paths = []  # no bells yet, or a dir that is not ours alone: ring nobody
            cached = self._listing[topic] = (now + LISTING_TTL_S, paths)
        return cached[1]

    def close(self) -> None:
        self._sock.close()


class RingingProducer(GatedProducer):
    """A GatedProducer that rings a topic's consumers once the broker acknowledged a send to it."""

    def __init__(self, *args, doorbell_dir: Path, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.ringer = Ringer(doorbell_dir)

    async def send(self, topic, value=None, key=None, partition=None, timestamp_ms=None, headers=None):
        fut = await super().send(topic, value, key=key, partition=partition, timestamp_ms=timestamp_ms,
                                 headers=headers)
        fut.add_done_callback(lambda f: None if f.cancelled() or f.exception() else self.ringer.ring_soon(topic))
        return fut

    async def stop(self) -> None:
        await super().stop()
        self.ringer.close()


def default_dir(data_dir: Path) -> Path | None:
    """The embedded stack's bell dir: DATA_DIR/run/bells when a socket path below it fits, else a
    0700 dir of this user under the temp dir, named by a hash of the data dir. None (doorbell off,
    logged by the caller) when that name is taken by another user or open to others."""
    inside = data_dir.resolve() / "run" / "bells"
    if len(str(inside)) + _LONGEST_NAME <= MAX_SOCKET_PATH:
        inside.mkdir(mode=0o700, parents=True, exist_ok=True)
        if inside.stat().st_uid == os.getuid():
            inside.chmod(0o700)  # made by an older version with the umask's mode
        return inside
    tmp = Path(tempfile.gettempdir()) / f"llmpipe-bells-{hashlib.sha1(str(data_dir.resolve()).encode()).hexdigest()[:16]}"
    if len(str(tmp)) + _LONGEST_NAME > MAX_SOCKET_PATH:
        return None
    with contextlib.suppress(FileExistsError):
        tmp.mkdir(mode=0o700)
    st = tmp.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None  # another user's, or a link: its sockets could not be trusted to be ours
    return tmp


def producer_class(doorbell_dir: Path | None) -> tuple[type[AIOKafkaProducer], dict]:
    """The producer class and its extra kwargs for a process with (or without) a doorbell dir."""
    return (RingingProducer, {"doorbell_dir": doorbell_dir}) if doorbell_dir else (GatedProducer, {})
