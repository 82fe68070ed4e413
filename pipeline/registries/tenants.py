"""Tenants, their API keys and limits: the gateway's registry, from config plus `control` updates.

API keys are random 256-bit tokens shown once (`llmpipe tenants add`); only their SHA-256 is kept
(a slow KDF buys nothing for keys with that much entropy), and only a 12-hex key id ever appears
in logs, evidence or CLI output. mask authenticates with this registry (the front of the
pipeline: no later stage works for an unknown caller); admit reads the limits.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from pipeline.config.tenants import ApiKeySpec, TenantLimits, TenantSpec, default_tenant_limits

KEY_PREFIX = "lp-"


def new_api_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_hash(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


def key_id(key_sha256: str) -> str:
    """What logs and evidence may show of a key."""
    return key_sha256[:12]


@dataclass(frozen=True)
class Caller:
    tenant: str
    principal: str
    roles: tuple[str, ...]
    key_id: str


class TenantRegistry:
    """Tenants and hashed keys. `apply` takes control records (from a follower thread); lookups
    replace whole entries, never mutate them, so readers on other threads see old or new."""

    def __init__(self, specs: list[TenantSpec] | None = None, defaults: TenantLimits | None = None) -> None:
        self.defaults = defaults or default_tenant_limits()
        self.limits: dict[str, TenantLimits] = {}
        self.keys: dict[str, tuple[str, ApiKeySpec]] = {}  # sha256 -> (tenant, key)
        for spec in specs or []:
            self.limits[spec.name] = spec.limits or self.defaults
            for k in spec.api_keys:
                self.keys[k.key_sha256] = (spec.name, k)

    def apply(self, record: object) -> bool:
        from pipeline.contracts.control import ApiKeyIssued, ApiKeyRevoked, TenantUpsert

        if isinstance(record, TenantUpsert):
            base = self.limits.get(record.tenant, self.defaults)
            try:
                self.limits[record.tenant] = TenantLimits.model_validate({**base.model_dump(), **record.limits})
            except ValueError:
                return False  # an invalid update changes nothing (the CLI validates before publishing)
            return True
        if isinstance(record, ApiKeyIssued):
            self.keys[record.key_sha256] = (record.tenant, ApiKeySpec(key_sha256=record.key_sha256,
                                                                      principal=record.principal,
                                                                      roles=list(record.roles)))
            return True
        if isinstance(record, ApiKeyRevoked):
            entry = self.keys.get(record.key_sha256)
            if entry is not None:
                self.keys[record.key_sha256] = (entry[0], entry[1].model_copy(update={"revoked": True}))
            return entry is not None
        return False

    def authenticate(self, api_key: str) -> Caller | None:
        """The caller behind a key; None for an unknown or revoked key (the caller is told nothing
        more: which one it was is for the operator's evidence)."""
        digest = key_hash(api_key)
        entry = self.keys.get(digest)
        if entry is None or not hmac.compare_digest(entry[1].key_sha256, digest) or entry[1].revoked:
            return None
        tenant, k = entry
        return Caller(tenant=tenant, principal=k.principal, roles=tuple(k.roles), key_id=key_id(digest))

    def by_key_id(self, kid: str) -> Caller | None:
        """The caller behind a key id, as the registry knows it now (None: unknown or revoked)."""
        for digest, (tenant, k) in list(self.keys.items()):
            if key_id(digest) == kid and not k.revoked:
                return Caller(tenant=tenant, principal=k.principal, roles=tuple(k.roles), key_id=kid)
        return None

    def why_refused(self, api_key: str) -> str:
        entry = self.keys.get(key_hash(api_key))
        return "unknown_key" if entry is None else ("revoked_key" if entry[1].revoked else "ok")

    def limits_for(self, tenant: str | None) -> TenantLimits:
        """A configured tenant's limits, else the defaults: an unknown or anonymous tenant is
        metered like any other."""
        return self.limits.get(tenant or "", self.defaults)
