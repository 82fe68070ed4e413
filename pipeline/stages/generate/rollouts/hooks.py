"""Which verifier and reward hooks a rollout request may name: the operator's choice, in generate's
policy (`rollout_hooks`), never the caller's.

A request names a hook the policy lists and gives only the arguments the policy declares, each
within its bounds (numbers in [min, max], strings up to max_length). A `python:module:function`
hook runs only when the operator listed it: the policy imports it when it is loaded (a hook that
does not import stops the worker's start with the reason), and a request naming one that is not
listed is refused before anything is imported. Every reward declares the range of its values.

    stages:
      - name: generate
        policy:
          rollout_hooks:
            verifiers:   # replaces the default (the shipped exact_match and regex)
              exact_match: {}
              "python:mylab.checks:is_prime": {args: {limit: {type: integer, min: 1, max: 100000}}}
            rewards:
              verified: {}
              length_penalty: {args: {per_token: {max: 0.05}}}   # tightens the shipped bound
              "python:mylab.rewards:brevity": {range: [0, 1]}
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable
from functools import partial
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from pipeline.contracts.request import HookSpec
from pipeline.stages.generate.rollouts.rewards import (
    REWARDS,
    VERIFIERS,
    Budget,
    Hook,
    HookError,
    Scorer,
    compile_pattern,
    regex,
    revision,
)

_PYTHON_HOOK = re.compile(r"^python:([A-Za-z_][\w.]*):([A-Za-z_]\w*)$")
Kind = Literal["verifier", "reward"]


class ArgRule(BaseModel):
    """One argument a request may give a hook."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["number", "integer", "string", "boolean"] = "number"
    min: float | None = None
    max: float | None = None
    max_length: int = Field(256, ge=1, le=65536, description="strings (a number given for one counts as its text)")
    required: bool = False


class HookRule(BaseModel):
    model_config = ConfigDict(extra="forbid")
    args: dict[str, ArgRule] = Field(default_factory=dict, description="the only arguments a request may give")
    range: tuple[float, float] | None = Field(None, description="rewards: [lo, hi]; a value outside is clipped")

    @model_validator(mode="after")
    def _range(self) -> HookRule:
        if self.range is not None and not (math.isfinite(self.range[0]) and math.isfinite(self.range[1])
                                           and self.range[0] < self.range[1]):
            raise ValueError(f"range must be finite with lo < hi, got {list(self.range)}")
        return self


def _shipped_verifiers() -> dict[str, HookRule]:
    return {"exact_match": HookRule(args={"expected": ArgRule(type="string", max_length=4096, required=True)}),
            "regex": HookRule(args={"pattern": ArgRule(type="string", max_length=256, required=True),
                                    "full": ArgRule(type="boolean"), "ignore_case": ArgRule(type="boolean")})}


def _shipped_rewards() -> dict[str, HookRule]:
    return {"verified": HookRule(range=(0.0, 1.0)),
            "length_penalty": HookRule(range=(-1.0, 1.0), args={
                "per_token": ArgRule(min=0, max=1), "free_tokens": ArgRule(type="integer", min=0, max=1_000_000),
                "truncated": ArgRule(min=0, max=1)})}


SHIPPED: dict[Kind, tuple[dict[str, Callable[..., Any]], Callable[[], dict[str, HookRule]]]] = {
    "verifier": (VERIFIERS, _shipped_verifiers), "reward": (REWARDS, _shipped_rewards)}


def load_python_hook(name: str) -> Callable[..., Any]:
    """Import an operator's `python:module:function`. Whatever the import raises (SystemExit too) is
    a HookError with the reason."""
    m = _PYTHON_HOOK.match(name)
    if m is None:
        raise HookError(f"hook {name!r} is not python:module:function")
    try:
        fn = getattr(importlib.import_module(m.group(1)), m.group(2))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - an import that exits or fails is a configuration error
        raise HookError(f"hook {name!r} does not load: {type(exc).__name__}: {exc}") from None
    if not callable(fn):
        raise HookError(f"hook {name!r} is not callable")
    return fn


