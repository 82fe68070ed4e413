"""One RL sample with the provenance a trainer needs to trust it (written by generate)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pipeline.contracts.base import WireModel, now_ms

ROLLOUT_SCHEMA = "rollout/v1"


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
