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

Between checks the same loop rolls a live broker that grew too big (runtime/broker/roll.py): a
planned restart of a quiet stack that carries the compacted topics over.
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
from pipeline.runtime.broker.roll import RollEvent, RollHooks, carry, rss_mib, write_back
from pipeline.runtime.service import BackgroundTask

log = logging.getLogger(__name__)

T = TypeVar("T")
_RESTARTS = Counter("llmpipe_broker_restarts", "embedded broker restarts by the supervisor")
_ROLLS = Counter("llmpipe_broker_rolls", "planned rolls of the embedded broker (runtime/broker/roll.py)")
_ROLLS_POSTPONED = Counter("llmpipe_broker_rolls_postponed", "broker rolls put off: the stack did not go quiet")


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
                 check_s: float = 0.5, max_backoff_s: float = 30.0, settle_s: float | None = None,
                 roll: RollHooks | None = None) -> None:
        self.broker, self.restore, self.on_restart = broker, restore, on_restart
        self.epoch_file, self.gate_file = epoch_file, gate_file
        self.check_s, self.max_backoff_s = check_s, max_backoff_s
        self.settle_s = gate.settle_s() if settle_s is None else settle_s
        self.restarts = 0
        self.last: BrokerRestart | None = None
        self.down_since: float | None = None
        self.roll = roll
        self.rolls = 0
        self.rolls_put_off = 0
        self.last_roll: RollEvent | None = None
        self.rolling_since: float | None = None
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
                "last_down_s": round(self.last.down_s, 2) if self.last else None,
                "rolling": self.rolling_since is not None, "rolls": self.rolls, "rolls_put_off": self.rolls_put_off,
                "last_roll_why": self.last_roll.why if self.last_roll else None}

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.check_s)
            proc = self.broker.proc
            if proc is None:
                continue
            if proc.poll() is not None:
                await self._restart(proc.returncode)  # step 2
            elif self.roll is not None and (why := self.roll.clock.due(proc.pid)):
                await self._roll(why)

    async def _start_again(self) -> None:
        """Step 3: start the broker on its port, with a growing backoff while that fails."""
        backoff = 1.0
        while True:
            try:
                await self.broker.start()
                return
            except Exception as exc:  # noqa: BLE001 - keep trying: the stack is useless without it
                log.error("the embedded broker did not start again (%s); next try in %.0f s", exc, backoff)
                await asyncio.sleep(backoff * random.uniform(0.8, 1.2))
                backoff = min(self.max_backoff_s, backoff * 2)

    async def _quiet(self, within_s: float) -> str | None:
        """Roll step 3: None once the stack is quiet; else why not, after `within_s`."""
        assert self.roll is not None
        deadline = time.monotonic() + within_s
        while True:
            why = await self.roll.busy(self.broker.bootstrap)
            if why is None or time.monotonic() >= deadline:
                return why
            await asyncio.sleep(0.25)

    async def _roll(self, why: str) -> None:
        """runtime/broker/roll.py, steps 2-7."""
        r = self.roll
        assert r is not None and self.broker.proc is not None
        rss = rss_mib(self.broker.proc.pid) or 0.0
        t0 = time.monotonic()
        log.info("rolling the embedded broker: %s", why)
        r.hold()  # step 2
        try:
            if (busy := await self._quiet(r.clock.settings.roll_drain_s)) is None:  # step 3
                gate.close(self.gate_file)  # step 4
                await asyncio.sleep(2 * gate.WATCH_CHECK_S + 0.1)
                busy = await self._quiet(0)
                if busy is not None:
                    gate.open_(self.gate_file)
            if busy is not None:
                _ROLLS_POSTPONED.inc()
                self.rolls_put_off += 1
                r.clock.postponed()
                log.warning("the broker roll (%s) is put off for %.0f s: the stack did not go quiet (%s)", why,
                            r.clock.settings.roll_retry_s, busy)
                return
            t_gate = time.monotonic()
            log.info("broker roll: the stack was quiet after %.1f s; carrying its compacted topics", t_gate - t0)
            try:
                carried = await carry(self.broker.bootstrap, r.compacted, r.security)  # step 5
            except Exception as exc:  # noqa: BLE001 - the broker is untouched: keep serving, roll later
                gate.open_(self.gate_file)
                r.clock.postponed()
                self.rolls_put_off += 1
                log.error("the broker roll (%s) is put off: its compacted topics could not be read (%s)", why, exc)
                return
            self.rolling_since = time.time()
            log.info("broker roll: %d record(s) read in %.1f s; restarting the broker",
                     sum(len(kv) for parts in carried.values() for kv in parts.values()), time.monotonic() - t_gate)
            await asyncio.to_thread(self.broker.stop, 0.5)  # step 6: what it holds is carried (SIGTERM took ~5 s)
            await self._start_again()
            bump(self.epoch_file)
            if await self._retried("creating its topics", self.restore) is None:
                log.error("the embedded broker died during its roll: the restart that follows loses what it carried")
                return  # the loop restarts it, the gate still closed
            n = await self._retried("writing back its compacted topics",
                                    lambda: write_back(self.broker.bootstrap, carried, r.security))
            gate.open_(self.gate_file)
            self.rolls += 1
            _ROLLS.inc()
            r.clock.rolled()
            self.last_roll = event = RollEvent(self.rolls, why, round(rss, 1), round(t_gate - t0, 2),
                                               round(time.monotonic() - t_gate, 2), n or 0)
            log.warning("the embedded broker rolled (%s): %d record(s) carried, the door held %.1f s", why,
                        event.carried, time.monotonic() - t0)
        finally:
            self.rolling_since = None
            await r.release()
        await self._retried("recording the roll", lambda: r.on_rolled(event))  # step 7

    async def _restart(self, code: int | None) -> None:
        died = time.time()
        t0 = time.monotonic()
        self.down_since = died
        log.error("the embedded broker exited with %s; restarting it on %s in %.1f s, once the stack's producers "
                  "have let go of what they held (its memory storage lost every record in flight)", code,
                  self.broker.bootstrap, self.settle_s)
        gate.close(self.gate_file)  # step 2
        await asyncio.sleep(self.settle_s)
        await self._start_again()  # step 3
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
