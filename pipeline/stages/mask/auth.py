"""Who is calling: an API key checked against the tenant registry, or a front door's caller assertion
that stands for a key it checked. The key never travels past mask."""

from __future__ import annotations

from pipeline.contracts import RequestDoc
from pipeline.contracts.request import ANONYMOUS_TENANT
from pipeline.registries.tenants import TenantRegistry
from pipeline.security.caller_assertion import AssertionRefused
from pipeline.security.caller_assertion import verify as verify_assertion
from pipeline.security.sealing import Keyring


def authenticate(doc: RequestDoc, registry: TenantRegistry, required: bool,
                 keyring: Keyring | None = None) -> tuple[RequestDoc, str | None, str]:
    """(doc with the key stripped and the caller filled in, rejection class or None, reason).
    The key never travels past this stage; only its key id reaches evidence. A front door's
    caller assertion stands for a key it verified (pipeline.security.caller_assertion)."""
    if doc.caller_assertion is not None and doc.api_key is None:
        stripped = doc.model_copy(update={"caller_assertion": None})
        if keyring is None:
            return stripped, "unauthenticated", "caller assertions are not accepted here"
        try:
            vouched = verify_assertion(doc.caller_assertion, doc, keyring)
        except AssertionRefused as exc:
            return stripped, "unauthenticated", str(exc)
        caller = registry.by_key_id(vouched.key_id)
        if caller is None or caller.tenant != vouched.tenant:
            return stripped, "unauthenticated", "revoked_key"
        return stripped.model_copy(update={"tenant_id": caller.tenant, "principal": caller.principal,
                                           "roles": list(caller.roles), "key_id": caller.key_id}), \
            None, f"key {caller.key_id} (asserted by the front door)"
    if doc.api_key is None:
        if required:
            return doc, "unauthenticated", "an API key is required"
        if doc.tenant_id is None:  # auth is off: still a tenant, metered and scoped like any other
            return doc.model_copy(update={"tenant_id": ANONYMOUS_TENANT}), None, "no key: anonymous"
        return doc, None, "no key: trusted producer"
    caller = registry.authenticate(doc.api_key)
    stripped = doc.model_copy(update={"api_key": None, "caller_assertion": None})
    if caller is None:
        return stripped, "unauthenticated", registry.why_refused(doc.api_key)
    if doc.tenant_id is not None and doc.tenant_id != caller.tenant:
        return stripped, "unauthenticated", "the key belongs to another tenant"
    authed = stripped.model_copy(update={"tenant_id": caller.tenant, "principal": caller.principal,
                                         "roles": list(caller.roles), "key_id": caller.key_id})
    return authed, None, f"key {caller.key_id}"
