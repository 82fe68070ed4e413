"""A weight lifecycle transition on one replica: a LoRA adapter's residency (cold/warm/hot) or an
actor revision's rollout (prepared → … → active). One row of `weight_events` each."""

from __future__ import annotations

import uuid
from typing import Final, Literal

from pydantic import Field

from pipeline.contracts.base import WireModel, now_ms

WEIGHT_EVENT_SCHEMA: Final = "weight_event/v1"


class WeightEvent(WireModel):
    schema_: Literal["weight_event/v1"] = Field(WEIGHT_EVENT_SCHEMA, alias="schema")
    event_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    replica: str = Field(description="the generate worker (and engine) whose state changed")
    kind: Literal["adapter", "actor"]
    name: str
    revision: str
    transition: str = Field(description="'cold->warm', 'warm->hot', 'hot->warm', ... or an actor state")
    detail: str = ""
    duration_ms: float | None = Field(None, description="what the transition took (a load), when it took time")
    request_id: str = Field("", description="the request that caused it, if one did")
    at_ms: int = Field(default_factory=now_ms)
