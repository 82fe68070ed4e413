"""Deployments and the decisions around calling them, as pure functions: which deployments can
serve a request, whether a failed attempt may be retried within the deadline budget, and the
per-deployment circuit breaker. No engine and no Kafka here: generate drives these.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, replace
from typing import Literal

from pipeline.config.settings import Deployment
from pipeline.stages.generate.config import BreakerPolicy, RetryPolicy

__all__ = ["Deployment"]  # configured in settings; re-exported for the policy's callers

# ---- deployments and compatibility -------------------------------------------------------------


@dataclass(frozen=True)
class Needs:
    """What a request requires of whoever serves it."""

    context_tokens: int
    images: bool = False
    json_schema: bool = False
    tools: bool = False
    adapter_of: str | None = None  # a LoRA adapter of this base model must be applied
    regions: frozenset[str] | None = None  # data residency: None = anywhere
    max_cost_usd: float | None = None
    expected_output_tokens: int = 256


def estimated_cost(d: Deployment, needs: Needs) -> float:
    return (needs.context_tokens * d.cost_per_1k_input + needs.expected_output_tokens * d.cost_per_1k_output) / 1000


def incompatibility(d: Deployment, needs: Needs) -> str | None:
    """Why `d` cannot serve the request (None: it can). Refusals carry their reason into evidence."""
    if needs.context_tokens + needs.expected_output_tokens > d.max_context:
        return f"context {needs.context_tokens}+{needs.expected_output_tokens} > {d.max_context}"
    if needs.images and not d.images:
        return "no image support"
    if needs.json_schema and not d.json_schema:
        return "no JSON-schema output"
    if needs.tools and not d.serves_tools:
        return "no tool calling"
    if needs.adapter_of is not None and not (d.lora and d.model == needs.adapter_of):
        return f"serves no LoRA adapters of {needs.adapter_of}"
    if needs.regions is not None and d.region not in needs.regions:
        return f"region {d.region} outside {sorted(needs.regions)}"
    if needs.max_cost_usd is not None and estimated_cost(d, needs) > needs.max_cost_usd:
        return f"estimated cost {estimated_cost(d, needs):.6f} > cap {needs.max_cost_usd}"
    return None


def candidates(deployments: list[Deployment], preferred: list[str], needs: Needs,
               only_preferred: bool = False) -> tuple[list[Deployment], dict[str, str]]:
    """Deployments in preference order that can serve the request, and the refused ones with reasons.
    The rest of the configured deployments follow the preferred ones unless `only_preferred` (route
    and admit named where the request may run: another model, or a limit admit did not count, is no
    fallback)."""
    by_name = {d.name: d for d in deployments}
    ok, refused = [], {}
    rest = [] if only_preferred else [d.name for d in deployments if d.name not in preferred]
    for name in preferred + rest:
        d = by_name.get(name)
        if d is None:
            refused[name] = "unknown deployment"
            continue
        why = incompatibility(d, needs)
        if why is None:
            ok.append(d)
        else:
            refused[name] = why
    return ok, refused


# ---- errors and the retry budget ---------------------------------------------------------------

RETRYABLE = {"connection_refused", "connection_reset", "timeout", "overloaded", "engine_dead", "server_error"}
# failed before the upstream could act on the request: a side-effecting one may be tried again
NOT_REACHED = {"connection_refused", "overloaded"}
NON_RETRYABLE = {"context_too_long", "invalid_request", "content_policy", "unauthorized", "adapter_unavailable",
                 "tool_call_invalid"}



@dataclass(frozen=True)
class NextStep:
    action: Literal["retry", "fallback", "give_up"]
    wait_ms: int
    reason: str


def backoff_ms(request_id: str, attempt: int, p: RetryPolicy) -> int:
    """Exponential with full jitter, seeded by (request_id, attempt): replays wait the same."""
    seed = int.from_bytes(hashlib.sha256(f"{request_id}:{attempt}".encode()).digest()[:8], "big")
    cap = min(p.backoff_max_ms, p.backoff_base_ms * 2 ** max(0, attempt - 1))
    return random.Random(seed).randint(cap // 2, cap)


def next_step(error_class: str, *, request_id: str, attempt: int, remaining_ms: int, has_fallback: bool,
              side_effects: bool, idempotency_key: str | None, p: RetryPolicy) -> NextStep:
    """After attempt `attempt` (1-based) failed with `error_class`, with `remaining_ms` to the deadline."""
    if side_effects and not idempotency_key and error_class not in NOT_REACHED:
        return NextStep("give_up", 0, f"{error_class}: the upstream may have acted on this side-effecting request, "
                                      "which is never repeated without an idempotency key")
    if error_class not in RETRYABLE:
        return NextStep("give_up", 0, f"{error_class} is not retryable")
    if attempt >= p.max_attempts:
        return NextStep("give_up", 0, f"attempt budget ({p.max_attempts}) spent")
    wait = backoff_ms(request_id, attempt, p)
    need = wait + p.attempt_timeout_ms + (p.fallback_reserve_ms if has_fallback else 0)
    if has_fallback and remaining_ms >= p.attempt_timeout_ms:
        # another deployment now beats waiting for this one to recover
        return NextStep("fallback", 0, f"{error_class}: falling back")
    if remaining_ms < need:
        return NextStep("give_up", 0, f"remaining {remaining_ms} ms cannot fit a retry ({need} ms)")
    return NextStep("retry", wait, f"{error_class}: retry after {wait} ms")


# ---- circuit breaker ---------------------------------------------------------------------------



@dataclass(frozen=True)
class Breaker:
    state: Literal["closed", "open", "half_open"] = "closed"
    failures: tuple[int, ...] = ()  # failure times within the window
    opened_ms: int = 0
    probing: bool = False  # half-open: one probe in flight


def breaker_allows(b: Breaker, now_ms: int, p: BreakerPolicy) -> tuple[bool, Breaker]:
    """May an attempt go to this deployment now? (An open breaker turns half-open after the cooldown,
    and lets exactly one probe through.)"""
    if b.state == "open" and now_ms - b.opened_ms >= p.cooldown_ms:
        b = replace(b, state="half_open", probing=False)
    if b.state == "closed":
        return True, b
    if b.state == "half_open" and not b.probing:
        return True, replace(b, probing=True)
    return False, b


def breaker_record(b: Breaker, ok: bool, now_ms: int, p: BreakerPolicy) -> Breaker:
    if ok:
        return Breaker()  # any success closes it and forgets old failures
    if b.state == "half_open":
        return Breaker(state="open", opened_ms=now_ms)
    failures = tuple(t for t in b.failures if now_ms - t < p.window_ms) + (now_ms,)
    if len(failures) >= p.failures_to_open:
        return Breaker(state="open", failures=(), opened_ms=now_ms)
    return replace(b, failures=failures)
