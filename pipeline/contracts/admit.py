"""Records on `admit.release` (keyed by tenant): a request has finished, so admit can settle its
budget reservation with the real cost and free its concurrency slot."""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import Field, RootModel

from pipeline.contracts.base import WireModel, now_ms
from pipeline.contracts.request import RequestDoc
from pipeline.contracts.response import Response

ADMIT_RELEASE_SCHEMA: Final = "admit_release/v1"


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
    response: Response | None = Field(None, description="the whole answer, for requests with an idempotency key: "
                                                        "admit gives it to their duplicates")


def release_for(resp: Response, *, with_response: bool = False) -> AdmitRelease:
    return AdmitRelease(request_id=resp.request_id, tenant_id=resp.tenant_id or "", status=resp.status.value,
                        deployment=resp.deployment, tokens_in=resp.usage.prompt_tokens,
                        tokens_out=resp.usage.completion_tokens, cost_usd=resp.cost_usd,
                        answered_by=resp.answered_by, finished_ms=resp.finished_ms,
                        response=resp if with_response else None)


# ---- `admit.state`: admit's changelog ---------------------------------------------------------
# One partition per admit input partition (records are produced to the tenant's partition), keyed
# so that the latest record per key is the state: compaction keeps it bounded on Kafka; compaction
# keeps the survivors' order, and restore applies them in offset order.

ADMIT_STATE_SCHEMA: Final = "admit_state/v1"
Buckets = list[tuple[int, int, int]]  # (second, requests, tokens) of a rolling-minute window


class TenantTotals(WireModel):
    """A tenant's spend and windows (its own and per deployment), carried by its latest hold record."""

    day: str = ""
    spent_day_usd: float = 0.0
    month: str = ""
    spent_month_usd: float = 0.0
    window: Buckets = Field(default_factory=list)
    lanes: dict[str, Buckets] = Field(default_factory=dict)


class ShareWindow(WireModel):
    """This partition's use of its share of a deployment's global limits."""

    deployment: str
    window: Buckets = Field(default_factory=list)


class HoldRecord(WireModel):
    """key `h/<tenant>/<request_id>/<attempt>`: an admitted request not finished yet; once answered
    (settled, or rejected here), the fact that it was, until `expires_ms` (a copy redelivered after a
    crash is not decided again); then a tombstone. A record that changed the tenant's totals (or a
    deployment share) carries them: on restore, in offset order, the latest wins. One record per
    decision, not three: each output costs a produce round trip (bench/admit_bench.py)."""

    schema_: Literal["admit_state/v1"] = Field(ADMIT_STATE_SCHEMA, alias="schema")
    kind: Literal["hold"] = "hold"
    tenant: str
    request_id: str
    at_ms: int
    tokens: int
    cost_usd: float
    expires_ms: int
    deployment: str | None = None
    attempt: int = 0
    settled: bool = False
    origin: str | None = Field(None, description="the `requests` record that took this request id (admit's replay check)")
    totals: TenantTotals | None = None
    share: ShareWindow | None = None


class IdempotencyRecord(WireModel):
    """key `i/<tenant>/<key digest>`: the request that owns an idempotency key, its result once
    known, and the duplicates parked until then (answered with that result)."""

    schema_: Literal["admit_state/v1"] = Field(ADMIT_STATE_SCHEMA, alias="schema")
    kind: Literal["idempotency"] = "idempotency"
    tenant: str
    key_digest: str
    request_id: str
    state: Literal["in_progress", "done"]
    at_ms: int
    expires_ms: int
    response: Response | None = Field(None, description="in memory only: on the topic it is `response_sealed`")
    response_sealed: str | None = Field(None, description="the result (an un-masked answer), AES-GCM sealed with "
                                                          "the mask keyring to this claim")
    waiters: list[RequestDoc] = Field(default_factory=list)


class StateMarker(WireModel):
    """Written by a restoring worker to learn it has read a partition to its end."""

    schema_: Literal["admit_state/v1"] = Field(ADMIT_STATE_SCHEMA, alias="schema")
    kind: Literal["marker"] = "marker"
    marker_id: str


class AdmitStateRecord(RootModel[Annotated[HoldRecord | IdempotencyRecord | StateMarker,
                                           Field(discriminator="kind")]]):
    pass
