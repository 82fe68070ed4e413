"""One generate worker's side of the actor weight lifecycle.

On `actor_prepared` the replica verifies the revision's files (transferred), loads them into its
engine (loaded) and runs the validation prompts greedily against their expected answers
(validated, or rejected with the first failure). On `actor_activated` new rollout requests take the
new revision; requests already running keep the revision they started with, and the previous
revision reports draining, then retired once its last request finished. Every report goes to
`control` (where `llmpipe actor activate` waits for the barrier) and to `weight_events`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

from pipeline.contracts import WeightEvent
from pipeline.contracts.actor import (
    ACTOR_ADAPTER,
    ActorActivated,
    ActorPrepared,
    ActorReplicaReport,
    ActorSpec,
)
from pipeline.contracts.adapter import AdapterSpec
from pipeline.engines.chat_engine import EngineError, Generation, Sampling
from pipeline.registries.actor import ActorBook, validation_failure
from pipeline.stages.generate.deployments import RETRYABLE

log = logging.getLogger(__name__)
VALIDATION_RUNS = 3  # a stalled or overloaded engine gets three chances before a revision is rejected
VALIDATION_BACKOFF_S = 1.0

Publish = Callable[[object, object], Awaitable[None]]  # (control report, weight event)
Load = Callable[[AdapterSpec], Awaitable[float]]  # verify + load into the engine; returns ms
Generate = Callable[[list[dict[str, str]], Sampling, AdapterSpec], Awaitable[Generation]]


class ActorReplica:
    def __init__(self, replica: str, publish: Publish) -> None:
        self.replica = replica
        self.publish = publish
        self.book = ActorBook()
        self.load: Load | None = None
        self.generate: Generate | None = None
        self.inflight: Counter[str] = Counter()
        self.validated: set[str] = set()
        self.draining: set[str] = set()
        self._tasks: set[asyncio.Task] = set()
        self.loop: asyncio.AbstractEventLoop | None = None

    def attach(self, load: Load, generate: Generate) -> None:
        """The engine this replica serves the actor with (None before start: records only accumulate).
        Called on the worker's event loop, where the lifecycle work then runs."""
        self.load, self.generate = load, generate
        self.loop = asyncio.get_running_loop()

    def current(self) -> AdapterSpec | None:
        """The active revision's adapter (None: no actor, rollouts sample the base model)."""
        rev = self.book.active
        if rev is None or rev in self.book.rejected or rev not in self.book.prepared:
            return None
        return self.book.prepared[rev].adapter()

    def apply(self, record: object) -> bool:
        if not self.book.apply(record):
            return False
        if isinstance(record, ActorPrepared) and self.load is not None:
            self._spawn(self.prepare(record.spec))
        elif isinstance(record, ActorActivated) and self.load is not None:
            self._spawn(self._switched(record))
        return True

    def _spawn(self, coro) -> None:
        """Run `coro` on the worker's loop: `apply` is called from the control follower's thread."""
        assert self.loop is not None

        def start() -> None:
            task = asyncio.get_running_loop().create_task(coro)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        self.loop.call_soon_threadsafe(start)

    async def drain_tasks(self) -> None:
        """Wait for the lifecycle work scheduled so far (and what it scheduled in turn)."""
        await asyncio.sleep(0)
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
            await asyncio.sleep(0)

    async def report(self, revision: str, state: str, detail: str = "", duration_ms: float | None = None) -> None:
        rep = ActorReplicaReport(revision=revision, replica=self.replica, state=state, detail=detail[:500])
        ev = WeightEvent(replica=self.replica, kind="actor", name=ACTOR_ADAPTER, revision=revision, transition=state,
                         detail=detail[:500], duration_ms=duration_ms)
        try:
            await self.publish(rep, ev)
        except Exception as exc:  # noqa: BLE001 - the barrier waits for a report that never comes: visible
            log.warning("actor: could not report %s %s: %s", revision, state, type(exc).__name__)

    async def prepare(self, spec: ActorSpec) -> bool:
        """transferred -> loaded -> validated, or rejected at the first step that fails."""
        assert self.load is not None and self.generate is not None
        rev = spec.revision
        if rev in self.book.rejected or rev in self.validated:
            return rev in self.validated
        adapter = spec.adapter()
        t0 = time.perf_counter()
        try:
            load_ms = await self.load(adapter)  # verifies allowed root + checksum before loading
        except EngineError as exc:
            await self.report(rev, "rejected", str(exc))
            return False
        await self.report(rev, "transferred", f"verified {spec.sha256[:12]} at {spec.path}")
        await self.report(rev, "loaded", "in the engine's CPU cache", duration_ms=round(load_ms, 2))
        t1 = time.perf_counter()
        for check in spec.validation:
            try:
                g = await self._run_check(check.prompt, adapter)
            except EngineError as exc:
                await self.report(rev, "rejected", f"validation prompt failed to run: {exc}")
                return False
            why = validation_failure(check, g.text)
            if why is not None:
                await self.report(rev, "rejected", f"validation: {why}")
                return False
        self.validated.add(rev)
        await self.report(rev, "validated", f"{len(spec.validation)} validation prompts passed",
                          duration_ms=round((time.perf_counter() - t1) * 1000, 2))
        log.info("actor %s validated on %s in %.0f ms", rev, self.replica, (time.perf_counter() - t0) * 1000)
        return True

    async def _run_check(self, prompt: str, adapter: AdapterSpec) -> Generation:
        """A validation prompt, greedy. A busy engine is not a bad revision: a retryable engine error
        (a stall, overload) is tried again, up to VALIDATION_RUNS times, before it rejects."""
        assert self.generate is not None
        for run in range(1, VALIDATION_RUNS + 1):
            try:
                return await self.generate([{"role": "user", "content": prompt}],
                                           Sampling(max_tokens=64, temperature=0.0), adapter)
            except EngineError as exc:
                if exc.error_class not in RETRYABLE or run == VALIDATION_RUNS:
                    raise
                log.warning("actor %s: validation run %d on %s failed (%s); trying again", adapter.revision, run,
                            self.replica, exc.error_class)
                await asyncio.sleep(VALIDATION_BACKOFF_S * run)
        raise AssertionError("unreachable")

    async def _switched(self, record: ActorActivated) -> None:
        if record.revision is not None:
            await self.report(record.revision, "active", record.reason)
        old = record.previous
        if old is not None and old != record.revision:
            self.draining.add(old)
            await self.report(old, "draining", f"{self.inflight[old]} request(s) still on it")
            await self._retire_if_idle(old)

    async def _retire_if_idle(self, revision: str) -> None:
        if revision in self.draining and self.inflight[revision] == 0 and self.book.active != revision:
            self.draining.discard(revision)
            await self.report(revision, "retired", "no request runs on it any more")

    @contextmanager
    def serving(self, revision: str) -> Iterator[None]:
        """Count a request running on `revision`, so a draining revision retires when its last one ends."""
        self.inflight[revision] += 1
        try:
            yield
        finally:
            self.inflight[revision] -= 1
            if revision in self.draining and self.inflight[revision] == 0 and self.load is not None:
                self._spawn(self._retire_if_idle(revision))
