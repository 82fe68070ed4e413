"""The record protocol of a request stage, step by step for each record of a batch:

1. Decode the value into the stage's input model. Undecodable or schema-invalid: DLQ with the
   original bytes, and an `error` answer to the caller when its request_id and reply_to can be
   read from what did parse. A reply_to other than a partition of `responses` (outputs.ReplyCheck)
   is the record's fault too: DLQ and an `invalid_reply_to` answer on `responses` alone. No answer
   ever goes where an unchecked reply_to points.
2. Deadline: past `deadline_ms`, the record is not processed; it is answered
   `deadline_exceeded` with an evidence row. (Replays re-decide regardless of deadlines.)
   Cancelled: a request its caller withdrew (a `cancel` record, runtime/follow/cancels.py) is answered
   `cancelled` with an evidence row instead of being processed.
3. Process the batch through the stage; failures are retried up to `max_attempts` with
   backoff (PermanentError: not retried), then DLQ + `error` answer + evidence.
4. Outputs: the runtime appends the stage's timing record, stamps every evidence row (worker,
   partition, offset, timings, replay_id/shadow) and produces the forward or the answer, the
   evidence and the rollouts. In shadow mode only evidence is produced (a forward to the next
   stage of a chain is still handed over in memory, so a replay re-decides the whole path).
5. Flush: return only when the broker acknowledged every output of the batch.

A chain (docs/design.md, "Stage chains"): stages whose inputs share a partition key run in one
worker, each with its own StageHandler, linked by `chained`. The worker consumes every input topic
of the chain; a handler takes the records of its own topics (step 1) and the documents the previous
stage of the chain forwarded to it, which skip step 1 (already decoded and checked) but not step 2.
A forward to the next stage of the chain is handed over in memory instead of produced; a forward
anywhere else (a jump, a stage skipped, an answer) is produced as before. All outputs of the chain
go through the batch's one Outputs, so step 5 covers them and the offsets are committed after it.

Steps 1-4 of each record run guarded: an error that the record's own content causes while its
outputs are built or sent (errors.is_record_fault: a partition the producer refuses, a value over
the record limit, text that does not encode) dead-letters that record and answers it on
`responses`, and the batch goes on. Only infrastructure errors (the broker, timeouts) leave
`handle`; the worker retries those (and gives up on what is neither, through `give_up`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from aiokafka import AIOKafkaProducer
from aiokafka.errors import MessageSizeTooLargeError
from pydantic import BaseModel

from pipeline.contracts import Cancel, Evidence, ReplyTo, RequestDoc, Response, StageTiming, Status
from pipeline.contracts.admit import release_for
from pipeline.contracts.base import now_ms
from pipeline.contracts.response import ImageShape, StageTimes
from pipeline.runtime.codec import decode, encode, header_map, request_headers
from pipeline.runtime.dlq import dead_letter
from pipeline.runtime.errors import DecodeError, TopologyError, is_infrastructure
from pipeline.runtime.follow.cancels import CancelWatch
from pipeline.runtime.handler import Item
from pipeline.runtime.outputs import Outputs, ReplyCheck
from pipeline.runtime.serve.metrics import StageMetrics
from pipeline.runtime.stage import Outcome, Ports, SideRecord, Stage
from pipeline.runtime.topics import TopicNames
from pipeline.runtime.topology import Topology

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class ReplayMode:
    replay_id: str
    shadow: bool


@dataclass
class _Work:
    item: Item
    doc: RequestDoc
    started_ms: int


@dataclass
class HandedRecord:
    """What a forward inside a chain would have been on the next stage's input topic: the consumed
    record's place (partition, offset, key, headers) with the time it was handed over; the value is
    encoded only if something needs the bytes (a dead letter)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    headers: list
    timestamp: int
    doc: RequestDoc

    @property
    def value(self) -> bytes:
        return encode(self.doc)


class _ChainOutputs(Outputs):
    """The batch's outputs, plus what each stage of the chain hands to the next."""

    def __init__(self, producer: AIOKafkaProducer) -> None:
        super().__init__(producer)
        self.handed: dict[str, list[_Work]] = {}  # stage name -> documents handed to it


