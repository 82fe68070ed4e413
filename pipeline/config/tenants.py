"""Tenants as configured: their limits and their API keys' hashes (the registry adds `control`'s
updates: pipeline/registries/tenants.py)."""

from __future__ import annotations

from fnmatch import fnmatchcase

from pydantic import BaseModel, Field


class RateLimits(BaseModel):
    """None = unlimited. Windows are rolling minutes at one-second granularity."""

    rpm: int | None = Field(None, ge=0, description="admitted requests per rolling minute")
    tpm: int | None = Field(None, ge=0, description="tokens per rolling minute: prompt + max_tokens, settled on completion")
    concurrency: int | None = Field(None, ge=0, description="requests in flight between admit and their answer")

    def any(self) -> bool:
        return self.rpm is not None or self.tpm is not None or self.concurrency is not None


class ToolAccess(BaseModel):
    """Which function tools a tenant's callers may offer a model (fnmatch patterns on tool names)."""

    allow: list[str] = Field(default_factory=lambda: ["*"], description="any key of the tenant")
    roles: dict[str, list[str]] = Field(default_factory=dict, description="role -> more patterns its keys may offer")

    def refused(self, names: list[str], roles: list[str] | tuple[str, ...]) -> list[str]:
        """The names this caller may not offer."""
        patterns = [*self.allow, *(p for r in roles for p in self.roles.get(r, ()))]
        return [n for n in names if not any(fnmatchcase(n, p) for p in patterns)]


class TenantLimits(RateLimits):
    """A tenant's limits (None = unlimited). Budgets in USD, per UTC day and calendar month."""

    daily_budget_usd: float | None = Field(None, ge=0)
    monthly_budget_usd: float | None = Field(None, ge=0)
    max_queue: int = Field(0, ge=0, description="requests that may wait for a slot (0: reject at once)")
    max_prompt_chars: int = Field(32_000, ge=1, description="larger prompts are rejected before any work")
    tools: ToolAccess = Field(default_factory=ToolAccess, description="the tools its callers may offer (default: any)")
    deployments: dict[str, RateLimits] = Field(default_factory=dict,
                                               description="per (tenant, deployment) limits, by deployment name")
    idempotency_window_s: int = Field(86_400, ge=1, description="how long an idempotency key's result is kept")
    max_idempotency_claims: int = Field(10_000, ge=1, description="idempotency keys (each with its sealed answer) "
                                        "admit holds for the tenant: past it the oldest finished one is forgotten")
    max_request_ids: int = Field(50_000, ge=1, description="request ids admit remembers for the tenant (a replayed "
                                 "one is refused `duplicate_request`): past it the oldest is forgotten")
    feedback_rpm: int | None = Field(None, ge=0, description="feedback records per minute (a long text counts "
                                                             "more); None: the rpm, or 600 when that is unlimited")


class ApiKeySpec(BaseModel):
    key_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    principal: str = "default"
    roles: list[str] = Field(default_factory=list)
    revoked: bool = False


def default_tenant_limits() -> TenantLimits:
    """What a tenant gets when nobody configured its limits (an unknown or anonymous caller): never
    none. Generous for one team's traffic, small enough that one caller cannot take a deployment."""
    return TenantLimits(rpm=3000, tpm=3_000_000, concurrency=64, daily_budget_usd=100.0)


class TenantSpec(BaseModel):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    limits: TenantLimits | None = Field(None, description="None: the stack's tenant_defaults")
    api_keys: list[ApiKeySpec] = Field(default_factory=list)
