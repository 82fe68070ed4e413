"""Verifier and reward hooks that score RL samples (generate calls them on every rollout sample).

A verifier says whether a sample is right (True/False); a reward turns the sample and that verdict
into the float a trainer optimises. Both are looked up by name: the ones shipped here, or any
`python:package.module:function` on the worker's path (the pluggable part). A hook's revision is
the digest of its source, so a changed scoring function shows up as another `verifier_revision` /
`reward_revision` in `rollouts` without anyone remembering to bump a number.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeline.contracts.request import HookSpec


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


class HookError(ValueError):
    """An unknown hook or arguments it cannot use: the request is invalid, not the engine."""


VERIFIERS: dict[str, Callable[[Sample, dict[str, Any]], bool]] = {}
REWARDS: dict[str, Callable[[Sample, bool | None, dict[str, Any]], float]] = {}


def _normalise(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split()).strip(" .!")


def exact_match(sample: Sample, args: dict[str, Any]) -> bool:
    """The answer equals `expected` (case, width and surrounding whitespace/punctuation ignored)."""
    if "expected" not in args:
        raise HookError("exact_match needs args.expected")
    return _normalise(sample.text) == _normalise(str(args["expected"]))


def regex(sample: Sample, args: dict[str, Any]) -> bool:
    """`pattern` occurs in the answer (`full: true`: the whole answer matches)."""
    try:
        pattern = re.compile(str(args["pattern"]), re.IGNORECASE if args.get("ignore_case") else 0)
    except (KeyError, re.error) as exc:
        raise HookError(f"regex needs a valid args.pattern: {exc}") from None
    text = sample.text.strip()
    return bool(pattern.fullmatch(text) if args.get("full") else pattern.search(text))


def verified(sample: Sample, ok: bool | None, args: dict[str, Any]) -> float:
    """1 for a verified sample, 0 otherwise."""
    return 1.0 if ok else 0.0


def length_penalty(sample: Sample, ok: bool | None, args: dict[str, Any]) -> float:
    """The verdict's reward (1/0) minus `per_token` for every generated token beyond `free_tokens`,
    and minus `truncated` when the sample hit max_tokens."""
    per_token = float(args.get("per_token", 0.01))
    free = int(args.get("free_tokens", 0))
    truncated = float(args.get("truncated", 0.5)) if sample.finish_reason == "length" else 0.0
    return (1.0 if ok else 0.0) - per_token * max(0, sample.tokens_out - free) - truncated


VERIFIERS.update(exact_match=exact_match, regex=regex)
REWARDS.update(verified=verified, length_penalty=length_penalty)


def _revision(name: str, fn: Callable[..., Any]) -> str:
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        source = f"{fn.__module__}.{fn.__qualname__}"
    return f"{name}@{hashlib.sha256(source.encode()).hexdigest()[:12]}"


def resolve(spec: HookSpec, table: dict[str, Callable[..., Any]]) -> Hook:
    if spec.name.startswith("python:"):
        module, _, attr = spec.name.removeprefix("python:").partition(":")
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError, ValueError) as exc:
            raise HookError(f"hook {spec.name!r} does not load: {exc}") from None
    elif spec.name in table:
        fn = table[spec.name]
    else:
        raise HookError(f"unknown hook {spec.name!r}; shipped: {', '.join(sorted(table))}, or python:module:function")
    return Hook(spec.name, _revision(spec.name, fn), fn)


@dataclass(frozen=True)
class Scorer:
    verifier: Hook | None
    reward: Hook | None
    verifier_args: dict[str, Any]
    reward_args: dict[str, Any]

    def score(self, sample: Sample) -> tuple[bool | None, float | None]:
        ok = None if self.verifier is None else bool(self.verifier.fn(sample, self.verifier_args))
        if self.reward is not None:
            return ok, float(self.reward.fn(sample, ok, self.reward_args))
        return ok, None if ok is None else (1.0 if ok else 0.0)


def scorer_for(verifier: HookSpec | None, reward: HookSpec | None) -> Scorer:
    """Resolve both hooks up front, so a bad name fails the request before any sampling."""
    return Scorer(None if verifier is None else resolve(verifier, VERIFIERS),
                  None if reward is None else resolve(reward, REWARDS),
                  verifier.args if verifier else {}, reward.args if reward else {})
