"""Verifier and reward hooks that score RL samples (generate calls them on every rollout sample).

A verifier says whether a sample is right (True/False); a reward turns the sample and that verdict
into the float a trainer optimises, within the range the hook declares. Which hooks a request may
name, and with what arguments, is the operator's choice (rollouts/hooks.py); this module holds the
shipped hooks and the scoring itself. A hook's revision is the digest of its source, so a changed
scoring function shows up as another `verifier_revision` / `reward_revision` in `rollouts` without
anyone remembering to bump a number.
"""

from __future__ import annotations

import hashlib
import inspect
import math
import time
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import regex as re_bounded  # patterns come from callers: a timeout, and no backtracking blow-up on the loop

REGEX_CALL_S = 0.05  # one match, when no budget is given (the policy sets both)


@dataclass(frozen=True)
class Sample:
    text: str
    tokens_out: int
    finish_reason: str


@dataclass(frozen=True)
class Hook:
    name: str
    revision: str
    fn: Callable[..., Any]
    range: tuple[float, float] | None = None  # a reward's declared [lo, hi]


@dataclass(frozen=True)
class Scored:
    verified: bool | None
    score: float | None
    clipped_from: float | None = None  # the reward hook's own value, when it lay outside its range


class HookError(ValueError):
    """A hook the request may not name, or arguments it may not give: the request is invalid, not the engine."""


class HookFailed(Exception):
    """Scoring a sample failed (a pattern ran out of time, an operator's hook raised or returned no
    number): the request's answer, never the worker's failure. Not a TimeoutError on purpose."""

    def __init__(self, error_class: str, reason: str) -> None:
        super().__init__(reason)
        self.error_class = error_class


class Budget:
    """Time for a request's regex matches: each call gets at most `per_call_s`, all together `total_s`."""

    def __init__(self, total_s: float, per_call_s: float) -> None:
        self.left_s, self.per_call_s = total_s, per_call_s

    def next_call_s(self) -> float:
        if self.left_s <= 0:
            raise HookFailed("rollout_hook_timeout", "regex verifier: the request's pattern budget is spent")
        return min(self.per_call_s, self.left_s)

    def spend(self, seconds: float) -> None:
        self.left_s -= seconds


VERIFIERS: dict[str, Callable[..., bool]] = {}
REWARDS: dict[str, Callable[..., float]] = {}


def _normalise(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split()).strip(" .!")


def exact_match(sample: Sample, args: dict[str, Any]) -> bool:
    """The answer equals `expected` (case, width and surrounding whitespace/punctuation ignored)."""
    if "expected" not in args:
        raise HookError("exact_match needs args.expected")
    return _normalise(sample.text) == _normalise(str(args["expected"]))


def compile_pattern(args: dict[str, Any]) -> Any:
    """The regex verifier's pattern, compiled by the `regex` module. Raises HookError."""
    try:
        return re_bounded.compile(str(args["pattern"]), re_bounded.IGNORECASE if args.get("ignore_case") else 0)
    except (KeyError, re_bounded.error) as exc:
        raise HookError(f"regex needs a valid args.pattern: {exc}") from None


def regex(sample: Sample, args: dict[str, Any], *, compiled: Any = None, budget: Budget | None = None) -> bool:
    """`pattern` occurs in the answer (`full: true`: the whole answer matches), within the time budget.
    `concurrent`: the match releases the GIL, so the event loop's thread keeps running meanwhile."""
    pattern = compiled if compiled is not None else compile_pattern(args)
    timeout_s = (budget or Budget(REGEX_CALL_S, REGEX_CALL_S)).next_call_s()
    match = pattern.fullmatch if args.get("full") else pattern.search
    t0 = time.perf_counter()
    try:
        return match(sample.text.strip(), timeout=timeout_s, concurrent=True) is not None
    except TimeoutError:
        raise HookFailed("rollout_hook_timeout",
                         f"regex verifier: the pattern ran past {timeout_s * 1000:.0f} ms on one sample") from None
    finally:
        if budget is not None:
            budget.spend(time.perf_counter() - t0)


def verified(sample: Sample, ok: bool | None, args: dict[str, Any]) -> float:
    """1 for a verified sample, 0 otherwise."""
    return 1.0 if ok else 0.0


def length_penalty(sample: Sample, ok: bool | None, args: dict[str, Any]) -> float:
    """The verdict's reward (1/0) minus `per_token` for every generated token beyond `free_tokens`,
    and minus `truncated` when the sample hit max_tokens (clipped to the declared [-1, 1])."""
    per_token = float(args.get("per_token", 0.01))
    free = int(args.get("free_tokens", 0))
    truncated = float(args.get("truncated", 0.5)) if sample.finish_reason == "length" else 0.0
    return (1.0 if ok else 0.0) - per_token * max(0, sample.tokens_out - free) - truncated


VERIFIERS.update(exact_match=exact_match, regex=regex)
REWARDS.update(verified=verified, length_penalty=length_penalty)


def revision(name: str, fn: Callable[..., Any]) -> str:
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        source = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}"
    return f"{name}@{hashlib.sha256(source.encode()).hexdigest()[:12]}"


def _call(hook: Hook, *args: Any) -> Any:
    """An operator's hook runs inside the worker: whatever it raises (SystemExit included) fails this
    request's scoring, by type name only (its message may quote the sample)."""
    try:
        return hook.fn(*args)
    except (HookFailed, KeyboardInterrupt):
        raise
    except BaseException as exc:  # noqa: BLE001 - an operator's hook must not stop the worker
        raise HookFailed("rollout_hook_failed", f"hook {hook.name!r} raised {type(exc).__name__}") from None


def bounded(hook: Hook, value: Any) -> tuple[float, float | None]:
    """A reward within its declared range: NaN, infinity or a non-number is refused (HookFailed); a
    value outside the range is clipped, and the raw value returned as the flag."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise HookFailed("rollout_hook_failed", f"reward {hook.name!r} returned {type(value).__name__}, "
                                                "not a number") from None
    if not math.isfinite(x):
        raise HookFailed("rollout_hook_failed", f"reward {hook.name!r} returned {x}")
    lo, hi = hook.range or (0.0, 1.0)
    return (x, None) if lo <= x <= hi else (min(hi, max(lo, x)), x)


@dataclass(frozen=True)
class Scorer:
    verifier: Hook | None
    reward: Hook | None
    verifier_args: dict[str, Any]
    reward_args: dict[str, Any]

    def score(self, sample: Sample) -> Scored:
        """Raises HookFailed."""
        ok = None if self.verifier is None else bool(_call(self.verifier, sample, self.verifier_args))
        if self.reward is None:
            return Scored(ok, None if ok is None else (1.0 if ok else 0.0))
        value, raw = bounded(self.reward, _call(self.reward, sample, ok, self.reward_args))
        return Scored(ok, value, raw)

    def score_all(self, samples: list[Sample]) -> list[Scored]:
        return [self.score(s) for s in samples]
