"""Polling a consumer that has a doorbell (runtime/wakeup/doorbell.py) with fetches that do not wait.

With a bell a consumer only needs to know whether records are there now. On the embedded broker a
fetch that waits 5 ms for records costs ~0.8 ms of broker CPU, one that waits 1 ms ~0.2 ms
(bench/broker_cost.py), and every idle consumer used to make two of the former between requests.
Not 0 ms: Tansu answers a 0 ms fetch with no records even when there are some (measured).

An empty answer does not mean "nothing there": Tansu (0.6, memory storage) lists every batch of a
partition on each fetch, and a fetch whose wait runs out first comes back with fewer records than
there are, or none. On a long partition (a front door's reply partition, the evidence topic)
every 1 ms fetch came back empty, and consumers that paused on that stalled for good at 80 req/s
(measured with the high watermark of each answer: position 1104, high watermark 1630, empty; a
fresh consumer got 1 record with a 1 ms wait, 365 with 5 ms, all 526 with 100 ms).

Protocol (the no-wait fetch):

1. While the bell may doze, every fetch asks the broker with a `NOWAIT_FETCH_MS` wait.
2. aiokafka's fetch routine sends the next fetch as soon as one completes, so "nothing there" must
   stop it inside the completion: `Fetcher._proc_fetch_request` (aiokafka is pinned; it returns
   whether the response added records) is wrapped on the fetcher instance, and a completion that
   added nothing pauses, in that same loop turn, the fetchable partitions it shows caught up
   (position at the high watermark the answer carried). No fetch is in flight while they are
   paused, so a paused partition never loses a response that was on its way.
2a. A partition behind its high watermark is never paused by an empty answer: its records are
   there and the fetch was cut short. Each such answer doubles the next fetch's wait, up to
   `CHASE_MAX_WAIT_MS`; an answer with records keeps the wait (a reset would cut the next read
   short again), and the wait drops back to `NOWAIT_FETCH_MS` once nothing is behind. The
   consumer does not doze while it chases.
3. `poll()` returns records as they come. After an empty completion it waits for the bell (at most
   `doze_max_ms`; a ring since the last wait ends it at once), then, unless the owner says no
   (`may_resume`), resumes the partitions step 2 paused that are still assigned and not held.
3a. A doze no ring ended makes the next one twice as long, up to `idle_doze_max_ms`; a ring or a
   completion with records brings it back to `doze_max_ms`. The doze is the safety net for a ring
   that never came; an idle stack's many consumers each fetching 5 times a second cost it 13.5 % of
   a core (bench/idle_bench.py). A PacedBell keeps its period (`fetch_every_ms`, an operator's
   explicit choice for the warehouse sink).
4. The first completion after a doze tells the bell what it found (doorbell step 5). A bell that
   decided to stay awake, or no bell at all, turns steps 1-3 off: fetches wait `wait_ms`
   (`idle_wait_ms` after `idle_after_ms` without records, FetchPacer) and `poll()` is a getmany.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, TopicPartition

from pipeline.config.settings import IDLE_DOZE_MAX_MS
from pipeline.runtime.wakeup.doorbell import Bell
from pipeline.runtime.wakeup.polling import FetchPacer, guarded_getmany

log = logging.getLogger(__name__)

NOWAIT_FETCH_MS = 1
CHASE_MAX_WAIT_MS = 1024  # a fetch returns once it has records; Tansu reads a partition in time linear in its batch count


class PacedBell:
    """A bell that never rings, for a consumer without producers to wake it that is paced by its
    own flushes (the warehouse sink): an idle one fetches once per doze instead of polling. The
    owner's `wake()` (new partitions) ends a doze at once."""

    rings = unrung = 0
    may_doze = True

    def __init__(self) -> None:
        self._woken = asyncio.Event()

    def wake(self) -> None:
        self._woken.set()

    async def wait(self, timeout_s: float) -> bool:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._woken.wait()
        self._woken.clear()
        return False

    def fetched(self, records: int) -> None:
        pass

    def stop(self) -> None:
        pass


