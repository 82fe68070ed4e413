"""Following one streamed answer: what a caller is shown when attempts change.

Deltas are at-least-once previews from whichever attempt is generating: a retry, a fallback to
another deployment, or a redelivery after a generate worker died each start a new attempt that
streams from its first token again. A caller must never see text twice, or two attempts
interleaved. The protocol, for one request:

1. The first attempt seen is followed.
2. A delta of another attempt means the followed one was abandoned (attempts of one request are
   sequential): follow the new one; an abandoned attempt is never followed again, even if it
   sends more (a worker that lost its partition may still be running).
3. The followed attempt's text accumulates (a repeated seq is a producer retry: dropped). What it
   has beyond what the caller was shown is shown, provided its text starts with what was shown:
   a new attempt stays silent until it has regenerated what the caller already saw, and then
   continues from there. That is the clean continuation.
4. An attempt whose text disagrees with what was shown (it sampled differently), or that skipped a
   seq, is no longer followed: the stream waits for the terminal answer.
5. The terminal answer is authoritative. If it is ok and its text starts with what was shown, the
   rest of it is shown and the stream ends cleanly; otherwise the stream ends with an error (the
   answer failed, or it is not the text the caller was shown).

Deltas sealed by generate (`stream.seal`) are opened before any of this (`readable`); one that does
not open is skipped like a delta never received, so the terminal answer still ends the stream whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.contracts import Response, Status
from pipeline.contracts.stream import Delta
from pipeline.security.sealing import Keyring, RestoreError, open_delta


@dataclass
class Piece:
    """Text to show now, with the tokens behind it when they are known (None: from the terminal)."""

    text: str
    attempt: str | None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None


@dataclass
class Ended:
    """The stream is over. `error` is None when the caller was shown exactly `response.text`."""

    response: Response
    error: str | None = None  # an error_class when the stream did not end with the answer it showed

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class StreamFollower:
    shown: str = ""
    attempts_seen: int = 0
    switches: int = 0  # times the followed attempt changed (step 2)
    _followed: str | None = None
    _abandoned: set[str] = field(default_factory=set)
    _texts: dict[str, str] = field(default_factory=dict)
    _next_seq: dict[str, int] = field(default_factory=dict)
    _broken: set[str] = field(default_factory=set)

    def delta(self, d: Delta) -> Piece | None:
        """Steps 1-4 for one delta: the piece to show now, if any."""
        a = d.attempt
        if a in self._abandoned or a in self._broken:
            return None
        if a != self._followed:
            if self._followed is not None:
                self._abandoned.add(self._followed)
                self.switches += 1
            self._followed = a
            self.attempts_seen += 1
        expected = self._next_seq.get(a, 0)
        if d.seq < expected:
            return None  # a duplicate (the producer retried a batch)
        if d.seq > expected:
            self._broken.add(a)  # a piece is missing: its text can no longer be trusted
            return None
        self._next_seq[a] = expected + 1
        text = self._texts[a] = self._texts.get(a, "") + d.text
        if len(text) <= len(self.shown):
            if not self.shown.startswith(text):
                self._broken.add(a)
            return None
        if not text.startswith(self.shown):
            self._broken.add(a)
            return None
        new = text[len(self.shown):]
        self.shown = text
        # the tokens belong to this delta's text; when only part of it is new, they span more than it shows
        whole = len(new) == len(d.text)
        return Piece(new, a, d.token_ids if whole else None, d.logprobs if whole else None)

    def end(self, resp: Response) -> tuple[Piece | None, Ended]:
        """Step 5: the rest of the answer (if any) and how the stream ended."""
        if resp.status is not Status.ok:
            return None, Ended(resp, resp.error_class or resp.status.value)
        text = resp.text or ""
        if not text.startswith(self.shown):
            return None, Ended(resp, "stream_diverged")
        rest = text[len(self.shown):]
        self.shown = text
        return (Piece(rest, None) if rest else None), Ended(resp)


def readable(d: Delta, keyring: Keyring | None) -> Delta | None:
    """`d` as it can be followed: opened when sealed; None when sealed and it does not open here."""
    if d.sealed is None:
        return d
    if keyring is None:
        return None
    try:
        return open_delta(d, keyring)
    except RestoreError:
        return None
