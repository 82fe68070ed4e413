"""Coalescing engine output into stream chunks: a long answer is tens of records, not thousands.

The rule is a leading-edge throttle:
1. A piece that arrives when no chunk was sent in the last `window_ms` is sent at once (the first
   token never waits for a second one: caller TTFT is the engine's).
2. Otherwise it waits with the pieces after it, until `window_ms` has passed since the last chunk
   (`due(now)`, checked on a timer: an engine between tokens produces no piece that could trigger
   the send) or until `max_tokens` tokens are waiting, whichever comes first.
So chunks are at most one per window while tokens come faster than that, and one per token when
they come slower.
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
    window_ms: float = 25.0
    max_tokens: int = 16
    _seq: int = 0
    _text: list[str] = field(default_factory=list)
    _ids: list[int] = field(default_factory=list)
    _logprobs: list[float] | None = None
    _pending: bool = False
    _sent_ms: float | None = None  # when the last chunk went

    def add(self, text: str, token_ids: list[int], logprobs: list[float] | None, now_ms: float) -> Chunk | None:
        """Take one piece; a chunk when it may go now, else None (it waits for `due`)."""
        self._pending = True
        self._text.append(text)
        self._ids.extend(token_ids)
        if logprobs is not None:
            self._logprobs = (self._logprobs or []) + list(logprobs)
        return self.take(now_ms) if len(self._ids) >= self.max_tokens or self.due(now_ms) else None

    def wait_ms(self, now_ms: float) -> float:
        """How long until what is pending may go (0: now)."""
        return 0.0 if self._sent_ms is None else max(0.0, self._sent_ms + self.window_ms - now_ms)

    def due(self, now_ms: float) -> bool:
        """Something is pending and the window since the last chunk has passed."""
        return self._pending and self.wait_ms(now_ms) <= 0

    def take(self, now_ms: float, even_empty: bool = False) -> Chunk | None:
        """What is pending, as one chunk (None when nothing is, unless `even_empty`: the last one)."""
        if not self._pending and not even_empty:
            return None
        chunk = Chunk(self._seq, "".join(self._text), self._ids, self._logprobs)
        self._seq += 1
        self._text, self._ids, self._logprobs, self._pending, self._sent_ms = [], [], None, False, now_ms
        return chunk
