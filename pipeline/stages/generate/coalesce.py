"""Coalescing engine output into stream chunks: a long answer is tens of records, not thousands.

Two parts, both pure:
- `Coalescer`, one per streaming attempt, gathers its pieces into numbered chunks. Its first
  piece, or `max_tokens` waiting tokens, ask to go at once (the first token never waits for a
  second one: caller TTFT is the engine's).
- `Throttle`, one per generate worker, is a leading-edge throttle over all its streams: what waits
  goes when no chunk went in the last `window_ms`, else when that window has passed. One flush
  sends every attempt's waiting chunk together (generate/stream.py), so concurrent streams share
  one produce request per window rather than one each. On the embedded broker that matters twice:
  each produce request is a batch, and a fetch lists every batch of its partition
  (docs/decisions/0001-embedded-broker-tansu.md).
So a stream gets at most one chunk per window while tokens come faster than that, one per token
when they come slower, and no piece waits longer than `window_ms`.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Chunk:
    seq: int  # 0, 1, 2 ... within one attempt
    text: str
    token_ids: list[int]
    logprobs: list[float] | None


@dataclass
class Coalescer:
    max_tokens: int = 16
    _seq: int = 0
    _text: list[str] = field(default_factory=list)
    _ids: list[int] = field(default_factory=list)
    _logprobs: list[float] | None = None
    _pending: bool = False

    @property
    def pending(self) -> bool:
        return self._pending

    def add(self, text: str, token_ids: list[int], logprobs: list[float] | None) -> bool:
        """Take one piece; True when what waits should go now (the attempt's first piece, or
        `max_tokens` tokens waiting), whatever the throttle says."""
        self._pending = True
        self._text.append(text)
        self._ids.extend(token_ids)
        if logprobs is not None:
            self._logprobs = (self._logprobs or []) + list(logprobs)
        return self._seq == 0 or len(self._ids) >= self.max_tokens

    def take(self, even_empty: bool = False) -> Chunk | None:
        """What is pending, as one chunk (None when nothing is, unless `even_empty`: the last one)."""
        if not self._pending and not even_empty:
            return None
        chunk = Chunk(self._seq, "".join(self._text), self._ids, self._logprobs)
        self._seq += 1
        self._text, self._ids, self._logprobs, self._pending = [], [], None, False
        return chunk


@dataclass
class Throttle:
    window_ms: float = 25.0
    _sent_ms: float | None = None  # when the last flush went

    def wait_ms(self, now_ms: float) -> float:
        """How long until what waits may go (0: now)."""
        return 0.0 if self._sent_ms is None else max(0.0, self._sent_ms + self.window_ms - now_ms)

    def due(self, now_ms: float) -> bool:
        return self.wait_ms(now_ms) <= 0

    def sent(self, now_ms: float) -> None:
        self._sent_ms = now_ms
