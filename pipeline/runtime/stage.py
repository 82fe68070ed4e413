"""The Stage API: what a stage implements and what it returns. No Kafka in here.

A stage's policy is plain functions over pydantic models; the Stage class adapts them to the
runtime: `process_batch(docs)` returns one Outcome (or an exception) per document.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import orjson
from pydantic import BaseModel

from pipeline.config.settings import RuntimeSettings, Settings, StageSpec
from pipeline.contracts import Evidence, RequestDoc, Response, Rollout
from pipeline.runtime.codec import encode
from pipeline.runtime.follow.follower import ControlFollower
from pipeline.runtime.topics import TopicNames


@dataclass
class SideRecord:
    """A record for another topic (e.g. a cache write-back on `control`), produced and acked with
    the record's other outputs before its offset is committed."""

    topic: str  # registry name, e.g. "control"
    key: bytes | None
    value: BaseModel | None  # None: a tombstone (compacted changelogs)
    partition: int | None = None  # None: by key; changelogs name the partition of the state they hold


@dataclass
class Outcome:
    """A stage's decision for one request: forward the document, or answer the caller."""

    doc: RequestDoc
    evidence: list[Evidence] = field(default_factory=list)
    response: Response | None = None  # set: terminal answer, nothing is forwarded
    next_stage: str | None = None  # None: the topology's next stage
    rollouts: list[Rollout] = field(default_factory=list)
    side: list[SideRecord] = field(default_factory=list)
    #: neither forwarded nor answered now: the stage took over answering it later (e.g. an
    #: idempotency-key duplicate answered with the original's result); the promise must be in `side`
    parked: bool = False
    #: answers to other requests this decision settled (e.g. the parked duplicates of a rejected request)
    others: list[Outcome] = field(default_factory=list)

    @classmethod
    def forward(cls, doc: RequestDoc, *evidence: Evidence, to: str | None = None) -> Outcome:
        return cls(doc=doc, evidence=list(evidence), next_stage=to)

    @classmethod
    def answer(cls, doc: RequestDoc, response: Response, *evidence: Evidence) -> Outcome:
        return cls(doc=doc, evidence=list(evidence), response=response)

    @classmethod
    def park(cls, doc: RequestDoc, side: list[SideRecord], *evidence: Evidence) -> Outcome:
        return cls(doc=doc, evidence=list(evidence), side=side, parked=True)


@dataclass
class SideEffects:
    """What applying a side-input record produced: evidence, records for other topics, and answers
    to earlier (parked) requests."""

    evidence: list[Evidence] = field(default_factory=list)
    side: list[SideRecord] = field(default_factory=list)
    answers: list[Outcome] = field(default_factory=list)


class StreamPort:
    """A stage's typed way to send records while it works, outside its batch's outcomes (generate's
    streamed deltas): one topic, a wire model in, encoded here and handed to the worker's producer in
    call order. The stage holds no Kafka object."""

    def __init__(self, producer: Any, topic: str) -> None:
        self._producer, self.topic = producer, topic

    async def send(self, record: BaseModel, key: bytes | None = None, partition: int | None = None) -> None:
        await self._producer.send(self.topic, encode(record), key=key, partition=partition)


@dataclass
class Ports:
    """What the worker hands a stage before start(): a StreamPort per topic the stage streams to."""

    producer: Any

    def stream(self, topic: str) -> StreamPort:
        return StreamPort(self.producer, topic)


@dataclass
class StageContext:
    spec: StageSpec
    settings: Settings
    runtime: RuntimeSettings
    bootstrap: str | None = None  # for stages that follow or publish side topics (e.g. control)
    topic_prefix: str = "llmpipe."

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def policy(self) -> dict[str, Any]:
        return self.spec.policy


