"""The async Python client: publish request events, await each terminal answer on a reply partition.

    async with Client(bootstrap) as client:
        response = await client.request(client.build("Hello"), timeout_s=30)

Answers are correlated by request_id; delivery is at-least-once, so duplicates are dropped
(the first answer wins) and counted in `client.duplicates`.

Ids are the caller's, so anyone may send a request with an id that is pending here and reply_to
this partition (issue 35, finding 6). An answer or a delta is taken only from the tenant the
request was sent as (its `tenant_id`; mask answers with the verified tenant): another tenant's is
dropped and counted (`client.foreign`). An answer with no tenant is taken only when it is an error
(a refusal before mask knew who sent it: a bad key, a deadline passed in the queue), so the worst
such a sender can do is end the request early with an error, never show it text. A request sent
with no tenant (a Kafka producer known by its key alone, or auth off) takes any tenant's.

Cancelling needs the request's cancel secret (runtime/follow/cancels.py): `build` puts the digest of one
derived from this client's own random key in the request, and `cancel` sends the secret.

Streaming: `async for event in client.stream(doc)` yields the answer's pieces as generate sends
them (`delta/v1` on `deltas`, the partition numbered like this client's reply partition), then
one `Ended` with the terminal answer; ingress/stream_follow.py says what is shown when attempts
change. Leaving the loop early publishes a `cancel` record: the pipeline stops working on it.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import random
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from prometheus_client import Counter

from pipeline.config.settings import KafkaSecurity, kafka_kwargs
from pipeline.contracts import Cancel, Delta, Feedback, ReplyTo, RequestDoc, Response, Status
from pipeline.contracts.base import now_ms
from pipeline.contracts.request import ChatBody, ChatMessage
from pipeline.ingress.stream_follow import Ended, Piece, StreamFollower, readable
from pipeline.runtime.broker import gate
from pipeline.runtime.broker.epoch import rewind_on_restart
from pipeline.runtime.codec import decode, encode, request_headers
from pipeline.runtime.errors import DecodeError
from pipeline.runtime.follow.cancels import digest as cancel_digest
from pipeline.runtime.topics import TopicNames
from pipeline.runtime.wakeup.bellpoll import BellPoller
from pipeline.runtime.wakeup.doorbell import Bell, producer_class
from pipeline.security.sealing import Keyring

log = logging.getLogger(__name__)

_FOREIGN = Counter("llmpipe_client_foreign_records", "answers and deltas for a pending request that came from "
                   "another tenant than the one it was sent as: dropped", ("kind",))


class ClientTimeout(TimeoutError):
    pass


class PublishError(ConnectionError):
    """The broker did not acknowledge a request within the client's `publish_timeout_s` (or refused
    it). The request may still reach the broker later, when it comes back: an `idempotency_key`
    makes the caller's retry safe."""


DOZE_MAX_MS = 200
PUBLISH_TRIES = 3


