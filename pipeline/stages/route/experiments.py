"""Experiments: weighted variants of a route, assigned deterministically and sticky per episode.

A variant overrides what the route would run (model, adapter, deployments, prompt revision). The
unit of assignment is the episode when the request carries one, else the request: every request of
an episode sees the same variant, and the same (experiment, unit) gets the same variant on every
worker and in every replay. A replay with other weights re-assigns by the same rule, so its diff
shows exactly which units would have moved.

The hash is SHA-256 of `experiment:salt:unit`, read as a fraction in [0, 1) and placed on the
cumulative weights: uniform over units, independent between experiments (the name is in the key),
and a re-weighting moves only the units whose fraction crosses a boundary.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field, model_validator

AssignmentReason = Literal["episode", "request"]
RouteT = TypeVar("RouteT", bound=BaseModel)


class Variant(BaseModel):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    weight: float = Field(gt=0)
    model: str | None = None
    adapter: str | None = None
    deployments: list[str] | None = None
    prompt_revision: str | None = Field(None, description="a system prompt revision the variant runs with")


class Experiment(BaseModel):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    route: str = Field(description="the route whose traffic is split")
    variants: list[Variant] = Field(min_length=2)
    salt: str = Field("", description="change it to draw a fresh assignment for the same units")
    enabled: bool = True

    @model_validator(mode="after")
    def _unique_variants(self) -> Experiment:
        names = [v.name for v in self.variants]
        if len(set(names)) != len(names):
            raise ValueError(f"experiment {self.name}: variant names repeat ({names})")
        return self


@dataclass(frozen=True)
class Assignment:
    experiment: str
    variant: Variant
    reason: AssignmentReason
    unit: str  # the episode or request id the hash was taken of
    fraction: float


def unit_fraction(experiment: Experiment, unit: str) -> float:
    """(experiment, salt, unit) -> a fraction in [0, 1), the same on every host and run."""
    digest = hashlib.sha256(f"{experiment.name}:{experiment.salt}:{unit}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def assign(experiment: Experiment, episode_id: str | None, request_id: str) -> Assignment:
    """The variant for this episode (sticky), or for this request when it has no episode."""
    unit, reason = (episode_id, "episode") if episode_id else (request_id, "request")
    f = unit_fraction(experiment, unit)
    total = sum(v.weight for v in experiment.variants)
    edge = 0.0
    for v in experiment.variants:
        edge += v.weight / total
        if f < edge:
            return Assignment(experiment.name, v, reason, unit, f)
    return Assignment(experiment.name, experiment.variants[-1], reason, unit, f)  # rounding at the top edge


def experiment_for(experiments: list[Experiment], route: str) -> Experiment | None:
    """The enabled experiment on `route` (config validation keeps it to one per route)."""
    return next((e for e in experiments if e.enabled and e.route == route), None)


def with_variant(route: RouteT, v: Variant) -> RouteT:
    """The route as the variant runs it: what the variant sets replaces the route's own."""
    update = {k: getattr(v, k) for k in ("model", "adapter", "deployments") if getattr(v, k) is not None}
    return route.model_copy(update=update)


def experiment_fields(a: Assignment, prompts: dict[str, str]) -> dict[str, Any]:
    """What the route section records of an assignment (and the system prompt the variant runs with)."""
    v = a.variant
    return {"experiment": a.experiment, "variant": v.name, "assignment": a.reason,
            "prompt_revision": v.prompt_revision,
            "system_prompt": prompts[v.prompt_revision] if v.prompt_revision is not None else None}