class Stage:
    """Base class of every stage. Subclasses set batching and implement `process` or `process_batch`."""

    #: micro-batching: up to max_batch records, waiting at most max_wait_ms for the batch to fill
    max_batch: ClassVar[int] = 1
    max_wait_ms: ClassVar[int] = 0
    input_model: ClassVar[type[RequestDoc]] = RequestDoc
    #: the stage's typed policy: `self.policy` is validated from the StageSpec's policy mapping
    policy_model: ClassVar[type[BaseModel] | None] = None
    #: more input topics (registry name -> value model) read by the same consumer, so they are
    #: co-partitioned with the stage's input (e.g. admit's completions, keyed by tenant like its input)
    side_inputs: ClassVar[dict[str, type[BaseModel]]] = {}
    #: what re-running this stage in a replay does beyond deciding (e.g. "calls the model again"):
    #: a replay of a stage chained behind it re-runs it only when asked (pipeline/analysis/replay.py)
    replay_reruns: ClassVar[str] = ""

    @classmethod
    def applies_to(cls, doc: RequestDoc) -> bool:
        """Does this stage have work for `doc`? If not, the previous stage forwards past it."""
        return True

    def __init__(self, ctx: StageContext) -> None:
        self.ctx = ctx
        self.name = ctx.name
        self.follower: Any = None  # a ControlFollower once follow_control() ran
        # set by the worker's handler before start(): the withdrawn requests (runtime/follow/cancels.py) and
        # the ports for records a stage sends while it works (generate's deltas)
        self.cancels: Any = None
        self.ports: Ports | None = None
        self.policy: Any = self.policy_model.model_validate(ctx.policy) if self.policy_model else ctx.policy

    @property
    def policy_version(self) -> str:
        """The policy's `version` (its default included), else a digest of the policy mapping."""
        explicit = getattr(self.policy, "version", None) or self.ctx.policy.get("version")
        if explicit:
            return str(explicit)
        digest = hashlib.sha256(orjson.dumps(self.ctx.policy, option=orjson.OPT_SORT_KEYS)).hexdigest()
        return f"sha256:{digest[:12]}"

    async def start(self) -> None:
        """Load models, open stores. Called once before the first record."""

    async def stop(self) -> None:
        """Release what start() took."""
        await self.stop_following()

    async def follow_control(self, apply: Callable[[object], object]) -> None:
        """Replay the whole `control` topic into `apply`, then keep applying it (tenants, cache
        entries, breaker states); returns once caught up. Without a broker (unit use) it does nothing."""
        if self.ctx.bootstrap:
            topic = TopicNames(self.ctx.topic_prefix)("control")
            s = self.ctx.settings
            self.follower = await ControlFollower(self.ctx.bootstrap, topic, apply, s.kafka,
                                                  s.doorbell_dir if s.consumer.doorbell else None).start()

    async def stop_following(self) -> None:
        if self.follower is not None:
            await self.follower.stop()
            self.follower = None

    async def on_side_input(self, topic: str, value: BaseModel) -> SideEffects:
        """Apply one record of a side input (see `side_inputs`)."""
        raise NotImplementedError(f"{type(self).__name__} declares side inputs but does not handle them")

    async def on_assigned(self, partitions: list[int]) -> None:
        """This worker now owns these partitions of the stage's input: restore their state before
        any of their records is processed (the runtime awaits this inside the rebalance)."""

    async def on_revoked(self, partitions: list[int]) -> None:
        """These partitions moved to another worker: forget their state."""

    async def process(self, doc: RequestDoc) -> Outcome:
        raise NotImplementedError(f"{type(self).__name__} implements neither process nor process_batch")

    async def process_batch(self, docs: list[RequestDoc]) -> list[Outcome | BaseException]:
        out: list[Outcome | BaseException] = []
        for doc in docs:  # one at a time: override for batching or concurrency
            try:
                out.append(await self.process(doc))
            except Exception as exc:  # noqa: BLE001 - the runtime classifies it
                out.append(exc)
        return out

    def evidence(self, doc: RequestDoc, decision: str, reason: str = "", **fields: Any) -> Evidence:
        """An evidence row for this stage; the runtime stamps worker, offsets and timings."""
        return Evidence(
            request_id=doc.request_id,
            tenant_id=doc.tenant_id or "",
            episode_id=doc.episode_id or "",
            stage=self.name,
            decision=decision,
            reason=reason,
            policy_version=self.policy_version,
            attempt=doc.attempt,
            **fields,
        )


def _decide_each(decide, docs: list[RequestDoc]) -> list[Outcome | BaseException]:
    out: list[Outcome | BaseException] = []
    for doc in docs:
        try:
            out.append(decide(doc))
        except Exception as exc:  # noqa: BLE001 - the runtime classifies it
            out.append(exc)
    return out


class ThreadedStage(Stage):
    """A stage whose policy is a synchronous `decide(doc)` doing CPU work (regexes, models):
    each micro-batch runs in a worker thread, off the event loop."""

    def decide(self, doc: RequestDoc) -> Outcome:
        raise NotImplementedError(f"{type(self).__name__}.decide")

    async def process_batch(self, docs: list[RequestDoc]) -> list[Outcome | BaseException]:
        import asyncio

        return await asyncio.to_thread(_decide_each, self.decide, docs)