class RolloutHooks(BaseModel):
    model_config = ConfigDict(extra="forbid")
    verifiers: dict[str, HookRule] = Field(default_factory=_shipped_verifiers)
    rewards: dict[str, HookRule] = Field(default_factory=_shipped_rewards)
    regex_call_ms: float = Field(50.0, gt=0, le=10_000, description="one regex match")
    regex_budget_ms: float = Field(500.0, gt=0, le=60_000, description="all regex matches of one request")
    score_timeout_s: float = Field(10.0, gt=0, le=600, description="scoring one request's samples, hooks included")
    _python: dict[str, Callable[..., Any]] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _load(self) -> RolloutHooks:
        """Shipped hooks get their shipped bounds, tightened by the operator's; python hooks are imported now."""
        for kind, rules in (("verifier", self.verifiers), ("reward", self.rewards)):
            table, shipped = SHIPPED[kind]  # type: ignore[index]
            for name, rule in list(rules.items()):
                if name in table:
                    rules[name] = _merged(name, shipped()[name], rule)
                    continue
                try:
                    self._python[name] = load_python_hook(name)
                except HookError as exc:
                    raise ValueError(f"rollout_hooks.{kind}s: {exc} (shipped: {', '.join(sorted(table))})") from None
                if kind == "reward" and rule.range is None:
                    raise ValueError(f"rollout_hooks.rewards: {name!r} needs its range: [lo, hi]")
        return self

    def function(self, kind: Kind, name: str) -> Callable[..., Any]:
        return self._python.get(name) or SHIPPED[kind][0][name]


def _merged(name: str, shipped: HookRule, given: HookRule) -> HookRule:
    unknown = set(given.args) - set(shipped.args)
    if unknown:
        raise ValueError(f"rollout_hooks: {name} takes no argument {', '.join(sorted(unknown))}")
    return HookRule(args={**shipped.args, **given.args}, range=given.range or shipped.range)


def _checked(hook: str, key: str, value: Any, rule: ArgRule) -> Any:
    where = f"{hook}: args.{key}"
    if rule.type == "boolean":
        if not isinstance(value, bool):
            raise HookError(f"{where} must be true or false")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise HookError(f"{where} must be a {rule.type}")
    if isinstance(value, int) and value.bit_length() > 64:  # JSON allows any size: no float, no str() of it
        raise HookError(f"{where} is out of range")
    if rule.type == "string":
        if len(str(value)) > rule.max_length:
            raise HookError(f"{where} is longer than {rule.max_length} characters")
        return value
    if isinstance(value, str) or not math.isfinite(value) or (rule.type == "integer" and value != int(value)):
        raise HookError(f"{where} must be a finite {rule.type}")
    if (rule.min is not None and value < rule.min) or (rule.max is not None and value > rule.max):
        raise HookError(f"{where} = {value} is outside [{rule.min}, {rule.max}]")
    return int(value) if rule.type == "integer" else value


def checked_args(hook: str, args: dict[str, Any], rule: HookRule) -> dict[str, Any]:
    """The request's arguments, each one declared and within its bounds. Raises HookError."""
    unknown = sorted(set(args) - set(rule.args))
    if unknown:
        raise HookError(f"{hook} takes no argument {', '.join(k[:64] for k in unknown[:5])} "
                        f"(allowed: {', '.join(sorted(rule.args)) or 'none'})")
    missing = [k for k, r in rule.args.items() if r.required and k not in args]
    if missing:
        raise HookError(f"{hook} needs args.{', args.'.join(missing)}")
    return {k: _checked(hook, k, v, rule.args[k]) for k, v in args.items()}


def resolve(spec: HookSpec, kind: Kind, hooks: RolloutHooks,
            budget: Budget | None = None) -> tuple[Hook, dict[str, Any]]:
    """The allowed hook a request names and its checked arguments. A name the operator did not list
    is refused here, before anything is imported. Raises HookError."""
    rules = hooks.verifiers if kind == "verifier" else hooks.rewards
    rule = rules.get(spec.name)
    if rule is None:
        raise HookError(f"{kind} {spec.name[:128]!r} is not allowed here (allowed: "
                        f"{', '.join(sorted(rules)) or 'none'}; the operator lists hooks in generate's rollout_hooks)")
    args = checked_args(spec.name, spec.args, rule)
    fn = hooks.function(kind, spec.name)
    rev = revision(spec.name, fn)
    if fn is regex:  # the caller's pattern: compiled once here (a bad one fails the request before sampling)
        fn = partial(regex, compiled=compile_pattern(args), budget=budget)
    return Hook(spec.name, rev, fn, rule.range), args


def scorer_for(verifier: HookSpec | None, reward: HookSpec | None, hooks: RolloutHooks | None = None) -> Scorer:
    """Resolve both hooks up front, so a hook or argument the policy refuses fails the request before
    any sampling. Without a policy: generate's defaults (the shipped hooks only)."""
    hooks = hooks or RolloutHooks()
    budget = Budget(hooks.regex_budget_ms / 1000, hooks.regex_call_ms / 1000)
    v = None if verifier is None else resolve(verifier, "verifier", hooks, budget)
    r = None if reward is None else resolve(reward, "reward", hooks)
    return Scorer(None if v is None else v[0], None if r is None else r[0], v[1] if v else {}, r[1] if r else {})