class StageHandler:
    """Drives one Stage under the record protocol above."""

    def __init__(
        self,
        stage: Stage,
        topology: Topology,
        names: TopicNames,
        worker_id: str,
        *,
        replay: ReplayMode | None = None,
        on_evidence: Callable[[list[Evidence]], None] | None = None,
    ) -> None:
        self.stage = stage
        self.name = stage.name
        self.topology = topology
        self.names = names
        self.worker_id = worker_id
        self.replay = replay
        self.on_evidence = on_evidence
        rt = stage.ctx.runtime
        self.max_batch = stage.max_batch
        self.max_wait_ms = stage.max_wait_ms
        self.concurrency = rt.concurrency
        self.max_attempts = rt.max_attempts
        self.backoff_ms = rt.retry_backoff_ms
        self.metrics = StageMetrics(stage.name)
        self.producer: AIOKafkaProducer | None = None
        self.replies: ReplyCheck | None = None
        self.cancels: CancelWatch | None = None
        self._side_models = {names(t): m for t, m in stage.side_inputs.items()}
        self._repartition = not topology.keyed_like_requests(stage.name) and replay is None
        self.chained: StageHandler | None = None  # the next stage of this chain, run in this worker

    def chain(self, following: StageHandler) -> StageHandler:
        """Run `following` after this stage in this worker; returns it (to chain the next one)."""
        if following.stage.side_inputs:
            raise TopologyError(f"stage {following.name!r} has side inputs ({', '.join(following.stage.side_inputs)}) "
                                f"that are keyed for its own workers: it cannot run inside a chain")
        self.chained = following
        return following

    def chain_topics(self) -> list[str]:
        """The input topics of every later stage of the chain, which this chain's worker consumes too."""
        out, h = [], self.chained
        while h is not None:
            out.append(self.names.stage_input(h.name))
            h = h.chained
        return out

    async def start(self, producer: AIOKafkaProducer) -> None:
        self.producer = producer
        self.replies = ReplyCheck(producer, self.names.responses)
        ctx = self.stage.ctx
        if ctx.bootstrap and self.replay is None:  # a replay re-decides history: nobody can withdraw it
            s = ctx.settings
            self.cancels = await CancelWatch(ctx.bootstrap, self.names.cancel, s.kafka,
                                             s.doorbell_dir if s.consumer.doorbell else None).start(producer)
        self.stage.cancels, self.stage.ports = self.cancels, Ports(producer)
        await self.stage.start()
        if self.chained is not None:
            await self.chained.start(producer)

    async def stop(self) -> None:
        await self.stage.stop()
        if self.cancels is not None:
            await self.cancels.stop()
        if self.chained is not None:
            await self.chained.stop()

    # ---- the protocol --------------------------------------------------------------------

    async def handle(self, items: list[Item]) -> None:
        assert self.producer is not None
        out = _ChainOutputs(self.producer)
        await self._run(out, items)
        await out.flush()

    async def _run(self, out: _ChainOutputs, items: list[Item]) -> None:
        """This stage's share of the batch: the records of its own topics and what the previous stage
        of its chain handed over; then the rest goes on to the next stage of the chain."""
        later = set(self.chain_topics())
        mine = [it for it in items if it.record.topic not in later]
        work: list[_Work] = []
        for it in mine:
            w = await self._guarded(out, it, None, self._intake(out, it))
            if w is not None:
                work.append(w)
        for w in out.handed.pop(self.name, []):
            handed = await self._guarded(out, w.item, w.doc, self._intake_handed(out, w))
            if handed is not None:
                work.append(handed)
        for chunk in (work[i:i + self.max_batch] for i in range(0, len(work), max(1, self.max_batch))):
            outcomes = await self._process_with_retries([w.doc for w in chunk])
            for w, result in zip(chunk, outcomes):
                step = self._emit(out, w, result) if isinstance(result, Outcome) else self._failed(out, w, result)
                await self._guarded(out, w.item, w.doc, step)
        if self.chained is not None:
            await self.chained._run(out, [it for it in items if it.record.topic in later])

    async def _intake_handed(self, out: Outputs, w: _Work) -> _Work | None:
        """Step 2 for a document the previous stage of the chain handed over (step 1 was done there)."""
        started = now_ms()
        if self.replay is None and w.doc.deadline_ms is not None and started > w.doc.deadline_ms:
            await self._deadline_exceeded(out, w.item, w.doc, started)
            return None
        cancel = self.cancels.cancelled(w.doc) if self.cancels is not None else None
        if cancel is not None:
            await self._withdrawn(out, w.item, w.doc, started, cancel)
            return None
        return _Work(w.item, w.doc, started)

    async def _intake(self, out: Outputs, it: Item) -> _Work | None:
        """Steps 1-2: the record's document, to process; None when it was dealt with here."""
        assert self.replies is not None
        started = now_ms()
        side = self._side_models.get(it.record.topic)
        if side is not None:
            await self._side_input(out, it, side)
            return None
        try:
            doc = decode(it.record.value, self.stage.input_model)
        except DecodeError as exc:
            await self._poison(out, it, exc.error_class, str(exc), attempts=0, raw=exc.raw)
            return None
        bad_reply = await self.replies.problem(doc.reply_to)
        if bad_reply is not None:
            await self._poison(out, it, "invalid_reply_to", bad_reply, attempts=0, doc=doc, reason=bad_reply)
            return None
        if self.replay is None and doc.deadline_ms is not None and started > doc.deadline_ms:
            await self._deadline_exceeded(out, it, doc, started)
            return None
        cancel = self.cancels.cancelled(doc) if self.cancels is not None else None
        if cancel is not None:
            await self._withdrawn(out, it, doc, started, cancel)
            return None
        if self._repartition and it.record.topic == self.names.requests:
            # the entry topic is keyed by request_id; this stage's state is keyed otherwise
            # (e.g. admit by tenant): move the record onto its input under the right key first
            await out.send(self.names.stage_input(self.name), it.record.value,
                           key=self.topology.key_for(self.name, doc), headers=list(it.record.headers or ()))
            self.metrics.processed("repartitioned")
            return None
        if it.record.topic == self.names.requests and isinstance(doc, RequestDoc):  # which record it entered by:
            doc = doc.model_copy(update={"origin": f"{it.record.partition}:{it.record.offset}"})  # admit's replay check
        return _Work(it, doc, started)

    async def _guarded(self, out: Outputs, it: Item, doc: RequestDoc | None, step: Awaitable[T]) -> T | None:
        """One record's step: an error its own content causes ends that record (DLQ + answer), not the
        batch; infrastructure errors go up to the worker, which retries the batch."""
        try:
            return await step
        except Exception as exc:
            if is_infrastructure(exc):
                raise
            await self._refused_output(out, it, doc, exc)
            return None

    async def give_up(self, it: Item, exc: BaseException) -> None:
        """The worker's last word on a record whose batch kept failing with an error that is not the
        infrastructure's (worker.py): dead-letter it and answer it on `responses`."""
        assert self.producer is not None
        out = Outputs(self.producer)
        try:
            doc: RequestDoc | None = decode(it.record.value, self.stage.input_model)
        except DecodeError:
            doc = None
        await self._refused_output(out, it, doc, exc)
        await out.flush()

    async def _refused_output(self, out: Outputs, it: Item, doc: RequestDoc | None, exc: BaseException) -> None:
        error_class = "too_large" if isinstance(exc, MessageSizeTooLargeError) else getattr(exc, "error_class", "output_refused")
        log.warning("stage %s: the outputs of record %s:%d@%d failed on its content (%s at %s); dead-lettered",
                    self.name, it.record.topic, it.record.partition, it.record.offset, type(exc).__name__, _where(exc))
        try:
            await self._poison(out, it, error_class, f"{type(exc).__name__}: {exc}", attempts=1, doc=doc,
                               reason=f"stage {self.name} could not send the request's outputs ({error_class}); "
                                      f"it is kept in the DLQ")
        except Exception as again:
            if is_infrastructure(again):
                raise
            self.metrics.error("unanswerable")
            log.error("stage %s: record %s:%d@%d could not be dead-lettered either (%s); skipped",
                      self.name, it.record.topic, it.record.partition, it.record.offset, type(again).__name__)

    async def _process_with_retries(self, docs: list[RequestDoc]) -> list[Outcome | BaseException]:
        results: list[Outcome | BaseException] = [RuntimeError("not processed")] * len(docs)
        todo = list(range(len(docs)))
        for attempt in range(1, self.max_attempts + 1):
            t0 = time.perf_counter()
            try:
                batch = await self.stage.process_batch([docs[i] for i in todo])
                if len(batch) != len(todo):
                    raise TopologyError(f"{self.name}.process_batch returned {len(batch)} results for {len(todo)} records")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a batch-level failure fails every record
                batch = [exc] * len(todo)
            self.metrics.service.observe((time.perf_counter() - t0) / max(1, len(todo)))
            retry = []
            for i, res in zip(todo, batch):
                results[i] = res
                if isinstance(res, BaseException) and getattr(res, "retryable", True):
                    retry.append(i)
            if not retry or attempt == self.max_attempts:
                break
            self.metrics.retries.inc(len(retry))
            await asyncio.sleep(self.backoff_ms * (2 ** (attempt - 1)) / 1000)
            todo = retry
        return results

    async def _side_input(self, out: Outputs, it: Item, model: type[BaseModel]) -> None:
        try:
            value = decode(it.record.value, model)
        except DecodeError as exc:
            await self._poison(out, it, exc.error_class, str(exc), attempts=0, raw=exc.raw)
            return
        started = now_ms()
        effects = await self.stage.on_side_input(self.names.registry_name(it.record.topic), value)
        if self.replay and self.replay.shadow:
            return
        timing = self._timing(it, started, now_ms())
        await self._send_evidence(out, [self._stamp(ev, it, timing) for ev in effects.evidence])
        await self._send_side(out, effects.side)
        for outcome in effects.answers:
            await self._emit(out, _Work(it, outcome.doc, started), outcome)

    async def on_assigned(self, topic_partitions: list[tuple[str, int]]) -> None:
        await self.stage.on_assigned(self._own(topic_partitions))
        if self.chained is not None:
            await self.chained.on_assigned(topic_partitions)

    async def on_revoked(self, topic_partitions: list[tuple[str, int]]) -> None:
        await self.stage.on_revoked(self._own(topic_partitions))
        if self.chained is not None:
            await self.chained.on_revoked(topic_partitions)

    def _own(self, topic_partitions: list[tuple[str, int]]) -> list[int]:
        mine = self.names.stage_input(self.name)
        return sorted(p for t, p in topic_partitions if t == mine)

    # ---- outputs ---------------------------------------------------------------------------

    def _timing(self, it: Item, started_ms: int, finished_ms: int) -> StageTiming:
        enq = it.record.timestamp
        return StageTiming(
            stage=self.name, enqueued_ms=enq, started_ms=started_ms, finished_ms=finished_ms,
            queue_ms=float(max(0, started_ms - enq)), service_ms=float(finished_ms - started_ms),
            worker=self.worker_id,
        )

    def _stamp(self, ev: Evidence, it: Item, timing: StageTiming) -> Evidence:
        return ev.model_copy(update={
            "worker": self.worker_id, "partition": it.record.partition, "offset": it.record.offset,
            "enqueued_ms": timing.enqueued_ms, "started_ms": timing.started_ms,
            "finished_ms": timing.finished_ms, "queue_ms": timing.queue_ms, "service_ms": timing.service_ms,
            "replay_id": self.replay.replay_id if self.replay else "",
            "shadow": bool(self.replay and self.replay.shadow),
        })

    async def _send_evidence(self, out: Outputs, rows: list[Evidence]) -> None:
        for ev in rows:
            await out.send(self.names.evidence, encode(ev), key=ev.request_id.encode())
        if self.on_evidence and rows:
            self.on_evidence(rows)

    async def _answer(self, out: Outputs, resp: Response, reply_to: ReplyTo | None, headers: list,
                      idempotent: bool = False) -> None:
        if self.replay and self.replay.shadow:
            return
        try:
            await self._send_answer(out, resp, reply_to, headers)
        except MessageSizeTooLargeError:  # the client refused it before sending: answer small instead
            resp = Response(request_id=resp.request_id, tenant_id=resp.tenant_id, status=Status.error,
                            error_class="too_large", answered_by=self.name, replay_id=resp.replay_id,
                            reason=f"the answer is larger than the record limit of stage {self.name}'s topics")
            await self._send_answer(out, resp, reply_to, headers)
        if resp.tenant_id:
            # wherever a request ends (answer, rejection, DLQ, deadline), admit settles its reservation
            # (with the whole answer when admit keeps it for the request's idempotency-key duplicates)
            await out.send(self.names.admit_release, encode(release_for(resp, with_response=idempotent)),
                           key=resp.tenant_id.encode())
        self.metrics.processed(f"answered_{resp.status.value}")

    async def _send_answer(self, out: Outputs, resp: Response, reply_to: ReplyTo | None, headers: list) -> None:
        value = encode(resp)
        key = resp.request_id.encode()
        if reply_to is not None and self.replies is not None and await self.replies.problem(reply_to) is not None:
            reply_to = None  # refused at intake already; a salvaged or stage-made answer never goes there either
        if reply_to is not None:
            await out.send(reply_to.topic, value, key=key, partition=reply_to.partition, headers=headers)
        if reply_to is None or reply_to.topic != self.names.responses:
            # the `responses` topic is also the warehouse's record of finished requests
            await out.send(self.names.responses, value, key=key, headers=headers)

    async def _emit(self, out: Outputs, w: _Work, outcome: Outcome) -> None:
        for other in outcome.others:
            await self._emit(out, _Work(w.item, other.doc, w.started_ms), other)
        self.metrics.queue_wait.observe(max(0, w.started_ms - w.item.record.timestamp) / 1000)
        timing = self._timing(w.item, w.started_ms, now_ms())
        doc = outcome.doc.model_copy(update={"timings": [*outcome.doc.timings, timing]})
        await self._send_evidence(out, [self._stamp(ev, w.item, timing) for ev in outcome.evidence])
        if not (self.replay and self.replay.shadow):
            for ro in outcome.rollouts:
                await out.send(self.names.rollouts, encode(ro), key=ro.request_id.encode())
            await self._send_side(out, outcome.side)
        if outcome.parked:
            self.metrics.processed("parked")
            return
        headers = request_headers(doc.request_id, doc.tenant_id, doc.deadline_ms, doc.attempt, doc.traceparent)
        if outcome.response is not None:
            await self._answer(out, self._finish(doc, outcome.response), doc.reply_to, headers,
                               idempotent=doc.idempotency_key is not None)
            return
        nxt = outcome.next_stage or self.topology.next_for(self.name, doc)
        if nxt is None:
            err = self._error_response(doc, "topology_error", f"stage {self.name} forwarded but no stage follows it")
            await self._answer(out, err, doc.reply_to, headers, idempotent=doc.idempotency_key is not None)
            return
        if self.chained is not None and nxt == self.chained.name and isinstance(out, _ChainOutputs):
            # in memory, so also in a shadow replay: the next stage of the chain re-decides it too
            rec = w.item.record
            handed = HandedRecord(self.names.stage_input(nxt), rec.partition, rec.offset, rec.key, headers, now_ms(), doc)
            out.handed.setdefault(nxt, []).append(_Work(Item(w.item.tp, handed, w.item.generation), doc, 0))
            self.metrics.processed("handed_over")
            return
        if self.replay and self.replay.shadow:
            self.metrics.processed("shadow")
            return
        value = encode(doc)
        try:
            await out.send(self.names.stage_input(nxt), value, key=self.topology.key_for(nxt, doc), headers=headers)
        except MessageSizeTooLargeError:
            # retrying cannot shrink it: an answer and evidence now, never an endless retry
            await self._too_large(out, w, doc, len(value), headers)
            return
        self.metrics.processed("forwarded")

    async def _too_large(self, out: Outputs, w: _Work, doc: RequestDoc, size: int, headers: list) -> None:
        self.metrics.error("too_large")
        reason = f"the request grew to {size} bytes at stage {self.name}, above the topics' record limit"
        ev = self.stage.evidence(doc, "error", "too_large", scores={"bytes": float(size)})
        timing = self._timing(w.item, w.started_ms, now_ms())
        await self._send_evidence(out, [self._stamp(ev, w.item, timing)])
        await self._answer(out, self._error_response(doc, "too_large", reason), doc.reply_to, headers,
                           idempotent=doc.idempotency_key is not None)

    async def _send_side(self, out: Outputs, records: list[SideRecord]) -> None:
        for side in records:
            await out.send(self.names(side.topic), encode(side.value) if side.value is not None else None,
                           key=side.key, partition=side.partition)

    def _finish(self, doc: RequestDoc, resp: Response) -> Response:
        times = {t.stage: StageTimes(queue_ms=t.queue_ms, service_ms=t.service_ms) for t in doc.timings}
        images = [ImageShape(kind=i.kind, width=i.width, height=i.height, bytes=i.bytes, decode_ms=i.decode_ms)
                  for i in doc.media.images] if doc.media else resp.images
        return resp.model_copy(update={
            "request_id": doc.request_id, "tenant_id": doc.tenant_id, "answered_by": self.name,
            "created_ms": doc.created_ms, "timings": {**times, **resp.timings},
            "replay_id": self.replay.replay_id if self.replay else "", "images": images,
            "requested_model": doc.body.model, "route": resp.route or (doc.route.decision if doc.route else None),
            "domain": doc.cache.domain if doc.cache else doc.context.domain, "episode_id": doc.episode_id,
            "experiment": doc.route.experiment if doc.route else None,
            "variant": doc.route.variant if doc.route else None,
            "samples_requested": doc.rollout.n if doc.rollout else 0,
        })

    def _error_response(self, doc: RequestDoc, error_class: str, reason: str, status: Status = Status.error) -> Response:
        return self._finish(doc, Response(request_id=doc.request_id, status=status, error_class=error_class,
                                          reason=reason, answered_by=self.name))

    async def _deadline_exceeded(self, out: Outputs, it: Item, doc: RequestDoc, started: int) -> None:
        late = started - (doc.deadline_ms or started)
        await self._unprocessed(out, it, doc, started, "deadline_exceeded", f"deadline passed {late} ms before processing",
                                f"deadline passed {late} ms before stage {self.name}", Status.deadline_exceeded)

    async def _withdrawn(self, out: Outputs, it: Item, doc: RequestDoc, started: int, cancel: Cancel) -> None:
        await self._unprocessed(out, it, doc, started, "cancelled", f"withdrawn before stage {self.name} ({cancel.reason})",
                                f"cancelled by the caller before stage {self.name}", Status.cancelled)

    async def _unprocessed(self, out: Outputs, it: Item, doc: RequestDoc, started: int, decision: str, why: str,
                           answer_reason: str, status: Status) -> None:
        """A record answered without processing (step 2): its evidence row, then the answer."""
        timing = self._timing(it, started, now_ms())
        doc = doc.model_copy(update={"timings": [*doc.timings, timing], **self._unverified(it)})
        await self._send_evidence(out, [self._stamp(self.stage.evidence(doc, decision, why), it, timing)])
        await self._answer(out, self._error_response(doc, decision, answer_reason, status), doc.reply_to,
                           self._passthrough_headers(it), idempotent=doc.idempotency_key is not None)

    async def _failed(self, out: Outputs, w: _Work, exc: BaseException) -> None:
        error_class = getattr(exc, "error_class", "processing_failed")
        attempts = self.max_attempts if getattr(exc, "retryable", True) else 1
        log.warning("stage %s: request %s failed after %d attempts: %s at %s", self.name, w.doc.request_id,
                    attempts, type(exc).__name__, _where(exc))
        await self._poison(out, w.item, error_class, f"{type(exc).__name__}: {exc}", attempts=attempts, doc=w.doc)

    async def _poison(self, out: Outputs, it: Item, error_class: str, error: str, *, attempts: int,
                      raw: object | None = None, doc: RequestDoc | None = None, reason: str | None = None) -> None:
        """DLQ with the original bytes; then evidence and an error answer where a caller is known."""
        self.metrics.error(error_class)
        self.metrics.dead_lettered(error_class)
        dl = dead_letter(it.record, stage=self.name, worker=self.worker_id, error_class=error_class,
                         error=error, attempts=attempts)
        if not (self.replay and self.replay.shadow):
            await out.send(self.names.dlq, encode(dl), key=it.record.key, headers=list(it.record.headers or ()))
        request_id, tenant_id, reply_to = self._salvage(it, raw, doc)
        if request_id is None:
            return
        if self._unverified(it):
            tenant_id, doc = None, doc.model_copy(update={"tenant_id": None}) if doc is not None else None
        ev = Evidence(request_id=request_id, tenant_id=tenant_id or "", stage=self.name, decision="dlq",
                      reason=error_class, policy_version=self.stage.policy_version,
                      attempt=doc.attempt if doc else 0)
        timing = self._timing(it, now_ms(), now_ms())
        await self._send_evidence(out, [self._stamp(ev, it, timing)])
        reason = reason or f"stage {self.name} could not process the request ({error_class}); it is kept in the DLQ"
        resp = Response(request_id=request_id, tenant_id=tenant_id, status=Status.error, error_class=error_class,
                        reason=reason, answered_by=self.name,
                        replay_id=self.replay.replay_id if self.replay else "")
        if doc is not None:
            resp = self._finish(doc, resp)
        await self._answer(out, resp, reply_to, self._passthrough_headers(it),
                           idempotent=doc is not None and doc.idempotency_key is not None)

    def _salvage(self, it: Item, raw: object | None, doc: RequestDoc | None) -> tuple[str | None, str | None, ReplyTo | None]:
        if doc is not None:
            return doc.request_id, doc.tenant_id, doc.reply_to
        hdrs = header_map(it.record.headers)
        obj = raw if isinstance(raw, dict) else {}
        request_id = hdrs.get("request_id") or (obj.get("request_id") if isinstance(obj.get("request_id"), str) else None)
        tenant_id = hdrs.get("tenant_id") or (obj.get("tenant_id") if isinstance(obj.get("tenant_id"), str) else None)
        try:
            reply_to = ReplyTo.model_validate(obj["reply_to"]) if obj.get("reply_to") else None
        except Exception:  # noqa: BLE001 - an unreadable reply_to: answer on `responses` only
            reply_to = None
        return request_id, tenant_id, reply_to

    def _unverified(self, it: Item) -> dict[str, None]:
        """On the entry topic nobody is authenticated yet: the record's tenant is only a claim (any
        producer can name any tenant), and a claim never reaches an answer, evidence or the warehouse,
        whose rows are keyed by tenant (issue 35, finding 6)."""
        return {"tenant_id": None} if it.record.topic == self.names.requests else {}

    @staticmethod
    def _passthrough_headers(it: Item) -> list:
        kept = {"request_id", "tenant_id", "traceparent", "attempt", "deadline"}
        return [(k, v) for k, v in (it.record.headers or ()) if k in kept]




def _where(exc: BaseException) -> str:
    """The raising code location. The exception text may quote the input (PII): logs, evidence and
    answers carry the class and this only; the full text stays with the record in the DLQ."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb is not None else "?"
