"""Records on the `control` topic: cache write-backs and invalidations, circuit-breaker states, the tenant
registry (tenants, limits, hashed API keys), the adapter registry, the RL actor's weight lifecycle.
Every cache worker follows the whole topic, so each keeps a complete index replica and applies
invalidations in order; generate workers follow it for breaker states."""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import Field, RootModel

from pipeline.contracts.actor import ActorActivated, ActorPrepared, ActorRejected, ActorReplicaReport
from pipeline.contracts.adapter import AdapterSpec, AdapterState
from pipeline.contracts.base import WireModel, now_ms

CONTROL_SCHEMA: Final = "control/v1"


class CachePut(WireModel):
    schema_: Literal["control/v1"] = Field(CONTROL_SCHEMA, alias="schema")
    kind: Literal["cache_put"] = "cache_put"
    entry_id: str
    vector: list[float]
    payload: dict[str, str | int | float | bool]
    at_ms: int = Field(default_factory=now_ms)


class CacheInvalidate(WireModel):
    schema_: Literal["control/v1"] = Field(CONTROL_SCHEMA, alias="schema")
    kind: Literal["cache_invalidate"] = "cache_invalidate"
    tenant: str = Field(min_length=1)
    model_revision: str | None = None
    prompt_revision: str | None = None
    data_version: str | None = None
    before_ms: int = Field(default_factory=now_ms, description="entries created before this are invalid")
    at_ms: int = Field(default_factory=now_ms)


class BreakerUpdate(WireModel):
    """A generate worker's circuit breaker for a deployment changed state; every generate worker
    follows `control` and adopts it, so one worker's discovery spares the others the failures."""

    schema_: Literal["control/v1"] = Field(CONTROL_SCHEMA, alias="schema")
    kind: Literal["breaker"] = "breaker"
    deployment: str
    state: Literal["closed", "open", "half_open"]
    opened_ms: int = 0
    worker: str = ""
    reason: str = ""
    at_ms: int = Field(default_factory=now_ms)


class TenantUpsert(WireModel):
    """Create a tenant or change some of its limits (fields absent from `limits` keep their value)."""

    schema_: Literal["control/v1"] = Field(CONTROL_SCHEMA, alias="schema")
    kind: Literal["tenant_upsert"] = "tenant_upsert"
    tenant: str = Field(min_length=1, max_length=64)
    limits: dict[str, Any] = Field(default_factory=dict, description="TenantLimits fields to change")
    at_ms: int = Field(default_factory=now_ms)


class ApiKeyIssued(WireModel):
    """A new key for a tenant. Only its SHA-256 travels; the key itself is shown once to the operator."""

    schema_: Literal["control/v1"] = Field(CONTROL_SCHEMA, alias="schema")
    kind: Literal["api_key_issued"] = "api_key_issued"
    tenant: str = Field(min_length=1, max_length=64)
    key_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    principal: str = "default"
    roles: list[str] = Field(default_factory=list)
    at_ms: int = Field(default_factory=now_ms)


class ApiKeyRevoked(WireModel):
    schema_: Literal["control/v1"] = Field(CONTROL_SCHEMA, alias="schema")
    kind: Literal["api_key_revoked"] = "api_key_revoked"
    key_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    at_ms: int = Field(default_factory=now_ms)


class AdapterRegistered(WireModel):
    """An adapter added to (or replaced in) the registry; `llmpipe adapters register` verified it."""

    schema_: Literal["control/v1"] = Field(CONTROL_SCHEMA, alias="schema")
    kind: Literal["adapter_registered"] = "adapter_registered"
    spec: AdapterSpec
    at_ms: int = Field(default_factory=now_ms)


class AdapterStateChanged(WireModel):
    """promote/demote: hot (in the engine) / warm (CPU cache) / cold (disk) / incompatible (never served)."""

    schema_: Literal["control/v1"] = Field(CONTROL_SCHEMA, alias="schema")
    kind: Literal["adapter_state"] = "adapter_state"
    name: str
    state: AdapterState
    reason: str = ""
    at_ms: int = Field(default_factory=now_ms)


class Marker(WireModel):
    """Written by a follower to learn it has caught up (end offsets are unreliable on Tansu)."""

    schema_: Literal["control/v1"] = Field(CONTROL_SCHEMA, alias="schema")
    kind: Literal["marker"] = "marker"
    marker_id: str


ControlKind = (CachePut | CacheInvalidate | BreakerUpdate | TenantUpsert | ApiKeyIssued | ApiKeyRevoked | AdapterRegistered
               | AdapterStateChanged | ActorPrepared | ActorReplicaReport | ActorActivated | ActorRejected | Marker)


class ControlRecord(RootModel[Annotated[ControlKind, Field(discriminator="kind")]]):
    pass
