"""The terminal answer to a caller: exactly one per request_id (duplicates are dropped by the client)."""

from __future__ import annotations

from enum import StrEnum
from typing import Final, Literal

from pydantic import Field

from pipeline.contracts.base import WireModel, now_ms
from pipeline.contracts.request import Choice, SampleSummary, ToolCall

RESPONSE_SCHEMA: Final = "response/v1"


class Status(StrEnum):
    ok = "ok"
    rejected = "rejected"
    error = "error"
    deadline_exceeded = "deadline_exceeded"
    cancelled = "cancelled"  # the caller withdrew it (a `cancel` record, or an HTTP caller that left)


class Usage(WireModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class StageTimes(WireModel):
    queue_ms: float
    service_ms: float


class ImageShape(WireModel):
    kind: str
    width: int
    height: int
    bytes: int
    decode_ms: float


class Response(WireModel):
    schema_: Literal["response/v1"] = Field(RESPONSE_SCHEMA, alias="schema")
    request_id: str
    tenant_id: str | None = None
    episode_id: str | None = None
    status: Status
    text: str | None = None
    tool_calls: list[ToolCall] | None = Field(None, description="the model's tool calls (finish_reason tool_calls)")
    choices: list[Choice] = Field(default_factory=list, description="n > 1: the answers after the first")
    finish_reason: str | None = Field(None, description="ok answers: stop | length | tool_calls (the model's), "
                                                        "stop for cache hits")
    error_class: str | None = Field(None, description="machine-readable class, e.g. schema_invalid")
    reason: str | None = Field(None, description="one human-readable line")
    retry_after_ms: int | None = Field(None, description="rejections: when trying again may succeed")
    answered_by: str = Field(description="stage that produced this answer")
    route: str | None = None
    model: str | None = None
    requested_model: str | None = Field(None, description="the model the caller asked for (`model` ran)")
    deployment: str | None = Field(None, description="the deployment that generated the answer")
    adapter: str | None = None
    experiment: str | None = Field(None, description="the experiment the request was assigned in, and its variant")
    variant: str | None = None
    placement: str | None = None
    cache: str | None = Field(None, description="hit | miss | bypass")
    domain: str | None = Field(None, description="the cache domain the request was looked up in")
    usage: Usage = Usage()
    prompt_token_ids: list[int] | None = Field(None, description="the prompt as the engine saw it, when logprobs "
                                                                 "were asked for (the warehouse's training record)")
    token_ids: list[int] | None = Field(None, description="generated token ids, when logprobs were asked for")
    logprobs: list[float] | None = Field(None, description="one logprob per generated token, when asked for")
    top_logprobs: list[list[tuple[str, float]]] | None = Field(
        None, description="per generated token, the top_logprobs most likely tokens as (text, logprob)")
    cost_usd: float = 0.0
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    created_ms: int | None = Field(None, description="request creation time (for E2E)")
    finished_ms: int = Field(default_factory=now_ms)
    timings: dict[str, StageTimes] = Field(default_factory=dict)
    replay_id: str = ""
    duplicate_of: str | None = Field(None, description="idempotency: the request whose result this is")
    images: list[ImageShape] = Field(default_factory=list, description="the request's images as media decoded them")
    actor_revision: str | None = Field(None, description="rollouts: the weights that produced the samples")
    samples_requested: int = Field(0, description="rollouts: the samples asked for (n), whether or not they came")
    samples: list[SampleSummary] = Field(default_factory=list, description="rollouts: every sample, scored "
                                                                             "(token ids and logprobs: `rollouts`)")

    @property
    def e2e_ms(self) -> float | None:
        return None if self.created_ms is None else float(self.finished_ms - self.created_ms)
