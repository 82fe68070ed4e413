"""One attempt's answer, sent to its caller while the engine generates it (`delta/v1` on `deltas`).

Protocol, per engine attempt of a request whose reply_to asks for a stream:
1. The engine calls `piece()` with each new piece (text, token ids, logprobs) inside its output
   loop; it never waits here.
2. Pieces are coalesced (coalesce.py): the first goes at once, later ones at most one chunk per
   window or per `max_tokens`. A timer sends what waits when the engine pauses.
3. A chunk's text goes through the stream un-masker (security/stream_unmask.py): placeholders are
   restored whole where the tenant allows it, and kept whole where it does not.
4. Chunks are queued, and one task sends them in order to the caller's partition of `deltas`
   (the number of its reply partition). A failed send is counted and logged, never raised: a
   delta is a preview, and the terminal answer carries the whole text.
5. `finish()` sends what is pending and what the un-masker held, as the attempt's `last` delta;
   `abandon()` (a failed or cancelled attempt) drops what is pending. Both wait until the queue
   is handed to the producer.
Without a stream (publish off) the sink only counts tokens: a cancelled request is settled with
the tokens it actually used.
"""

from __future__ import annotations

import asyncio
import logging
import time

from pydantic import BaseModel, Field

from pipeline.contracts.stream import Delta
from pipeline.runtime.codec import encode
from pipeline.security.stream_unmask import StreamUnmasker
from pipeline.stages.generate.coalesce import Chunk, Coalescer

log = logging.getLogger(__name__)


class StreamPolicy(BaseModel):
    window_ms: float = Field(25.0, gt=0, description="at most one delta per window while tokens come faster")
    max_tokens: int = Field(16, ge=1, description="a delta goes once this many tokens wait, window or not")


def _now_ms() -> float:
    return time.monotonic() * 1000


class DeltaSink:
    def __init__(self, request_id: str, attempt: str, *, producer=None, topic: str = "", partition: int = 0,
                 unmasker: StreamUnmasker | None = None, window_ms: float = 25.0, max_tokens: int = 16) -> None:
        self.request_id, self.attempt = request_id, attempt
        self.producer, self.topic, self.partition = producer, topic, partition
        self.publish = producer is not None and bool(topic)
        self.unmasker = unmasker or StreamUnmasker(None, restore=False)
        self.coalescer = Coalescer(window_ms=window_ms, max_tokens=max_tokens)
        self.tokens = 0  # generated so far (what a cancelled request used)
        self.sent = 0  # deltas handed to the producer
        self.failed = 0
        self.first_ms: float | None = None  # monotonic ms of the first delta queued
        self._timer: asyncio.TimerHandle | None = None
        self._queue: asyncio.Queue[Delta | None] = asyncio.Queue()
        self._writer: asyncio.Task | None = None
        self._closed = False

    def piece(self, text: str, token_ids: list[int], logprobs: list[float] | None) -> None:
        """Step 1-2 (the engine's OnDelta)."""
        self.tokens += len(token_ids)
        if not self.publish or self._closed:
            return
        now = _now_ms()
        chunk = self.coalescer.add(text, token_ids, logprobs, now)
        if chunk is not None:
            self._queue_chunk(chunk)
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.coalescer.wait_ms(now) / 1000, self._tick)

    def _tick(self) -> None:
        self._timer = None
        if self._closed:
            return
        now = _now_ms()
        if self.coalescer.due(now):
            chunk = self.coalescer.take(now)
            if chunk is not None:
                self._queue_chunk(chunk)

    def _queue_chunk(self, chunk: Chunk, last: bool = False) -> None:
        """Step 3-4 (the last chunk also takes what the un-masker held back)."""
        text = self.unmasker.feed(chunk.text) + (self.unmasker.flush() if last else "")
        if self._writer is None:
            self._writer = asyncio.create_task(self._write(), name=f"deltas-{self.request_id[:8]}")
        if self.first_ms is None:
            self.first_ms = _now_ms()
        self._queue.put_nowait(Delta(request_id=self.request_id, attempt=self.attempt, seq=chunk.seq, text=text,
                                     token_ids=chunk.token_ids, logprobs=chunk.logprobs, last=last))

    async def _write(self) -> None:
        assert self.producer is not None
        key = self.request_id.encode()
        while (d := await self._queue.get()) is not None:
            try:
                await self.producer.send(self.topic, encode(d), key=key, partition=self.partition)
                self.sent += 1
            except Exception as exc:  # noqa: BLE001 - a preview lost; the terminal answer is whole
                self.failed += 1
                if self.failed == 1:
                    log.warning("generate: a delta of a request could not be sent: %s", type(exc).__name__)

    async def finish(self) -> None:
        """Step 5, after the attempt succeeded."""
        if not self.publish or self._closed:
            return
        self._stop_timer()
        chunk = self.coalescer.take(_now_ms(), even_empty=True)
        assert chunk is not None
        self._queue_chunk(chunk, last=True)
        await self._drain()

    async def abandon(self) -> None:
        """Step 5, after the attempt failed or was cancelled: what waits is dropped."""
        self._stop_timer()
        await self._drain()

    def _stop_timer(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def _drain(self) -> None:
        self._closed = True
        if self._writer is not None:
            self._queue.put_nowait(None)
            await asyncio.shield(self._writer)