class Client:
    def __init__(
        self,
        bootstrap: str,
        *,
        topic_prefix: str = "llmpipe.",
        reply_partition: int | None = None,
        entry_topic: str = "requests",
        default_timeout_s: float = 60.0,
        security: KafkaSecurity | None = None,
        publish_timeout_s: float | None = None,
        doorbell_dir: Path | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.doorbell_dir = doorbell_dir  # rings the first stage; dozes between answers (runtime/wakeup/doorbell.py)
        self._bell: Bell | None = None
        self.kafka = kafka_kwargs(security)
        self.names = TopicNames(topic_prefix)
        self.entry_topic = self.names(entry_topic)
        self.reply_partition = reply_partition
        self.default_timeout_s = default_timeout_s
        self.publish_timeout_s = publish_timeout_s  # None: the producer's own request timeout
        self.producer: AIOKafkaProducer | None = None
        self.consumer: AIOKafkaConsumer | None = None
        self._pending: dict[str, asyncio.Future[Response]] = {}
        self._acked_at: dict[str, float] = {}  # request_id -> when the broker acknowledged it (wall s), while pending
        # request_ids already answered, oldest first; bounded so a long-lived client stays small
        self._answered: OrderedDict[str, None] = OrderedDict()
        self.remember_answered = 100_000
        self.duplicates = 0
        self.unknown = 0
        self.foreign = 0  # answers and deltas of another tenant for a pending id: dropped
        # request_id -> the tenant it was sent as, while pending (bounded like `_answered`)
        self._sent_as: OrderedDict[str, str | None] = OrderedDict()
        self._cancel_key = os.urandom(32)  # derives each request's cancel secret; never leaves this client
        self._reader: asyncio.Task | None = None
        self._closing = False
        self._streams: dict[str, asyncio.Queue[Delta | Response]] = {}
        # opens deltas generate sealed (its `stream.seal`); the door sets it. Without it a sealed piece is
        # skipped and counted here, and the stream shows the terminal answer's text whole
        self.delta_keyring: Keyring | None = None
        self.sealed_unread = 0
        self.streams_on = False  # the `deltas` partition of this reply partition is read
        self._background: set[asyncio.Task] = set()
        # set by a CLI that holds the stack's keyring: replaces a doc's API key by a caller assertion
        self.sign: Callable[[RequestDoc], RequestDoc] | None = None

    async def start(self) -> Client:
        cls, extra = producer_class(self.doorbell_dir)
        self.producer = cls(bootstrap_servers=self.bootstrap, acks="all", linger_ms=1,
                            enable_idempotence=False, max_request_size=8 << 20, **self.kafka, **extra)
        await self.producer.start()
        partitions = await self.producer.partitions_for(self.names.responses)
        if not partitions:
            raise RuntimeError(f"topic {self.names.responses} does not exist (run `llmpipe topics apply`)")
        if self.reply_partition is None:
            self.reply_partition = random.choice(sorted(partitions))
        self.consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False,
                                         fetch_max_wait_ms=5, auto_offset_reset="earliest", **self.kafka)
        await self.consumer.start()
        await asyncio.sleep(0)  # aiokafka: a consumer stopped before its first tick raises CancelledError
        tps = [TopicPartition(self.names.responses, self.reply_partition)]
        if self.reply_partition in (await self.producer.partitions_for(self.names.deltas) or ()):
            tps.append(TopicPartition(self.names.deltas, self.reply_partition))
            self.streams_on = True
        self.consumer.assign(tps)
        await self.consumer.seek_to_end(*tps)
        for tp in tps:
            await self.consumer.position(tp)  # fixed before the first publish: no answer can be missed
        rewind_on_restart(self.consumer)  # a restarted embedded broker's logs start at 0 again
        if self.doorbell_dir is not None:
            self._bell = await Bell(self.doorbell_dir, [tp.topic for tp in tps]).start()
        self._reader = asyncio.create_task(self._read_replies())
        return self

    async def stop(self) -> None:
        self._closing = True  # the reader also checks this: a cancel alone can land between polls
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        for fut in self._pending.values():
            if not fut.done():
                fut.cancel()
        if self.consumer is not None:
            await self.consumer.stop()
        if self.producer is not None:
            await self.producer.stop()
        if self._bell is not None:
            self._bell.stop()

    async def __aenter__(self) -> Client:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def reply_to(self) -> ReplyTo:
        assert self.reply_partition is not None, "start() the client first"
        return ReplyTo(topic=self.names.responses, partition=self.reply_partition)

    def build(
        self,
        prompt: str | None = None,
        *,
        body: ChatBody | None = None,
        request_id: str | None = None,
        timeout_s: float | None = None,
        **fields: Any,
    ) -> RequestDoc:
        """A request document answered to this client; the deadline is now + timeout."""
        if body is None:
            if prompt is None:
                raise ValueError("give a prompt or a body")
            body = ChatBody(messages=[ChatMessage(role="user", content=prompt)])
        created = now_ms()
        rid = request_id or uuid.uuid4().hex
        fields.setdefault("cancel_digest", cancel_digest(self.cancel_secret(rid)))
        return RequestDoc(
            request_id=rid, body=body, created_ms=created,
            deadline_ms=fields.pop("deadline_ms", created + int(1000 * (timeout_s or self.default_timeout_s))),
            reply_to=self.reply_to, **fields,
        )

    def cancel_secret(self, request_id: str) -> str:
        """The secret that cancels `request_id` as sent by this client (its digest is in the request)."""
        return hmac.new(self._cancel_key, request_id.encode(), hashlib.sha256).hexdigest()

    def _sending(self, doc: RequestDoc) -> RequestDoc:
        """Remember the tenant `doc` is sent as; give an unsigned doc built elsewhere a cancel digest."""
        if doc.cancel_digest is None and doc.caller_assertion is None:  # before signing: the digest is signed
            doc = doc.model_copy(update={"cancel_digest": cancel_digest(self.cancel_secret(doc.request_id))})
        if self.sign is not None:  # the doc is final here (a stream's reply_to included)
            doc = self.sign(doc)
        self._sent_as[doc.request_id] = doc.tenant_id
        self._sent_as.move_to_end(doc.request_id)
        if len(self._sent_as) > self.remember_answered:
            self._sent_as.popitem(last=False)
        return doc

    async def submit(self, doc: RequestDoc) -> asyncio.Future[Response]:
        """Publish; the returned future resolves with the first answer for doc.request_id."""
        assert self.producer is not None, "start() the client first"
        fut = self._pending.get(doc.request_id)
        if fut is None:
            fut = self._pending[doc.request_id] = asyncio.get_running_loop().create_future()
        doc = self._sending(doc)
        headers = request_headers(doc.request_id, doc.tenant_id, doc.deadline_ms, doc.attempt, doc.traceparent)
        try:
            await self._publish(self.entry_topic, encode(doc), doc.request_id, headers)
        except PublishError:
            self._pending.pop(doc.request_id, None)
            raise
        if not fut.done():
            self._acked_at[doc.request_id] = time.time()
            fut.add_done_callback(lambda _: self._acked_at.pop(doc.request_id, None))
        return fut

    def lost_before(self, died_at: float, reason: str, retry_after_ms: int = 2000) -> int:
        """A broker that lost its storage (the embedded one, restarted) at `died_at` (wall s) lost every
        request acknowledged before then and not answered yet: answer them now (`broker_restarted`,
        503 at the door) rather than at their deadline. Returns how many."""
        lost = [rid for rid, at in self._acked_at.items() if at <= died_at]
        for rid in lost:
            self._deliver_response(Response(request_id=rid, status=Status.error, error_class="broker_restarted",
                                            reason=reason, answered_by="client", retry_after_ms=retry_after_ms))
        return len(lost)

    async def _publish(self, topic: str, value: bytes, key: str, headers: list | None = None) -> None:
        """Send and wait for the broker's ack, within `publish_timeout_s`; PublishError otherwise. An
        error the producer does not retry itself is tried again, PUBLISH_TRIES times in all (the
        embedded broker answered a produce `UnknownError` once, right after its restart)."""
        assert self.producer is not None, "start() the client first"
        if gate.is_closed():  # this process's embedded broker is restarting: no wait for what cannot pass
            raise PublishError(f"the broker did not take a record for {topic} (the embedded broker is restarting)")
        try:
            async with asyncio.timeout(self.publish_timeout_s):
                for attempt in range(1, PUBLISH_TRIES + 1):
                    try:
                        await self.producer.send_and_wait(topic, value, key=key.encode(), headers=headers)
                        return
                    except KafkaError:
                        if attempt == PUBLISH_TRIES:
                            raise
                        await asyncio.sleep(0.05 * attempt)
        except (TimeoutError, KafkaError) as exc:
            why = f"not acknowledged within {self.publish_timeout_s} s" if isinstance(exc, TimeoutError) \
                else type(exc).__name__
            raise PublishError(f"the broker did not take a record for {topic} ({why})") from None

    async def submit_many(self, docs: list[RequestDoc]) -> list[asyncio.Future[Response]]:
        """Publish a burst: every send is in flight at once; returns once the broker acked them all."""
        assert self.producer is not None, "start() the client first"
        futs, acks = [], []
        for doc in docs:
            fut = self._pending.get(doc.request_id)
            if fut is None:
                fut = self._pending[doc.request_id] = asyncio.get_running_loop().create_future()
            futs.append(fut)
            doc = self._sending(doc)
            headers = request_headers(doc.request_id, doc.tenant_id, doc.deadline_ms, doc.attempt, doc.traceparent)
            acks.append(await self.producer.send(self.entry_topic, encode(doc), key=doc.request_id.encode(),
                                                 headers=headers))
        await asyncio.gather(*acks)
        return futs

    async def request(self, doc: RequestDoc, timeout_s: float | None = None) -> Response:
        fut = await self.submit(doc)
        return await self.wait(doc.request_id, fut, timeout_s)

    async def wait(self, request_id: str, fut: asyncio.Future[Response], timeout_s: float | None = None) -> Response:
        try:
            async with asyncio.timeout(timeout_s or self.default_timeout_s):
                return await asyncio.shield(fut)
        except TimeoutError:
            self._pending.pop(request_id, None)
            raise ClientTimeout(f"no answer for {request_id} within {timeout_s or self.default_timeout_s:.0f}s") from None

    async def cancel(self, request_id: str, reason: str = "caller", secret: str | None = None) -> None:
        """Withdraw a request: the worker generating it stops, a stage it has not reached skips it,
        and its terminal answer is `cancelled` (runtime/follow/cancels.py). `secret`: the request's cancel
        secret when another client sent it (by default this client's own)."""
        assert self.producer is not None, "start() the client first"
        c = Cancel(request_id=request_id, reason=reason, secret=secret or self.cancel_secret(request_id))
        await self._publish(self.names.cancel, encode(c), request_id)

    def cancel_soon(self, request_id: str, reason: str = "caller") -> None:
        """`cancel` from code that may not await (a cancelled task's cleanup); stop() waits for it."""
        self._soon(self.cancel(request_id, reason), "a cancel")

    async def send_feedback(self, fb: Feedback) -> None:
        """Publish feedback (an API key in `fb.api_key`, or the door's assertion); returns once the
        broker has it. The feedback worker checks, masks and stores it; a refusal lands in the DLQ."""
        assert self.producer is not None, "start() the client first"
        await self._publish(self.names.feedback, encode(fb), fb.target[1])

    def publish_soon(self, topic: str, record: Any, key: str) -> None:
        """Publish a record without waiting for the broker (e.g. the front door's timing evidence)."""
        assert self.producer is not None, "start() the client first"
        self._soon(self._publish(topic, encode(record), key), "a record")

    def _soon(self, coro, what: str) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)

        def done(t: asyncio.Task) -> None:
            self._background.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.warning("client: %s could not be published: %s", what, type(t.exception()).__name__)

        task.add_done_callback(done)

    async def stream(self, doc: RequestDoc, timeout_s: float | None = None, *, cancel_on_exit: bool = True,
                     cancel_reason: str = "caller") -> AsyncIterator[Piece | Ended]:
        """Publish `doc` asking for a stream; yield each Piece to show, then the Ended (always last).
        Raises ClientTimeout when no terminal answer came in time. Leaving early (break, an
        exception, a timeout) cancels the request unless `cancel_on_exit` is False."""
        if not self.streams_on:
            raise RuntimeError(f"topic {self.names.deltas} has no partition {self.reply_partition}: "
                               "run `llmpipe topics apply`")
        reply = doc.reply_to or self.reply_to
        if not reply.stream:
            doc = doc.model_copy(update={"reply_to": reply.model_copy(update={"stream": True})})
        rid = doc.request_id
        queue: asyncio.Queue[Delta | Response] = asyncio.Queue()
        self._streams[rid] = queue
        follower = StreamFollower()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (timeout_s or self.default_timeout_s)
        ended = False
        try:
            await self.submit(doc)
            while True:
                try:
                    item = await _get_within(queue, deadline - loop.time())
                except TimeoutError:
                    raise ClientTimeout(f"no answer for {rid} within {timeout_s or self.default_timeout_s:.0f}s") from None
                if isinstance(item, Delta):
                    if not _same_sender(doc.tenant_id, item.tenant_id, None):
                        self._foreign("delta", rid)
                        continue
                    piece = follower.delta(item)
                    if piece is not None:
                        yield piece
                    continue
                rest, end = follower.end(item)
                ended = True
                if rest is not None:
                    yield rest
                yield end
                return
        finally:
            self._streams.pop(rid, None)
            if not ended:
                self._pending.pop(rid, None)
                if cancel_on_exit and not self._closing:
                    self.cancel_soon(rid, cancel_reason)

    async def _read_replies(self) -> None:
        assert self.consumer is not None
        # awake (no bell, or doorbell step 5): fast while answers are awaited, slow when none are
        poller = BellPoller(self.consumer, self._bell, what="client replies", wait_ms=5, idle_wait_ms=100,
                            idle_after_ms=500, awake_poll_ms=20, doze_max_ms=DOZE_MAX_MS)
        while not self._closing:
            batches = await poller.poll(busy=len(self._pending))
            # deltas first: a stream ends at its terminal answer, and a poll that fetched both must not
            # end it before the deltas written ahead of that answer (the dict's order is the fetcher's)
            for tp in sorted(batches, key=lambda tp: tp.topic != self.names.deltas):
                for rec in batches[tp]:
                    if rec.topic == self.names.deltas:
                        self._deliver_delta(rec.value)
                    else:
                        self._deliver(rec.value)

    def _deliver_delta(self, value: bytes | None) -> None:
        try:
            d = decode(value, Delta)
        except DecodeError:
            self.unknown += 1
            return
        queue = self._streams.get(d.request_id)
        if queue is None:  # another caller's stream on a shared partition, or one given up on
            return
        shown = readable(d, self.delta_keyring)
        if shown is None:
            self.sealed_unread += 1
            if self.sealed_unread == 1:
                log.warning("client: deltas are sealed and %s: streams show the terminal answer only",
                            "this client has no keyring" if self.delta_keyring is None else "do not open with its keyring")
            return
        queue.put_nowait(shown)

    def _deliver(self, value: bytes | None) -> None:
        try:
            resp = decode(value, Response)
        except DecodeError:
            self.unknown += 1
            return
        rid = resp.request_id
        if rid in self._pending and rid in self._sent_as and not _same_sender(self._sent_as[rid], resp.tenant_id, resp):
            self._foreign("answer", rid)
            return
        self._sent_as.pop(rid, None)
        self._deliver_response(resp)

    def _foreign(self, kind: str, request_id: str) -> None:
        self.foreign += 1
        _FOREIGN.labels(kind).inc()
        log.warning("client: dropped a%s %s for request %s from another tenant than it was sent as",
                    "n" if kind == "answer" else "", kind, request_id)

    def _deliver_response(self, resp: Response) -> None:
        rid = resp.request_id
        if rid in self._answered:
            self.duplicates += 1
            return
        fut = self._pending.pop(rid, None)
        if fut is None:
            self.unknown += 1  # another caller's answer on a shared partition, or one we gave up on
            return
        self._answered[rid] = None
        if len(self._answered) > self.remember_answered:
            self._answered.popitem(last=False)
        if not fut.done():
            fut.set_result(resp)
        queue = self._streams.get(rid)
        if queue is not None:
            queue.put_nowait(resp)


def _same_sender(sent: str | None, tenant: str | None, resp: Response | None) -> bool:
    """May a record with `tenant` be the answer (resp) or a delta (None) of a request sent as `sent`?"""
    if sent is None or tenant == sent:
        return True
    # refused before a tenant was verified (mask's authentication, a record answered before mask):
    # no tenant, and no text to show
    return tenant is None and resp is not None and resp.status != Status.ok


async def _get_within(queue: asyncio.Queue, timeout_s: float):
    """One wait with its own timeout: a timeout around a generator's loop would fire in its caller's code."""
    async with asyncio.timeout(max(0.0, timeout_s)):
        return await queue.get()
