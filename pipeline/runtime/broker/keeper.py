"""The supervisor's watch over the embedded broker: a broker that dies is started again.

Tansu's memory storage loses everything with its process: topics, records in flight, committed
offsets, the compacted `control` log. The stack's processes reconnect on their own (aiokafka
reconnects, consumers rejoin their groups and start from the earliest offset of the new, empty
topics); what they need from the supervisor is a broker on the same address, with the topics.

Protocol:

1. Every `check_s`, see whether the broker process is alive.
2. Dead: log it (with its exit code), count it, and start it again on the same port. While starts
   fail, wait 1, 2, 4 ... s (with jitter, at most `max_backoff_s`) between them.
3. Started: the broker epoch is bumped (runtime/broker/epoch.py: every consumer that keeps its own
   position reads again from offset 0), then `on_restart(event)` applies what the storage lost (the
   topics, the development tenant) and records the restart where operators and analysts look (runtime/stack_events.py). It is
   retried, a second apart, until it succeeds or the broker dies again.
4. `state()` says how often it restarted, when it last died and why, for `llmpipe status`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import Counter

from pipeline.runtime.broker.embedded import EmbeddedBroker
from pipeline.runtime.broker.epoch import bump
from pipeline.runtime.service import BackgroundTask

log = logging.getLogger(__name__)

_RESTARTS = Counter("llmpipe_broker_restarts", "embedded broker restarts by the supervisor")


@dataclass
class BrokerRestart:
    restart: int  # 1, 2, ... since the stack started
    exit_code: int | None
    died_at: float  # wall clock, s
    down_s: float  # from noticing the death to the broker answering again


class BrokerKeeper:
    def __init__(self, broker: EmbeddedBroker, on_restart: Callable[[BrokerRestart], Awaitable[None]],
                 epoch_file: Path, *, check_s: float = 0.5, max_backoff_s: float = 30.0) -> None:
        self.broker, self.on_restart, self.epoch_file = broker, on_restart, epoch_file
        self.check_s, self.max_backoff_s = check_s, max_backoff_s
        self.restarts = 0
        self.last: BrokerRestart | None = None
        self.down_since: float | None = None
        self._task = BackgroundTask("broker-keeper")

    async def start(self) -> BrokerKeeper:
        self._task.launch(self._loop)
        return self

    async def stop(self) -> None:
        """Before the broker itself stops: a keeper would restart a broker the stack is shutting down."""
        await self._task.cancel()

    def state(self) -> dict:
        return {"state": "down" if self.down_since is not None else "up", "restarts": self.restarts,
                "last_exit_code": self.last.exit_code if self.last else None,
                "last_died_at": round(self.last.died_at, 3) if self.last else None,
                "last_down_s": round(self.last.down_s, 2) if self.last else None}

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.check_s)
            proc = self.broker.proc
            if proc is None or proc.poll() is None:
                continue
            await self._restart(proc.returncode)  # step 2

    async def _restart(self, code: int | None) -> None:
        died = time.time()
        t0 = time.monotonic()
        self.down_since = died
        log.error("the embedded broker exited with %s; restarting it on %s (its memory storage lost every "
                  "record in flight)", code, self.broker.bootstrap)
        backoff = 1.0
        while True:
            try:
                await self.broker.start()
                break
            except Exception as exc:  # noqa: BLE001 - keep trying: the stack is useless without it
                log.error("the embedded broker did not start again (%s); next try in %.0f s", exc, backoff)
                await asyncio.sleep(backoff * random.uniform(0.8, 1.2))
                backoff = min(self.max_backoff_s, backoff * 2)
        bump(self.epoch_file)  # step 3 first: consumers must not keep positions from the old logs
        self.restarts += 1
        _RESTARTS.inc()
        event = BrokerRestart(self.restarts, code, died, time.monotonic() - t0)
        self.last = event
        while self.broker.proc is not None and self.broker.proc.poll() is None:  # step 3
            try:
                await self.on_restart(event)
                break
            except Exception as exc:  # noqa: BLE001 - keep trying: the stack is useless without it
                log.error("after the broker restart: re-applying its state failed (%s); again in 1 s", exc)
                await asyncio.sleep(1.0)
        self.down_since = None
        log.warning("the embedded broker is back after %.1f s (restart %d)", event.down_s, self.restarts)
