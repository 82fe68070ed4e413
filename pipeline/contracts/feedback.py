"""What a caller says about an answer (or a whole episode): `feedback/v1` on the `feedback` topic,
published by the front door (`POST /v1/feedback`) or by any producer that speaks Kafka.

The feedback worker verifies the giver (an API key, or the door's signed assertion), checks that
the target belongs to the giver's tenant, masks comment and demonstration text like a prompt, and
passes the record on, masked, to `feedback.accepted`, which the warehouse stores once per
feedback_id. A record it refuses goes to the DLQ with its original bytes and the reason.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Final, Literal

from pydantic import Field, StrictBool, model_validator

from pipeline.contracts.base import WireModel, now_ms
from pipeline.contracts.request import EPISODE_ID

FEEDBACK_SCHEMA: Final = "feedback/v1"
FEEDBACK_ID = r"^[A-Za-z0-9_.:-]{1,128}$"


class Feedback(WireModel):
    schema_: Literal["feedback/v1"] = Field(FEEDBACK_SCHEMA, alias="schema")
    feedback_id: str = Field(default_factory=lambda: uuid.uuid4().hex, pattern=FEEDBACK_ID,
                             description="idempotency: the same id twice is stored once")
    request_id: str | None = Field(None, pattern=FEEDBACK_ID, description="the answer this is about")
    episode_id: str | None = Field(None, pattern=EPISODE_ID, description="or the episode this is about")
    metric: str = Field(pattern=r"^[a-z][a-z0-9_]{0,63}$", description="a metric declared in config (feedback.metrics)")
    value: StrictBool | float | str = Field(description="boolean | float | comment or demonstration text")
    tenant_id: str | None = Field(None, description="set by the feedback worker from the verified giver; "
                                                    "a producer's own value is ignored")
    # how the giver proves who it is; both are stripped before the record goes on
    api_key: str | None = None
    caller_assertion: str | None = None
    masked: bool = Field(False, description="the text value has been through mask (set by the feedback worker)")
    created_ms: int = Field(default_factory=now_ms)

    @model_validator(mode="after")
    def _one_target(self) -> Feedback:
        if (self.request_id is None) == (self.episode_id is None):
            raise ValueError("give exactly one of request_id and episode_id")
        return self

    @property
    def target(self) -> tuple[Literal["request", "episode"], str]:
        return ("request", self.request_id) if self.request_id is not None else ("episode", self.episode_id or "")


@dataclass(frozen=True)
class Refusal:
    """Why feedback is not accepted: the class (also the DLQ's), the HTTP status the door answers."""

    error_class: str  # unknown_metric | invalid_feedback | forbidden | unknown_target | unauthenticated
    status: int
    reason: str
