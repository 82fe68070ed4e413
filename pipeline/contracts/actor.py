"""The RL actor's weight lifecycle on `control`: a revision is prepared (its verified LoRA weights
and validation prompts), every generate replica reports transferred → loaded → validated (or
rejected), activation is published only once every replica validated (the barrier), the previous
active revision drains and retires, and a rollback rejects a revision and re-activates the one before.
The actor's weights are a LoRA adapter on the served base model (docs/decisions/0012-rl-rollouts-and-actor-revisions.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from pipeline.contracts.adapter import AdapterSpec
from pipeline.contracts.base import WireModel, now_ms

ACTOR_ADAPTER = "actor"  # the LoRA name the actor's weights are served under
ReplicaState = Literal["transferred", "loaded", "validated", "rejected", "active", "draining", "retired"]


class ValidationPrompt(WireModel):
    prompt: str = Field(min_length=1)
    expected: str = Field(description="the greedy answer these weights must give")
    match: Literal["exact", "prefix", "regex"] = "exact"


class ActorSpec(WireModel):
    revision: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    base_model: str = "smollm2-135m-instruct"
    path: Path
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    rank: int = Field(ge=1)
    validation: list[ValidationPrompt] = Field(default_factory=list)

    def adapter(self) -> AdapterSpec:
        return AdapterSpec(name=ACTOR_ADAPTER, base_model=self.base_model, revision=self.revision, path=self.path,
                           sha256=self.sha256, rank=self.rank, tenants=["*"])


class ActorPrepared(WireModel):
    schema_: Literal["control/v1"] = Field("control/v1", alias="schema")
    kind: Literal["actor_prepared"] = "actor_prepared"
    spec: ActorSpec
    at_ms: int = Field(default_factory=now_ms)


class ActorReplicaReport(WireModel):
    """One replica's state for one revision (also a `weight_events` row)."""

    schema_: Literal["control/v1"] = Field("control/v1", alias="schema")
    kind: Literal["actor_replica"] = "actor_replica"
    revision: str
    replica: str
    state: ReplicaState
    detail: str = ""
    at_ms: int = Field(default_factory=now_ms)


class ActorActivated(WireModel):
    """Published by `llmpipe actor activate` after the barrier (or by rollback). revision None: no actor
    (rollouts sample the base model)."""

    schema_: Literal["control/v1"] = Field("control/v1", alias="schema")
    kind: Literal["actor_activated"] = "actor_activated"
    revision: str | None
    previous: str | None = None
    reason: str = ""
    at_ms: int = Field(default_factory=now_ms)


class ActorRejected(WireModel):
    """A revision that must never serve again; its samples are marked rejected in `training_samples`."""

    schema_: Literal["control/v1"] = Field("control/v1", alias="schema")
    kind: Literal["actor_rejected"] = "actor_rejected"
    revision: str
    reason: str = ""
    at_ms: int = Field(default_factory=now_ms)
