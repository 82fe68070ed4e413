"""Records on `admit.release` (keyed by tenant): a request has finished, so admit can settle its
budget reservation with the real cost and free its concurrency slot."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pipeline.contracts.base import WireModel, now_ms
from pipeline.contracts.response import Response

ADMIT_RELEASE_SCHEMA = "admit_release/v1"


class AdmitRelease(WireModel):
    schema_: Literal["admit_release/v1"] = Field(ADMIT_RELEASE_SCHEMA, alias="schema")
    request_id: str
    tenant_id: str
    status: str = Field(description="the terminal status: ok | rejected | error | deadline_exceeded")
    deployment: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    answered_by: str
    finished_ms: int = Field(default_factory=now_ms)


def release_for(resp: Response) -> AdmitRelease:
    return AdmitRelease(request_id=resp.request_id, tenant_id=resp.tenant_id or "", status=resp.status.value,
                        deployment=resp.deployment, tokens_in=resp.usage.prompt_tokens,
                        tokens_out=resp.usage.completion_tokens, cost_usd=resp.cost_usd,
                        answered_by=resp.answered_by, finished_ms=resp.finished_ms)
