"""One stage decision, as written to the `decisions` table. Built from masked text only."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import Field

from pipeline.contracts.base import WireModel

EVIDENCE_SCHEMA: Final = "evidence/v1"


class Evidence(WireModel):
    schema_: Literal["evidence/v1"] = Field(EVIDENCE_SCHEMA, alias="schema")
    request_id: str
    tenant_id: str = ""
    episode_id: str = ""
    stage: str
    decision: str
    reason: str = ""
    policy_version: str = ""
    revisions: dict[str, str] = Field(default_factory=dict, description="component -> revision")
    scores: dict[str, float] = Field(default_factory=dict)
    candidates: list[str] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict, description="categorical facts to group by "
                                                                     "(cache: domain, mode); never PII")
    attempt: int = 0
    step: int = Field(0, ge=0, description="numbers several decisions of one stage for one request attempt "
                                           "(generate: 1, 2, ... per engine attempt; 0 = the final decision)")
    # stamped by the runtime, not by the stage
    worker: str = ""
    partition: int = -1
    offset: int = -1
    enqueued_ms: int = 0
    started_ms: int = 0
    finished_ms: int = 0
    queue_ms: float = 0.0
    service_ms: float = 0.0
    replay_id: str = ""
    shadow: bool = False