class BellPoller:
    """`await poll(max_records)` in the owner's fetch loop, after the consumer started."""

    def __init__(self, consumer: AIOKafkaConsumer, bell: Bell | PacedBell | None, *, what: str, wait_ms: int,
                 idle_wait_ms: int, idle_after_ms: int, awake_poll_ms: int, doze_max_ms: int = 200,
                 idle_doze_max_ms: int = IDLE_DOZE_MAX_MS, guard_s: float = 10.0, held: Callable[[], set[TopicPartition]] = set,
                 may_resume: Callable[[], bool] = lambda: True, min_round_s: float = 0.0,
                 on_doze: Callable[[bool], None] | None = None) -> None:
        self.consumer, self.bell, self.what = consumer, bell, what
        self.wait_ms, self.idle_wait_ms = wait_ms, idle_wait_ms
        self.awake_poll_ms, self.doze_max_s, self.guard_s = awake_poll_ms, doze_max_ms / 1000, guard_s
        self.idle_doze_max_s = max(doze_max_ms, idle_doze_max_ms) / 1000
        self.doze_s = self.doze_max_s  # step 3a: this doze's longest wait
        self.held, self.may_resume, self.min_round_s, self.on_doze = held, may_resume, min_round_s, on_doze
        self.pacer = FetchPacer(consumer, wait_ms, idle_wait_ms, idle_after_ms)
        self.completions = self.empty = self.chased = 0
        self._chase_ms = 0  # step 2a: 0 while no partition is behind
        self._quiet: set[TopicPartition] = set()  # paused by step 2, resumed by step 3
        self._completed = asyncio.Event()
        self._after_doze = False
        self._round_at = 0.0
        self._nowait = False
        fetcher = self._fetcher = consumer._fetcher
        inner = fetcher._proc_fetch_request  # a bound method; step 2 (tests/test_bellpoll.py holds it)

        async def watched(assignment, node_id, request):
            added = await inner(assignment, node_id, request)
            try:
                self._completion(bool(added), assignment)
            except Exception:  # raised into aiokafka it would end the fetch routine: no fetch, ever
                log.exception("%s: fetch completion hook failed; partitions resumed", what)
                self._quiet.clear()
                self.consumer.resume(*self.consumer.assignment())
                self._completed.set()
            return added

        fetcher._proc_fetch_request = watched

    @property
    def dozing(self) -> bool:
        return self.bell is not None and self.bell.may_doze

    def _completion(self, added: bool, assignment=None) -> None:
        self.completions += 1
        if added:
            self.doze_s = self.doze_max_s  # step 3a
        if self._after_doze and self.bell is not None:
            self._after_doze = False
            self.bell.fetched(1 if added else 0)  # step 4
        if self._nowait and assignment is not None and assignment.active:  # an old assignment's answer says nothing
            tps = self.consumer.assignment() - self.consumer.paused() - self.held()
            behind = {tp for tp in tps if tp in assignment.tps and _behind(assignment.state_value(tp))}
            if not added:  # step 2
                self.empty += 1
                # not a partition with records buffered from an earlier fetch: aiokafka drops those when paused
                quiet = tps - behind - self._fetcher._records.keys()
                if quiet:
                    self.consumer.pause(*quiet)
                    self._quiet |= quiet
            self._chase(bool(behind), grow=not added)
        self._completed.set()

    def _chase(self, behind: bool, grow: bool) -> None:
        """Step 2a: while a partition is behind its high watermark, each empty answer doubles the
        next fetch's wait and an answer with records keeps it; caught up, it drops back."""
        chase_ms = 0
        if behind:
            chase_ms = min(CHASE_MAX_WAIT_MS, max(2 * NOWAIT_FETCH_MS, 2 * self._chase_ms)) if grow else self._chase_ms
        if chase_ms != self._chase_ms:
            self._chase_ms = chase_ms
            wait = chase_ms or NOWAIT_FETCH_MS
            self.pacer.set_waits(wait, wait)
        self.chased += behind and grow

    def _set_mode(self) -> None:
        nowait = self.dozing
        if nowait != self._nowait:
            self._nowait, self._chase_ms = nowait, 0
            if nowait:
                self.pacer.set_waits(NOWAIT_FETCH_MS, NOWAIT_FETCH_MS)
            else:
                self.pacer.set_waits(self.wait_ms, self.idle_wait_ms)

    async def poll(self, max_records: int | None = None, busy: int = 0) -> dict[TopicPartition, list]:
        """Records fetched so far (may be {}); waits for a fetch, or dozes, when there are none.
        `busy` > 0 keeps an awake consumer's fetches fast though nothing came (answers awaited)."""
        self._set_mode()
        if not self._nowait:
            self._resume_quiet()
            batches = await guarded_getmany(self.consumer, self.what, timeout_ms=self.awake_poll_ms,
                                            guard_s=self.guard_s, max_records=max_records)
            self.pacer.saw(sum(len(r) for r in batches.values()) + busy)
            return batches
        if self._quiet and not self._chase_ms:
            await self._doze()
        self._completed.clear()
        batches = await guarded_getmany(self.consumer, self.what, timeout_ms=0, guard_s=self.guard_s,
                                        max_records=max_records)
        if not batches and (self._chase_ms or not self._quiet):
            # wait for the fetch in flight (bounded: with no assignment there is none)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.awake_poll_ms / 1000):
                    await self._completed.wait()
        return batches

    async def _doze(self) -> None:
        """Step 3."""
        assert self.bell is not None
        rang = await self.bell.wait(self.doze_s)
        if rang or isinstance(self.bell, PacedBell):  # a paced one keeps the period it was given
            self.doze_s = self.doze_max_s
        else:  # step 3a
            self.doze_s = min(self.doze_s * 2, self.idle_doze_max_s)
        if self.on_doze is not None:
            self.on_doze(rang)
        if rang and self.min_round_s:
            await asyncio.sleep(max(0.0, self._round_at + self.min_round_s - time.monotonic()))
        self._round_at = time.monotonic()
        self._after_doze = True
        self._resume_quiet()

    def _resume_quiet(self) -> None:
        if not self._quiet or not self.may_resume():
            return
        back = (self._quiet & self.consumer.assignment()) - self.held()
        self._quiet = set()
        if back:
            self.consumer.resume(*back)

    def forget(self) -> None:
        """The owner paused or resumed every partition itself (backpressure): step 2's pauses are its now."""
        self._quiet = set()


def _behind(state) -> bool:
    """Step 2a, from aiokafka's partition state: records past the position, or not known yet."""
    return not state.has_valid_position or state.highwater is None or state.highwater > state.position
