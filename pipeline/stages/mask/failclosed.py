"""Fail-closed pattern matching for PII recognizers: a regex scan that runs past its timeout
raises instead of being skipped (Presidio logs a timeout and carries on, which would let the text
pass unmasked). Every project pattern and every Presidio pattern recognizer the masker uses runs
through `FailClosedPatterns`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import regex as re
from presidio_analyzer import Pattern, PatternRecognizer, RecognizerResult
from presidio_analyzer.nlp_engine import NlpArtifacts

# per pattern scan of one window (the masker's windows are 2,000 chars; a scan takes a few ms at most).
# Presidio's default is 60 s (REGEX_TIMEOUT_SECONDS). The `regex` module's clock is the process's CPU
# time, so other threads' work counts too: keep ample headroom.
PATTERN_TIMEOUT_S = 0.2


class MaskFailed(RuntimeError):
    """PII detection did not complete, so the text must not go on (fail closed). Never retried:
    the same text would fail the same way. The message never holds the text."""

    error_class = "mask_failed"
    retryable = False


class MaskTimeout(MaskFailed):
    """A recognizer's regex ran past its timeout."""


class _TimedRegex:
    """A compiled regex whose scans raise MaskTimeout past the timeout. Presidio catches
    TimeoutError around its pattern loop and skips the pattern; MaskTimeout is no TimeoutError."""

    def __init__(self, compiled: re.Pattern[str], name: str, timeout_s: float) -> None:
        self.compiled, self.name, self.timeout_s = compiled, name, timeout_s

    def finditer(self, text: str, *args: Any, **kwargs: Any) -> Iterator[re.Match[str]]:
        kwargs["timeout"] = self.timeout_s  # ours, not Presidio's 60 s
        try:
            # scan it all now: the clock runs from this call, and Presidio's work per match (e.g. the
            # email domain check, slow on first use) must not be charged to the pattern
            matches = list(self.compiled.finditer(text, *args, **kwargs))
        except TimeoutError as exc:
            raise MaskTimeout(f"pattern {self.name!r} timed out after {self.timeout_s} s") from exc
        return iter(matches)


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
