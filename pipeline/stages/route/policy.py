"""Routing and placement as pure functions: score routes, pick one with its fallbacks, and place
the request (local | cloud | degraded) from device state with hysteresis.

Scores: per route, weight_embedding * (best cosine to its exemplars) + weight_keyword * (keyword
hits, capped) + weight_complexity * (how well the prompt's complexity fits the route's band).
Ties break by route order in the policy, so the same input and policy always give the same route.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from pipeline.stages.route.config import (
    PlacementPolicy,
    RoutePolicy,
)

Placement = Literal["local", "cloud", "degraded"]
PlacementReason = Literal["privacy", "deadline", "network", "thermal", "quality"]



_WORD = re.compile(r"\w+", re.UNICODE)


def complexity(text: str) -> float:
    """0..1 from length, sentences and reasoning cues: a cheap, deterministic signal."""
    words = _WORD.findall(text)
    sentences = max(1, len(re.findall(r"[.!?。]|다\.|요\?", text)))
    cues = len(re.findall(r"\b(why|how|explain|compare|step|trade-?offs?|because|prove|design)\b|설명|비교|분석|이유",
                          text.lower()))
    score = min(1.0, len(words) / 80) * 0.5 + min(1.0, sentences / 6) * 0.2 + min(1.0, cues / 3) * 0.3
    return round(score, 4)


def _band_fit(c: float, band: tuple[float, float]) -> float:
    lo, hi = band
    if lo <= c <= hi:
        return 1.0
    gap = lo - c if c < lo else c - hi
    return max(0.0, 1.0 - 4 * gap)


def score_routes(text: str, text_vec: np.ndarray, exemplar_vecs: dict[str, np.ndarray],
                 policy: RoutePolicy) -> dict[str, float]:
    lowered = text.lower()
    c = complexity(text)
    scores = {}
    for name, route in policy.routes.items():
        ex = exemplar_vecs.get(name)
        emb = float(np.max(ex @ text_vec)) if ex is not None and len(ex) else 0.0
        kw = min(1.0, sum(1 for k in route.keywords if k in lowered) / 2)
        scores[name] = round(policy.weight_embedding * max(0.0, emb) + policy.weight_keyword * kw
                             + policy.weight_complexity * _band_fit(c, route.complexity), 4)
    return scores


def choose_route(scores: dict[str, float], policy: RoutePolicy) -> tuple[str, str]:
    """Highest score (policy order breaks ties); the default route when nothing is convincing."""
    order = list(policy.routes)
    best = max(order, key=lambda r: (scores.get(r, 0.0), -order.index(r)))
    if scores.get(best, 0.0) < policy.min_score:
        return policy.default_route, f"no route above min_score {policy.min_score}"
    runner_up = max((scores[r] for r in order if r != best), default=0.0)
    return best, f"best score {scores[best]:.3f} (margin {scores[best] - runner_up:.3f})"


# ---- placement with hysteresis --------------------------------------------------------------


@dataclass(frozen=True)
class Flag:
    on: bool = False
    since_ms: int = 0


@dataclass(frozen=True)
class DeviceFlags:
    """Per-device conditions with hysteresis; owned by the worker that owns the device's key."""

    hot: Flag = Flag()
    slow_network: Flag = Flag()
    low_battery: Flag = Flag()


def _hysteresis(flag: Flag, value: float | None, high: float, low: float, hold_ms: int, now_ms: int,
                inverted: bool = False) -> Flag:
    """Enter above `high`; leave only below `low` and after `hold_ms` in the state.
    inverted: enter below `high`, leave above `low` (battery)."""
    if value is None:
        return flag
    above_high = value <= high if inverted else value >= high
    below_low = value >= low if inverted else value <= low
    if not flag.on and above_high:
        return Flag(True, now_ms)
    if flag.on and below_low and now_ms - flag.since_ms >= hold_ms:
        return Flag(False, now_ms)
    return flag


def update_flags(flags: DeviceFlags, device, now_ms: int, p: PlacementPolicy) -> DeviceFlags:
    if device is None:
        return flags
    return replace(
        flags,
        hot=_hysteresis(flags.hot, device.temperature_c, p.thermal_high_c, p.thermal_low_c, p.min_hold_ms, now_ms),
        slow_network=_hysteresis(flags.slow_network, device.network_rtt_ms, p.rtt_high_ms, p.rtt_low_ms,
                                 p.min_hold_ms, now_ms),
        low_battery=_hysteresis(flags.low_battery, device.battery_pct, p.battery_low_pct, p.battery_ok_pct,
                                p.min_hold_ms, now_ms, inverted=True),
    )


def place(flags: DeviceFlags, device, deadline_ms: int | None, now_ms: int,
          p: PlacementPolicy) -> tuple[Placement, PlacementReason]:
    """Cloud for quality unless privacy, network or the deadline keep the request on the device;
    a device too hot or too drained to run locally serves a degraded (smaller, shorter) answer."""
    strained = flags.hot.on or flags.low_battery.on
    local_or_degraded: Placement = "degraded" if strained else "local"
    if device is not None and device.privacy_local_only:
        return local_or_degraded, "privacy"
    if flags.slow_network.on:
        return local_or_degraded, "network"
    if device is not None and deadline_ms is not None and deadline_ms - now_ms < p.cloud_min_budget_ms:
        return local_or_degraded, "deadline"
    if flags.hot.on:
        return "cloud", "thermal"
    return "cloud", "quality"
