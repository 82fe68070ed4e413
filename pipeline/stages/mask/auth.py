"""Who is calling: an API key checked against the tenant registry, or a front door's caller assertion
that stands for a key it checked. The key never travels past the stage that checks it (mask for
requests, feedback for feedback)."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.contracts import RequestDoc
from pipeline.contracts.feedback import Feedback
from pipeline.contracts.request import ANONYMOUS_TENANT
from pipeline.registries.tenants import Caller, TenantRegistry
from pipeline.security.caller_assertion import AssertionRefused
from pipeline.security.caller_assertion import verify as verify_assertion
from pipeline.security.sealing import Keyring


@dataclass(frozen=True)
class Identified:
    caller: Caller | None  # None: no key (auth off, or a trusted producer that named its tenant)
    tenant: str | None
    refused: str | None  # the rejection class, or None
    reason: str


def identify(doc: RequestDoc | Feedback, registry: TenantRegistry, required: bool,
             keyring: Keyring | None = None) -> Identified:
    """The caller behind `doc`'s key or the door's assertion for it, or why there is none."""
    if doc.caller_assertion is not None and doc.api_key is None:
        if keyring is None:
            return Identified(None, None, "unauthenticated", "caller assertions are not accepted here")
        try:
            vouched = verify_assertion(doc.caller_assertion, doc, keyring)
        except AssertionRefused as exc:
            return Identified(None, None, "unauthenticated", str(exc))
        caller = registry.by_key_id(vouched.key_id)
        if caller is None or caller.tenant != vouched.tenant:
            return Identified(None, None, "unauthenticated", "revoked_key")
        return Identified(caller, caller.tenant, None, f"key {caller.key_id} (asserted by the front door)")
    if doc.api_key is None:
        if required:
            return Identified(None, None, "unauthenticated", "an API key is required")
        if doc.tenant_id is None:  # auth is off: still a tenant, metered and scoped like any other
            return Identified(None, ANONYMOUS_TENANT, None, "no key: anonymous")
        return Identified(None, doc.tenant_id, None, "no key: trusted producer")
    caller = registry.authenticate(doc.api_key)
    if caller is None:
        return Identified(None, None, "unauthenticated", registry.why_refused(doc.api_key))
    if doc.tenant_id is not None and doc.tenant_id != caller.tenant:
        return Identified(None, None, "unauthenticated", "the key belongs to another tenant")
    return Identified(caller, caller.tenant, None, f"key {caller.key_id}")


def authenticate(doc: RequestDoc, registry: TenantRegistry, required: bool,
                 keyring: Keyring | None = None) -> tuple[RequestDoc, str | None, str]:
    """(doc with the key stripped and the caller filled in, rejection class or None, reason).
    The key never travels past this stage; only its key id reaches evidence. A front door's
    caller assertion stands for a key it verified (pipeline.security.caller_assertion)."""
    who = identify(doc, registry, required, keyring)
    stripped = doc.model_copy(update={"api_key": None, "caller_assertion": None})
    if who.refused is not None:
        return stripped, who.refused, who.reason
    if who.caller is None:
        return stripped.model_copy(update={"tenant_id": who.tenant}), None, who.reason
    c = who.caller
    return stripped.model_copy(update={"tenant_id": c.tenant, "principal": c.principal, "roles": list(c.roles),
                                       "key_id": c.key_id}), None, who.reason
