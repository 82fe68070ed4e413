"""Wake-up hints for a broker that never wakes a waiting fetch (the embedded one, DESIGN.md): a
producer rings the consumers of the topics it has just written, and an idle consumer stops
fetching until its bell rings. Without hints every consumer must poll every few milliseconds to
keep hops fast, and on this broker each poll costs about 1 ms of CPU (docs/ARCHITECTURE.md).

Only for processes on one host that share `doorbell_dir` (the embedded stack). A Kafka cluster
wakes a waiting fetch itself, so a long fetch wait there needs no hints.

Protocol:

1. A consumer's `Bell` binds one unix datagram socket per topic it reads, at
   `doorbell_dir/<topic hash>/<pid>-<random>.sock`, and the event loop reads it.
2. A producer's `Ringer`, when the broker has acknowledged a send, sends one datagram to every
   socket of that topic (listed at most once a second). Rings of one loop turn are coalesced. A
   socket nobody reads any more (its process died) is unlinked; a full socket buffer means that
   bell is already ringing.
3. A consumer that found nothing for `doze_after_ms` pauses its partitions and waits for its bell,
   at most `doze_max_ms`, then resumes them and fetches. A ring that came before the pause keeps
   the bell set, so that doze ends at once: a wake-up is never lost, and a lost datagram (or a
   producer that does not ring) costs at most `doze_max_ms` of latency.
4. Hints are never needed for correctness: records are read from the broker as always.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

from aiokafka import AIOKafkaProducer

MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes on Linux
LISTING_TTL_S = 1.0


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

    async def start(self) -> "Bell":
        self._event = asyncio.Event()
        loop = asyncio.get_running_loop()
        name = f"{os.getpid()}-{uuid.uuid4().hex[:8]}.sock"
        try:
            for t in self.topics:
                d = topic_dir(self.directory, t)
                d.mkdir(parents=True, exist_ok=True)
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
        return rang

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
                    Path(path).unlink(missing_ok=True)  # its process is gone
                    self._listing.pop(t, None)
                except OSError:
                    pass  # a hint: never fail a send for it

    def _listeners(self, topic: str) -> list[str]:
        now = time.monotonic()
        cached = self._listing.get(topic)
        if cached is None or cached[0] < now:
            try:
                paths = [str(p) for p in topic_dir(self.directory, topic).glob("*.sock")]
            except OSError:
                paths = []
            cached = self._listing[topic] = (now + LISTING_TTL_S, paths)
        return cached[1]

    def close(self) -> None:
        self._sock.close()


class RingingProducer(AIOKafkaProducer):
    """An AIOKafkaProducer that rings a topic's consumers once the broker acknowledged a send to it."""

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


def producer_class(doorbell_dir: Path | None) -> tuple[type[AIOKafkaProducer], dict]:
    """The producer class and its extra kwargs for a process with (or without) a doorbell dir."""
    return (RingingProducer, {"doorbell_dir": doorbell_dir}) if doorbell_dir else (AIOKafkaProducer, {})
