"""Coalescing engine output into stream chunks: a long answer is tens of records, not thousands.

A chunk is sent when its oldest piece has waited `window_ms`, or when it holds `max_tokens`
tokens, whichever comes first; the stage calls `due(now)` on a timer, because an engine between
tokens produces no piece that could trigger the flush.
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
    _since: float | None = None

    def add(self, text: str, token_ids: list[int], logprobs: list[float] | None, now_ms: float) -> Chunk | None:
        """Take one piece; a chunk when this piece fills one, else None."""
        if self._since is None:
            self._since = now_ms
        self._text.append(text)
        self._ids.extend(token_ids)
        if logprobs is not None:
            self._logprobs = (self._logprobs or []) + list(logprobs)
        return self.take() if len(self._ids) >= self.max_tokens or self.due(now_ms) else None

    def due(self, now_ms: float) -> bool:
        """Something has waited the whole window."""
        return self._since is not None and now_ms - self._since >= self.window_ms

    def take(self) -> Chunk | None:
        """What is pending, as one chunk (None when nothing is)."""
        if self._since is None:
            return None
        chunk = Chunk(self._seq, "".join(self._text), self._ids, self._logprobs)
        self._seq += 1
        self._text, self._ids, self._logprobs, self._since = [], [], None, None
        return chunk
