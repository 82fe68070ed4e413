"""Fail-closed pattern matching for PII recognizers: a regex scan that runs past its budget
raises instead of being skipped (Presidio logs a timeout and carries on, which would let the text
pass unmasked). Every project pattern and every Presidio pattern recognizer the masker uses runs
through `FailClosedPatterns`.

The budget is CPU time of the scanning thread. The `regex` module can only stop a scan on the
process's CPU clock (`clock()`), which every thread of the process advances: on a loaded host a scan
that waits for a core while other threads of the process run (the stack's warm-up, with native
threads busy) ran out of a 0.2 s budget having spent microseconds itself. So a scan is tried again,
up to `_ATTEMPTS` times, while it has not spent its own budget (`time.thread_time`):

1. Scan with a process-clock timeout of what is left of the thread budget times `speed` (1 at first).
2. Done: the matches. Timed out: count the thread's own CPU against the budget. If the process clock
   ran less than `_CONTENDED` times faster than the thread, the time was the pattern's: fail closed.
3. Otherwise `speed` is how much faster it ran (at most `_MAX_SPEEDUP`), and the scan resumes after
   its last match with what is left (matches found so far are kept).

So a pathological pattern is refused after one budget of its own CPU when it has the process to
itself, and after at most `_MAX_SPEEDUP` budgets if other threads' work stops just as it is retried.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import regex as re
from presidio_analyzer import Pattern, PatternRecognizer, RecognizerResult
from presidio_analyzer.nlp_engine import NlpArtifacts

# per pattern scan of one window (the masker's windows are 2,000 chars; a scan takes a few ms at most),
# in CPU time of the scanning thread. Presidio's default is 60 s (REGEX_TIMEOUT_SECONDS).
PATTERN_TIMEOUT_S = 0.2
_ATTEMPTS = 3
_CONTENDED = 1.5  # the process clock ran this much faster than the thread: other threads' work
_MAX_SPEEDUP = 4.0  # the most a retry's process-clock timeout is stretched per unit of thread budget


class MaskFailed(RuntimeError):
    """PII detection did not complete, so the text must not go on (fail closed). Never retried:
    the same text would fail the same way. The message never holds the text."""

    error_class = "mask_failed"
    retryable = False


class MaskTimeout(MaskFailed):
    """A recognizer's regex ran past its timeout."""


class _TimedRegex:
    """A compiled regex whose scans raise MaskTimeout past their thread-CPU budget (module docstring).
    Presidio catches TimeoutError around its pattern loop and skips the pattern; MaskTimeout is no
    TimeoutError."""

    def __init__(self, compiled: re.Pattern[str], name: str, timeout_s: float) -> None:
        self.compiled, self.name, self.timeout_s = compiled, name, timeout_s
        self.retries = 0  # scans tried again because other threads ran the process clock down

    def finditer(self, text: str, pos: int = 0, endpos: int | None = None, **kwargs: Any) -> Iterator[re.Match[str]]:
        kwargs.pop("timeout", None)  # ours, not Presidio's 60 s
        # scan it all now: the clock runs from this call, and Presidio's work per match (e.g. the
        # email domain check, slow on first use) must not be charged to the pattern
        return iter(self._scan(text, pos, endpos, kwargs))

    def _scan(self, text: str, pos: int, endpos: int | None, kwargs: dict[str, Any]) -> list[re.Match[str]]:
        found: list[re.Match[str]] = []
        used, speed = 0.0, 1.0  # this thread's CPU so far; process clock per thread clock
        for _ in range(_ATTEMPTS):
            left = self.timeout_s - used
            t0, p0 = time.thread_time(), time.process_time()
            try:
                for m in self.compiled.finditer(text, pos, endpos, timeout=left * speed, **kwargs):
                    found.append(m)
                return found
            except TimeoutError:
                own, every = time.thread_time() - t0, time.process_time() - p0
            used += own
            if every < own * _CONTENDED or used >= self.timeout_s:
                break  # the pattern had the clock to itself, or spent its budget: it is the pattern
            speed = min(_MAX_SPEEDUP, every / max(own, 1e-9))
            self.retries += 1
            if found:  # resume after the last match, as the scan would have (the patterns match no empty text)
                pos = max(found[-1].end(), found[-1].start() + 1)
        raise MaskTimeout(f"pattern {self.name!r} timed out after {self.timeout_s} s of CPU")


class FailClosedPatterns(PatternRecognizer):
    """A PatternRecognizer (and a mixin for Presidio's own) whose patterns run with `timeout_s`, and
    a timeout raises.

    Relies on PatternRecognizer reusing `pattern.compiled_regex` while `compiled_with_flags` matches;
    tests/test_mask_redos.py checks a timeout still propagates through Presidio."""

    def __init__(self, *args: Any, timeout_s: float = PATTERN_TIMEOUT_S, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_s = timeout_s
        # own copies: predefined recognizers share their class-level Pattern objects
        self.patterns = [Pattern(p.name, p.regex, p.score) for p in self.patterns]

    def analyze(self, text: str, entities: list[str], nlp_artifacts: NlpArtifacts | None = None,
                regex_flags: int | None = None) -> list[RecognizerResult]:
        flags = regex_flags or self.global_regex_flags  # as PatternRecognizer picks them
        for p in self.patterns:
            if not isinstance(p.compiled_regex, _TimedRegex) or p.compiled_with_flags != flags:
                p.compiled_regex = _TimedRegex(re.compile(p.regex, flags=flags), p.name, self.timeout_s)
                p.compiled_with_flags = flags
        return super().analyze(text, entities, nlp_artifacts, regex_flags)
