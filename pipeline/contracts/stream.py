"""Records of a streamed answer: the pieces generate sends while the engine works (`deltas`), and a
caller's withdrawal of a request (`cancel`).

A delta is a preview, never the answer: the terminal `response/v1` on the reply partition stays
the one authoritative record (full text, usage, finish reason). Deltas carry the attempt that made
them, so a caller follows one attempt and never shows text from two (ingress/stream_follow.py).
"""

from __future__ import annotations

from typing import Final, Literal

from pydantic import Field

from pipeline.contracts.base import WireModel, now_ms

DELTA_SCHEMA: Final = "delta/v1"
CANCEL_SCHEMA: Final = "cancel/v1"


class Delta(WireModel):
    schema_: Literal["delta/v1"] = Field(DELTA_SCHEMA, alias="schema")
    request_id: str
    tenant_id: str | None = Field(None, description="the request's (verified) tenant: a caller takes deltas of the "
                                                    "request it sent, never another tenant's that reused its id")
    attempt: str = Field(description="the engine attempt that made it (unique across workers and retries)")
    seq: int = Field(ge=0, description="0, 1, 2 ... within the attempt")
    text: str = Field(description="the next piece of the answer, un-masked where the tenant allows")
    token_ids: list[int] = Field(default_factory=list, description="the tokens behind this piece")
    logprobs: list[float] | None = Field(None, description="one per token, when the request asked for logprobs")
    last: bool = Field(False, description="the attempt's engine work is over (the terminal answer follows)")
    sealed: str | None = Field(None, description="text, token_ids and logprobs sealed under the request's delta "
                                                 "key (security/sealing.py); those fields are then empty")
    at_ms: int = Field(default_factory=now_ms)


class Cancel(WireModel):
    """Stop this request: the worker generating it aborts the engine; a stage it has not reached yet
    answers it `cancelled` instead of processing it. Applied only when `secret` opens the request's
    `cancel_digest`."""

    schema_: Literal["cancel/v1"] = Field(CANCEL_SCHEMA, alias="schema")
    request_id: str = Field(min_length=1, max_length=128)
    # a word, never free text: it lands in evidence (e.g. caller, disconnected, timeout, operator)
    reason: str = Field("caller", pattern=r"^[a-z_]{1,32}$")
    # Only the request's sender can withdraw it: ids are visible on shared topics (issue 35, finding 7)
    secret: str | None = Field(None, max_length=128,
                               description="the request's cancel secret, whose SHA-256 is its `cancel_digest`; "
                                           "without it the cancel is ignored")
    at_ms: int = Field(default_factory=now_ms)
