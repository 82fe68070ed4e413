"""The supervisor's watch over the embedded broker: a broker that dies is started again.

Tansu's memory storage loses everything with its process: topics, records in flight, committed
offsets, the compacted `control` log. The stack's processes reconnect on their own (aiokafka
reconnects, consumers rejoin their groups and start from the earliest offset of the new, empty
topics); what they need from the supervisor is a broker on the same address, with the topics.

Protocol:

1. Every `check_s`, see whether the broker process is alive.
2. Dead: log it (with its exit code) and close the stack's produce gate (runtime/broker/gate.py);
   wait `settle_s` for every record the stack's producers held to be delivered or given up.
3. Start it again on the same port. While starts fail, wait 1, 2, 4 ... s (with jitter, at most
   `max_backoff_s`) between them.
4. Started: the broker epoch is bumped (runtime/broker/epoch.py: every consumer that keeps its own
   position reads again from offset 0); `restore()` creates the topics the storage lost (retried a
   second apart until it succeeds or the broker dies again); then the gate opens.
5. `on_restart(event)` applies the rest (the development tenant) and records the restart where
   operators and analysts look (runtime/stack_events.py); retried like step 4.
6. `state()` says how often it restarted, when it last died and why, for `llmpipe status`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from prometheus_client import Counter

from pipeline.runtime.broker import gate
from pipeline.runtime.broker.embedded import EmbeddedBroker
from pipeline.runtime.broker.epoch import bump
from pipeline.runtime.service import BackgroundTask

log = logging.getLogger(__name__)

T = TypeVar("T")
_RESTARTS = Counter("llmpipe_broker_restarts", "embedded broker restarts by the supervisor")


@dataclass
class BrokerRestart:
    restart: int  # 1, 2, ... since the stack started
    exit_code: int | None
    died_at: float  # wall clock, s
    down_s: float  # from noticing the death to the new broker with its topics (the gate open)
    repaired: list[str]  # topics a reconnecting client had auto-created with the wrong partition count


class BrokerKeeper:
    def __init__(self, broker: EmbeddedBroker, restore: Callable[[], Awaitable[list[str]]],
                 on_restart: Callable[[BrokerRestart], Awaitable[None]], epoch_file: Path, gate_file: Path, *,
                 check_s: float = 0.5, max_backoff_s: float = 30.0, settle_s: float | None = None) -> None:
        self.broker, self.restore, self.on_restart = broker, restore, on_restart
        self.epoch_file, self.gate_file = epoch_file, gate_file
        self.check_s, self.max_backoff_s = check_s, max_backoff_s
        self.settle_s = gate.settle_s() if settle_s is None else settle_s
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
        if gate.is_closed():  # stopped mid-restart: this process's producers must not wait forever
            gate.open_(self.gate_file)

    async def _retried(self, what: str, step: Callable[[], Awaitable[T]]) -> T | None:
        """The step's result; None when the broker died again before it succeeded."""
        while self.broker.proc is not None and self.broker.proc.poll() is None:
            try:
                return await step()
            except Exception as exc:  # noqa: BLE001 - keep trying: the stack is useless without it
                log.error("after the broker restart: %s failed (%s); again in 1 s", what, exc)
                await asyncio.sleep(1.0)
        return None

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
        log.error("the embedded broker exited with %s; restarting it on %s in %.1f s, once the stack's producers "
                  "have let go of what they held (its memory storage lost every record in flight)", code,
                  self.broker.bootstrap, self.settle_s)
        gate.close(self.gate_file)  # step 2
        await asyncio.sleep(self.settle_s)
        backoff = 1.0
        while True:
            try:
                await self.broker.start()
                break
            except Exception as exc:  # noqa: BLE001 - keep trying: the stack is useless without it
                log.error("the embedded broker did not start again (%s); next try in %.0f s", exc, backoff)
                await asyncio.sleep(backoff * random.uniform(0.8, 1.2))
                backoff = min(self.max_backoff_s, backoff * 2)
        bump(self.epoch_file)  # step 4 first: consumers must not keep positions from the old logs
        self.restarts += 1
        _RESTARTS.inc()
        repaired = await self._retried("creating its topics", self.restore)
        if repaired is None:
            return  # died again meanwhile: the loop restarts it, the gate still closed
        gate.open_(self.gate_file)
        event = BrokerRestart(self.restarts, code, died, time.monotonic() - t0, repaired)
        self.last = event
        await self._retried("re-applying its state", lambda: self.on_restart(event))  # step 5
        self.down_since = None
        log.warning("the embedded broker is back after %.1f s (restart %d)", event.down_s, self.restarts)
