"""Streamed answers, sent to their callers while the engine generates them (`delta/v1` on `deltas`).

Protocol, for one generate worker (one `DeltaFlusher`) and each engine attempt of a request whose
reply_to asks for a stream (one `DeltaSink`):
1. The engine calls the sink's `piece()` with each new piece (text, token ids, logprobs) inside its
   output loop; it never waits here.
2. The sink's Coalescer gathers the piece (coalesce.py). When it asks to go at once (the attempt's
   first piece, or `max_tokens` waiting), or the worker's throttle window has passed since the last
   flush, the flusher flushes in the next loop turn; otherwise one timer, for the whole worker,
   flushes when the window has passed.
3. A flush takes the waiting chunk of every sink, in the order they began waiting; each chunk's
   text goes through its sink's un-masker (security/stream_unmask.py): placeholders are restored
   whole where the tenant allows it, and kept whole where it does not. With `stream.seal` (the
   default) the delta's text, tokens and logprobs are then sealed under the request's delta key
   (security/sealing.py): `deltas` is shared by every caller of a partition, and only the caller's
   client (the door) opens them.
4. One writer task hands each flush's deltas to the producer, in order and without yielding in
   between, to the caller's partition of `deltas` (the number of its reply partition): the deltas
   of all streams for one partition share a produce request. A failed send is counted and logged,
   never raised: a delta is a preview, and the terminal answer carries the whole text.
5. `finish()` sends at once what the sink has pending and what its un-masker held, as the
   attempt's `last` delta; `abandon()` (a failed or cancelled attempt) drops what is pending. Both
   return once the writer has handed the sink's deltas to the producer.
Without a stream (no flusher) the sink only counts tokens: a cancelled request is settled with the
tokens it actually used.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from pipeline.contracts.stream import Delta
from pipeline.runtime.stage import StreamPort
from pipeline.security.sealing import DeltaSealer, Keyring
from pipeline.security.stream_unmask import StreamUnmasker
from pipeline.stages.generate.coalesce import Chunk, Coalescer, Throttle
from pipeline.stages.generate.config import StreamPolicy

log = logging.getLogger(__name__)


def _now_ms() -> float:
    return time.monotonic() * 1000


class DeltaFlusher:
    """Steps 2-4 for every streaming attempt of one worker; `stop()` when the worker stops."""

    def __init__(self, port: StreamPort, *, window_ms: float = 25.0, max_tokens: int = 16) -> None:
        self.port = port
        self.throttle = Throttle(window_ms)
        self.max_tokens = max_tokens
        self.flushes = 0
        self.failed = 0
        self._waiting: dict[DeltaSink, None] = {}  # an ordered set
        self._timer: asyncio.TimerHandle | None = None
        self._soon = False  # a flush is due in the next loop turn
        self._queue: asyncio.Queue[list[tuple[DeltaSink, Delta | asyncio.Future]] | None] = asyncio.Queue()
        self._writer: asyncio.Task | None = None
        self.seal_with: Keyring | None = None  # set: every sink seals its deltas (StreamPolicy.seal)

    def configure(self, policy: StreamPolicy, keyring: Keyring | None) -> None:
        """The stage's current stream policy; sealing needs the mask keyring the stage opened at start."""
        if policy.seal and keyring is None:
            raise RuntimeError("stream.seal needs the mask keyring: configure after start()")
        self.throttle.window_ms, self.max_tokens = policy.window_ms, policy.max_tokens
        self.seal_with = keyring if policy.seal else None

    def sink(self, request_id: str, attempt: str, partition: int,
             unmasker: StreamUnmasker | None = None, tenant_id: str | None = None) -> DeltaSink:
        return DeltaSink(request_id, attempt, flusher=self, partition=partition, unmasker=unmasker, tenant_id=tenant_id)

    def wait(self, sink: DeltaSink, urgent: bool) -> None:
        """Step 2. "At once" is the next loop turn: the pieces an engine step made for several
        requests arrive in one turn (vLLM wakes every request's output stream together), and go in
        one flush."""
        self._waiting[sink] = None
        if self._soon:
            return
        loop = asyncio.get_running_loop()
        now = _now_ms()
        if urgent or self.throttle.due(now):
            self._soon = True
            loop.call_soon(self._flush_soon)
        elif self._timer is None:
            self._timer = loop.call_later(self.throttle.wait_ms(now) / 1000, self._flush_timed)

    def drop(self, sink: DeltaSink) -> None:
        self._waiting.pop(sink, None)

    def _flush_soon(self) -> None:
        self._soon = False
        if self._waiting:
            self._flush(_now_ms())

    def _flush_timed(self) -> None:
        self._timer = None
        if self._waiting:
            self._flush(_now_ms())

    def _flush(self, now: float) -> None:
        """Step 3."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch: list[tuple[DeltaSink, Delta | asyncio.Future]] = []
        for sink in self._waiting:
            chunk = sink.coalescer.take()
            if chunk is not None:
                batch.append((sink, sink.delta(chunk)))
        self._waiting.clear()
        self.throttle.sent(now)
        self.flushes += 1
        self.hand(batch)

    def hand(self, batch: list[tuple[DeltaSink, Delta | asyncio.Future]]) -> None:
        if not batch:
            return
        if self._writer is None:
            self._writer = asyncio.create_task(self._write(), name="deltas-writer")
        self._queue.put_nowait(batch)

    async def _write(self) -> None:
        """Step 4 (a future in a batch is set once the deltas before it were handed over)."""
        while (batch := await self._queue.get()) is not None:
            for sink, item in batch:
                if isinstance(item, asyncio.Future):
                    if not item.done():
                        item.set_result(None)
                    continue
                try:
                    await self.port.send(item, key=sink.key, partition=sink.partition)
                    sink.sent += 1
                except Exception as exc:  # noqa: BLE001 - a preview lost; the terminal answer is whole
                    sink.failed += 1
                    self.failed += 1
                    if self.failed == 1:
                        log.warning("generate: a delta of a request could not be sent: %s", type(exc).__name__)

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Idempotent: hands over what was queued (bounded), then ends the writer."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        writer, self._writer = self._writer, None
        if writer is None:
            return
        self._queue.put_nowait(None)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(writer)
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)


class DeltaSink:
    """One attempt's side of the protocol (steps 1, 3 and 5)."""

    def __init__(self, request_id: str, attempt: str, *, flusher: DeltaFlusher | None = None, partition: int = 0,
                 unmasker: StreamUnmasker | None = None, tenant_id: str | None = None) -> None:
        self.request_id, self.attempt, self.partition = request_id, attempt, partition
        self.tenant_id = tenant_id  # on every delta: the door takes only its own tenant's (ingress/client.py)
        self.key = request_id.encode()
        self.flusher = flusher
        self.unmasker = unmasker or StreamUnmasker(None, restore=False)
        self.coalescer = Coalescer(max_tokens=flusher.max_tokens if flusher else 16)
        self.tokens = 0  # generated so far (what a cancelled request used)
        self.sent = 0  # deltas handed to the producer
        self.failed = 0
        self.first_ms: float | None = None  # monotonic ms of the first delta made
        self._closed = False
        keyring = flusher.seal_with if flusher else None
        self.sealer = DeltaSealer(keyring, request_id) if keyring is not None else None

    def piece(self, text: str, token_ids: list[int], logprobs: list[float] | None) -> None:
        """Step 1 (the engine's OnDelta)."""
        self.tokens += len(token_ids)
        if self.flusher is None or self._closed:
            return
        self.flusher.wait(self, self.coalescer.add(text, token_ids, logprobs))

    def delta(self, chunk: Chunk, last: bool = False) -> Delta:
        """Step 3 (the last chunk also takes what the un-masker held back)."""
        text = self.unmasker.feed(chunk.text) + (self.unmasker.flush() if last else "")
        if self.first_ms is None:
            self.first_ms = _now_ms()
        d = Delta(request_id=self.request_id, tenant_id=self.tenant_id, attempt=self.attempt, seq=chunk.seq,
                  text=text, token_ids=chunk.token_ids, logprobs=chunk.logprobs, last=last)
        return self.sealer.seal(d) if self.sealer is not None else d

    async def finish(self) -> None:
        """Step 5, after the attempt succeeded."""
        if self.flusher is None or self._closed:
            return
        chunk = self.coalescer.take(even_empty=True)
        assert chunk is not None
        await self._close([(self, self.delta(chunk, last=True))])

    async def abandon(self) -> None:
        """Step 5, after the attempt failed or was cancelled: what waits is dropped."""
        if self.flusher is None or self._closed:
            return
        await self._close([])

    async def _close(self, batch: list[tuple[DeltaSink, Delta | asyncio.Future]]) -> None:
        assert self.flusher is not None
        self._closed = True
        self.flusher.drop(self)
        done = asyncio.get_running_loop().create_future()
        self.flusher.hand([*batch, (self, done)])
        await asyncio.shield(done)
