"""The admit stage's policy model (parse-only): what a request without max_tokens reserves, how
long holds and duplicate waiters live, and how long settled request ids are remembered. The limits
themselves are each tenant's (config/tenants.py); the decisions are policy.py's."""

from __future__ import annotations

from pydantic import Field

from pipeline.config.policy import PolicyModel


class AdmitPolicy(PolicyModel):
    version: str = "admit-v2"
    assumed_max_tokens: int = Field(128, ge=1, description="reserved when a request does not set max_tokens")
    hold_grace_ms: int = Field(60_000, ge=0, description="a hold outlives its deadline by this, then settles at cost")
    hold_without_deadline_ms: int = Field(900_000, ge=1000)
    max_duplicate_waiters: int = Field(64, ge=0, description="duplicates of one idempotency key parked for its result")
    restore_timeout_s: float = Field(120.0, gt=0)
    remember_settled_ms: int = Field(600_000, ge=0, description="how long a finished request id is remembered, so "
                                                                "a copy redelivered after a crash is not run again")
    remember_request_ids_ms: int = Field(900_000, ge=0, description="how long a request id stays taken (another "
                                         "record with it is a replay): longer than mask's assertion_max_age_s")
