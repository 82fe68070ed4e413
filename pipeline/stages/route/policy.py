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
from pydantic import BaseModel, Field, model_validator

from pipeline.stages.route.experiments import Experiment

Placement = Literal["local", "cloud", "degraded"]
PlacementReason = Literal["privacy", "deadline", "network", "thermal", "quality"]


class Route(BaseModel):
    model: str
    adapter: str | None = None
    deployments: list[str] = Field(default_factory=list)
    fallbacks: list[str] = Field(default_factory=list, description="other routes, in order")
    exemplars: list[str] = Field(default_factory=list)
    keywords: list[str] = Field(default_factory=list)
    complexity: tuple[float, float] = Field((0.0, 1.0), description="the complexity band this route serves")


# The embedded stack has one deployment, so every route runs on it; at scale, point `reasoning` at a
# large model's deployments (the report shows requested vs executed model).
def _default_routes() -> dict[str, Route]:
    return {
        "simple": Route(model="small", deployments=["local-vllm"], fallbacks=["reasoning"],
                        exemplars=["What are your opening hours?", "Say hello", "Translate 'thank you' to Korean",
                                   "영업시간 알려줘", "고마워요"],
                        complexity=(0.0, 0.35)),
        "support": Route(model="small", adapter="support-lora", deployments=["local-vllm"],
                         fallbacks=["simple", "reasoning"],
                         exemplars=["How do I reset my password?", "I want a refund for my order",
                                    "My package has not arrived", "비밀번호를 잊어버렸어요", "환불 받고 싶어요"],
                         keywords=["refund", "order", "password", "account", "delivery", "환불", "주문", "배송", "계정"],
                         complexity=(0.0, 0.7)),
        "reasoning": Route(model="large", deployments=["local-vllm"], fallbacks=["support", "simple"],
                           exemplars=["Explain step by step why the proof works",
                                      "Compare these two architectures and recommend one with trade-offs",
                                      "Write a detailed plan to migrate our database",
                                      "단계별로 이유를 설명해 주세요"],
                           keywords=["why", "explain", "compare", "analyze", "analyse", "step by step", "plan",
                                     "prove", "설명", "비교", "분석"],
                           complexity=(0.45, 1.0)),
    }


class PlacementPolicy(BaseModel):
    thermal_high_c: float = 42.0
    thermal_low_c: float = 38.0
    rtt_high_ms: float = 400.0
    rtt_low_ms: float = 200.0
    battery_low_pct: float = 15.0
    battery_ok_pct: float = 25.0
    min_hold_ms: int = 30_000
    # below this much time to the deadline a cloud round trip cannot make it
    cloud_min_budget_ms: int = 1_500


class RoutePolicy(BaseModel):
    version: str = "route-v1"
    routes: dict[str, Route] = Field(default_factory=_default_routes)
    default_route: str = "simple"
    weight_embedding: float = 0.6
    weight_keyword: float = 0.25
    weight_complexity: float = 0.15
    min_score: float = 0.25
    placement: PlacementPolicy = PlacementPolicy()
    experiments: list[Experiment] = Field(default_factory=list, description="weighted variants of routes")
    prompts: dict[str, str] = Field(default_factory=dict, description="prompt revision -> the system prompt a "
                                                                      "variant runs with")

    @model_validator(mode="after")
    def _experiments_fit(self) -> "RoutePolicy":
        on_route: dict[str, str] = {}
        for e in self.experiments:
            if e.route not in self.routes:
                raise ValueError(f"experiment {e.name}: no route {e.route!r} (routes: {sorted(self.routes)})")
            if e.enabled and e.route in on_route:
                raise ValueError(f"experiments {on_route[e.route]} and {e.name} both split route {e.route!r}")
            if e.enabled:
                on_route[e.route] = e.name
            for v in e.variants:
                if v.prompt_revision is not None and v.prompt_revision not in self.prompts:
                    raise ValueError(f"experiment {e.name}, variant {v.name}: prompt revision "
                                     f"{v.prompt_revision!r} is not among the policy's prompts")
        return self


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
