"""One RL sample with the provenance a trainer needs to trust it (written by generate)."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import Field

from pipeline.contracts.base import WireModel, now_ms

ROLLOUT_SCHEMA: Final = "rollout/v1"


class Rollout(WireModel):
    schema_: Literal["rollout/v1"] = Field(ROLLOUT_SCHEMA, alias="schema")
    sample_id: str
    group_id: str
    request_id: str
    tenant_id: str = ""
    episode_id: str = ""
    prompt_dataset_revision: str = ""
    actor_revision: str
    reward_revision: str = ""
    verifier_revision: str = ""
    reference_revision: str = ""
    tokenizer_revision: str = ""
    chat_template_revision: str = ""
    temperature: float
    top_p: float
    max_tokens: int
    seed: int | None = None
    runtime: str = ""
    hardware: str = ""
    batch_context: str = ""
    prompt_token_ids: list[int]
    generated_token_ids: list[int]
    logprobs: list[float] = Field(description="one per generated token")
    finish_reason: str
    score: float | None = None
    created_ms: int = Field(default_factory=now_ms)
    replay_id: str = ""


CONSUMPTION_SCHEMA: Final = "rollout_consumption/v1"


class RolloutConsumption(WireModel):
    """One batch a trainer acknowledged (pipeline.training.stream.RolloutStream): how old its samples were
    when consumed, how long the trainer waited for it and worked on it, and how stale it was."""

    schema_: Literal["rollout_consumption/v1"] = Field(CONSUMPTION_SCHEMA, alias="schema")
    batch_id: str
    trainer: str
    groups: int
    samples: int
    idle_ms: float = Field(description="the trainer waiting for this batch (no samples to train on)")
    busy_ms: float = Field(description="from the batch handed over to its acknowledgement")
    queue_age_ms: list[float] = Field(description="per sample: created -> consumed")
    samples_by_revision: dict[str, int] = Field(default_factory=dict, description="actor revision -> samples")
    stale_by_revision: dict[str, int] = Field(default_factory=dict, description="actor revision -> activations "
                                                                                "behind the active one")
    dropped_by_revision: dict[str, int] = Field(default_factory=dict, description="stale samples dropped since "
                                                                                  "the last batch, by revision")
    flagged: int = Field(0, description="stale samples yielded and flagged (stale='flag')")
    incomplete: int = Field(0, description="groups dropped so far because their samples never all arrived")
    active_revision: str = ""
    acked_ms: int = Field(default_factory=now_ms)
