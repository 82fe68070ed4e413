"""Rollouts for a trainer, as they are made: `RolloutStream` reads the `rollouts` topic as a consumer
group and yields batches of complete, fresh sample groups; it commits only what the trainer
acknowledged.

Protocol (what `__anext__` and `ack` do):
1. Follow `control` into an ActorBook: the active actor revision and the order of activations.
2. Consume `rollouts` in the group `<prefix>trainer.<name>`, offsets committed by hand only. Only
   the samples of the tenants the stream was opened for are read (`tenants`, required: a tenant's
   rollouts train that tenant's model; `ALL_TENANTS` is the operator's explicit choice); another
   tenant's sample is done at once and counted in `other_tenants`. Give each tenant set its own
   trainer name: one consumer group skips, for good, what its scope leaves out.
3. Collect samples by request: a group is complete when its `n` samples are in (`batch_context.n`).
   A group still incomplete after `partial_timeout_s` is dropped and counted (its samples were
   never all written).
4. A complete group whose actor revision is more than `max_staleness` activations behind the active
   one is stale: dropped (its offsets count as done) or, with `stale="flag"`, yielded and flagged.
5. A complete group is held while an incomplete group begins before it in the same partition, and
   groups are released in offset order: what is yielded from a partition is always a prefix of it.
6. Yield a Batch once `batch_groups` groups are ready; the time spent waiting for it is the trainer's
   idle time.
7. `ack(batch)`, in the order the batches were yielded: its offsets are done; commit, per partition,
   up to the first offset still pending. With 5, every acknowledged group lies below the commit
   point: a trainer killed before an ack gets those groups again, one killed after gets none of
   them again.
8. Record the consumption (`rollout_consumption/v1` on `rollouts.consumed`, stored by the sink): the
   queue age of every sample (created -> consumed), the idle and busy time, staleness by revision.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition

from pipeline.config.settings import KafkaSecurity, kafka_kwargs
from pipeline.contracts import Rollout
from pipeline.contracts.rollout import RolloutConsumption
from pipeline.registries.actor import ActorBook
from pipeline.runtime.broker.gate import GatedProducer
from pipeline.runtime.codec import decode, encode
from pipeline.runtime.errors import DecodeError
from pipeline.runtime.follow.follower import ControlFollower
from pipeline.runtime.topics import TopicNames
from pipeline.training.samples import TenantScope

ACTOR_MARK = "+actor@"


def weights_revision(actor_revision: str) -> str | None:
    """The actor weights a sample came from ("model@sha+actor@r2" -> "r2"); None: the base model."""
    _, mark, rev = actor_revision.partition(ACTOR_MARK)
    return rev if mark else None


def staleness(activations: list[str | None], revision: str | None) -> int:
    """Activations between the one that made `revision` active (its last) and the current one.
    No activation yet: everything is the base model, fresh. A revision never activated: as old
    as the history."""
    if not activations:
        return 0 if revision is None else len(activations)
    for i in range(len(activations) - 1, -1, -1):
        if activations[i] == revision:
            return len(activations) - 1 - i
    return len(activations)


@dataclass
class Group:
    request_id: str
    group_id: str
    samples: list[Rollout]
    actor_revision: str
    staleness: int
    stale: bool = False


@dataclass
class Batch:
    batch_id: str
    groups: list[Group]
    idle_ms: float  # what the trainer waited for it
    yielded_at: float = field(default_factory=time.monotonic)
    offsets: list[tuple[TopicPartition, int]] = field(default_factory=list)
    ages_ms: list[float] = field(default_factory=list)

    @property
    def samples(self) -> list[Rollout]:
        return [s for g in self.groups for s in g.samples]


class OffsetBook:
    """Per partition: the offsets consumed and not yet done; the commit point is the first pending
    one (or one past the highest consumed when none is pending)."""

    def __init__(self) -> None:
        self.pending: dict[TopicPartition, set[int]] = {}
        self.seen: dict[TopicPartition, int] = {}
        self.committed: dict[TopicPartition, int] = {}

    def consumed(self, tp: TopicPartition, offset: int) -> None:
        self.committed.setdefault(tp, offset)  # where this owner started: nothing to commit below it
        self.pending.setdefault(tp, set()).add(offset)
        self.seen[tp] = max(self.seen.get(tp, -1), offset)

    def done(self, tp: TopicPartition, offset: int) -> None:
        self.pending.get(tp, set()).discard(offset)

    def forget(self, tps: set[TopicPartition]) -> None:
        for tp in tps:
            self.pending.pop(tp, None)
            self.seen.pop(tp, None)
            self.committed.pop(tp, None)

    def advanced(self) -> dict[TopicPartition, int]:
        """Partitions whose commit point moved since the last call, and where to."""
        out = {}
        for tp, top in self.seen.items():
            left = self.pending.get(tp)
            point = min(left) if left else top + 1
            if point > self.committed.get(tp, -1):
                out[tp] = self.committed[tp] = point
        return out


@dataclass
class _Partial:
    samples: list[Rollout] = field(default_factory=list)
    offsets: list[tuple[TopicPartition, int]] = field(default_factory=list)
    ages_ms: list[float] = field(default_factory=list)
    n: int = 1
    since: float = field(default_factory=time.monotonic)

    @property
    def first(self) -> tuple[TopicPartition, int]:
        return min(self.offsets, key=lambda o: o[1])


class _Revoked(ConsumerRebalanceListener):
    def __init__(self, stream: RolloutStream) -> None:
        self.stream = stream

    async def on_partitions_revoked(self, revoked) -> None:
        self.stream.revoked(set(revoked))

    async def on_partitions_assigned(self, assigned) -> None:
        pass


class RolloutStream:
    def __init__(self, bootstrap: str, topic_prefix: str = "llmpipe.", trainer: str = "trainer",
                 batch_groups: int = 8, max_staleness: int = 1, stale: Literal["drop", "flag"] = "drop",
                 security: KafkaSecurity | None = None, poll_ms: int = 200, partial_timeout_s: float = 60.0, *,
                 tenants: TenantScope) -> None:
        if not isinstance(tenants, TenantScope):
            raise TypeError("tenants: a TenantScope (TenantScope.of(['acme']) or ALL_TENANTS)")
        self.tenants = tenants
        self.bootstrap = bootstrap
        self.names = TopicNames(topic_prefix)
        self.trainer = trainer
        self.batch_groups = batch_groups
        self.max_staleness = max_staleness
        self.stale_policy = stale
        self.kafka = kafka_kwargs(security)
        self.poll_ms = poll_ms
        self.partial_timeout_s = partial_timeout_s
        self.book = ActorBook()
        self.offsets = OffsetBook()
        self.follower: ControlFollower | None = None
        self.consumer: AIOKafkaConsumer | None = None
        self.producer: AIOKafkaProducer | None = None
        self._partial: dict[tuple[str, str], _Partial] = {}
        self._held: dict[TopicPartition, list[tuple[Group, _Partial]]] = {}
        self._ready: list[tuple[Group, _Partial]] = []
        self._unacked: list[str] = []  # batch ids yielded, in order
        self.incomplete = 0  # groups dropped after partial_timeout_s
        self.dropped: Counter = Counter()  # actor revision -> stale samples dropped
        self._drops_unreported: Counter = Counter()
        self.unreadable = 0
        self.other_tenants = 0  # samples of tenants outside `tenants`, skipped

    @property
    def group_id(self) -> str:
        return f"{self.names('trainer')}.{self.trainer}"

    async def start(self) -> RolloutStream:
        self.follower = await ControlFollower(self.bootstrap, self.names("control"), self.book.apply).start()
        self.producer = GatedProducer(bootstrap_servers=self.bootstrap, acks="all", **self.kafka)
        await self.producer.start()
        self.consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=self.group_id,
                                         enable_auto_commit=False, auto_offset_reset="earliest",
                                         fetch_max_wait_ms=100, **self.kafka)
        await self.consumer.start()
        self.consumer.subscribe([self.names("rollouts")], listener=_Revoked(self))
        return self

    async def stop(self) -> None:
        for part in (self.consumer, self.producer, self.follower):
            if part is not None:
                await part.stop()
        self.consumer = self.producer = self.follower = None

    async def __aenter__(self) -> RolloutStream:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def __aiter__(self) -> RolloutStream:
        return self

    async def __anext__(self) -> Batch:
        """Steps 3-5: the next batch of `batch_groups` complete groups."""
        assert self.consumer is not None, "start() first"
        t0 = time.monotonic()
        while len(self._ready) < self.batch_groups:
            got = await self.consumer.getmany(timeout_ms=self.poll_ms)
            now_ms = time.time() * 1000
            for tp, records in got.items():
                for rec in records:
                    self._take(tp, rec.offset, rec.value, now_ms)
            self._expire()
            self._release()
            await self._commit()  # stale drops and unreadable records are done at once
        taken, self._ready = self._ready[:self.batch_groups], self._ready[self.batch_groups:]
        batch = Batch(batch_id=uuid.uuid4().hex, groups=[g for g, _ in taken], idle_ms=(time.monotonic() - t0) * 1000,
                      offsets=[o for _, p in taken for o in p.offsets], ages_ms=[a for _, p in taken for a in p.ages_ms])
        self._unacked.append(batch.batch_id)
        return batch

    def _expire(self) -> None:
        """Step 3: a group whose samples never all arrived stops holding its partition back."""
        now = time.monotonic()
        for rid, p in list(self._partial.items()):
            if now - p.since >= self.partial_timeout_s:
                del self._partial[rid]
                self.incomplete += 1
                for tp, off in p.offsets:
                    self.offsets.done(tp, off)

    def _release(self) -> None:
        """Step 5: move held groups to the ready list, per partition in offset order, up to the first
        incomplete group."""
        blocked: dict[TopicPartition, int] = {}
        for p in self._partial.values():
            tp, off = p.first
            blocked[tp] = min(off, blocked.get(tp, off))
        for tp, held in self._held.items():
            held.sort(key=lambda gp: gp[1].first[1])
            limit = blocked.get(tp)
            while held and (limit is None or held[0][1].first[1] < limit):
                self._ready.append(held.pop(0))

    def _take(self, tp: TopicPartition, offset: int, value: bytes | None, now_ms: float) -> None:
        self.offsets.consumed(tp, offset)
        try:
            r = decode(value, Rollout)
        except DecodeError:
            self.unreadable += 1  # generate wrote it: nothing a trainer can do but skip it
            self.offsets.done(tp, offset)
            return
        if not self.tenants.admits(r.tenant_id):
            self.other_tenants += 1
            self.offsets.done(tp, offset)
            return
        key = (r.tenant_id, r.request_id)  # request ids are the callers': two tenants may share one
        p = self._partial.setdefault(key, _Partial())
        if any(s.sample_id == r.sample_id for s in p.samples):  # a redelivered sample
            self.offsets.done(tp, offset)
            return
        p.samples.append(r)
        p.offsets.append((tp, offset))
        p.ages_ms.append(max(0.0, now_ms - r.created_ms))
        try:
            p.n = int(orjson.loads(r.batch_context or "{}").get("n", 1))
        except (orjson.JSONDecodeError, TypeError, ValueError):
            p.n = 1
        if len(p.samples) >= p.n:
            self._complete(r.request_id, self._partial.pop(key))

    def _complete(self, request_id: str, p: _Partial) -> None:
        """Step 4."""
        rev = p.samples[0].actor_revision
        behind = staleness(self.book.activations, weights_revision(rev))
        stale = behind > self.max_staleness
        if stale and self.stale_policy == "drop":
            self.dropped[rev] += len(p.samples)
            self._drops_unreported[rev] += len(p.samples)
            for tp, off in p.offsets:
                self.offsets.done(tp, off)
            return
        p.samples.sort(key=lambda s: s.sample_id)
        self._held.setdefault(p.first[0], []).append((Group(request_id, p.samples[0].group_id, p.samples, rev, behind,
                                                            stale), p))

    async def ack(self, batch: Batch) -> None:
        """Steps 6-7: the trainer is done with `batch`; returns once the commit is made."""
        assert self.consumer is not None and self.producer is not None, "start() first"
        if not self._unacked or self._unacked[0] != batch.batch_id:
            raise ValueError("acknowledge batches in the order they were yielded (an acknowledged batch must not "
                             "lie beyond the commit point)")
        self._unacked.pop(0)
        for tp, off in batch.offsets:
            self.offsets.done(tp, off)
        await self._commit()
        by_rev = Counter(s.actor_revision for s in batch.samples)
        record = RolloutConsumption(
            batch_id=batch.batch_id, trainer=self.trainer, groups=len(batch.groups), samples=len(batch.samples),
            idle_ms=round(batch.idle_ms, 3), busy_ms=round((time.monotonic() - batch.yielded_at) * 1000, 3),
            queue_age_ms=[round(a, 3) for a in batch.ages_ms], samples_by_revision=dict(by_rev),
            stale_by_revision={g.actor_revision: g.staleness for g in batch.groups},
            dropped_by_revision=dict(self._drops_unreported), flagged=sum(len(g.samples) for g in batch.groups if g.stale),
            incomplete=self.incomplete,
            active_revision=self.book.active or "")
        self._drops_unreported.clear()
        await self.producer.send_and_wait(self.names("rollouts.consumed"), encode(record), key=self.trainer.encode())

    def revoked(self, tps: set[TopicPartition]) -> None:
        """Another trainer of the group owns these partitions now: what was read from them and not
        acknowledged is theirs to read again (a batch already handed over is still acknowledged
        here, but its commit for those partitions is left to the new owner)."""
        self.offsets.forget(tps)
        self._partial = {rid: p for rid, p in self._partial.items() if not any(tp in tps for tp, _ in p.offsets)}
        self._ready = [(g, p) for g, p in self._ready if not any(tp in tps for tp, _ in p.offsets)]
        for tp in tps:
            self._held.pop(tp, None)

    async def _commit(self) -> None:
        assert self.consumer is not None
        points = self.offsets.advanced()
        assigned = self.consumer.assignment()
        points = {tp: off for tp, off in points.items() if tp in assigned}
        if points:
            await self.consumer.commit(points)
