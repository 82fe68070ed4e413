"""Who is calling: an API key checked against the tenant registry, or a front door's caller assertion
that stands for a key it checked. The key never travels past the stage that checks it (mask for
requests, feedback for feedback).

Who the caller is comes from the key's config alone: a producer's own `principal`, `roles` and
`key_id` are dropped (with auth off too), as are stage sections it filled in itself."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config.tenants import ToolAccess
from pipeline.contracts import RequestDoc
from pipeline.contracts.feedback import Feedback
from pipeline.contracts.request import ANONYMOUS_TENANT
from pipeline.registries.tenants import Caller, TenantRegistry
from pipeline.security.caller_assertion import UNSIGNED, AssertionRefused
from pipeline.security.caller_assertion import verify as verify_assertion
from pipeline.security.sealing import Keyring

# UNSIGNED but `origin` is what only the pipeline writes: a producer's values are dropped on
# entry (a forged `route`, `admission` or `cache` section must never steer a later stage), and
# the caller is filled in from the key alone.
_LISTS = ("roles", "timings")
DEFAULT_ASSERTION_MAX_AGE_MS = 600_000  # the door's longest deadline (http.max_timeout_s)


@dataclass(frozen=True)
class Identified:
    caller: Caller | None  # None: no key (auth off, or a trusted producer that named its tenant)
    tenant: str | None
    refused: str | None  # the rejection class, or None
    reason: str


def identify(doc: RequestDoc | Feedback, registry: TenantRegistry, required: bool,
             keyring: Keyring | None = None, max_age_ms: int | None = DEFAULT_ASSERTION_MAX_AGE_MS) -> Identified:
    """The caller behind `doc`'s key or the door's assertion for it, or why there is none. A
    request's assertion expires after `max_age_ms`; feedback's never does (it is stored once per
    feedback_id whatever its age, and a backlog must not lose it)."""
    if doc.caller_assertion is not None and doc.api_key is None:
        if keyring is None:
            return Identified(None, None, "unauthenticated", "caller assertions are not accepted here")
        try:
            vouched = verify_assertion(doc.caller_assertion, doc, keyring,
                                       max_age_ms=max_age_ms if isinstance(doc, RequestDoc) else None)
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


def authenticate(doc: RequestDoc, registry: TenantRegistry, required: bool, keyring: Keyring | None = None,
                 max_age_ms: int | None = DEFAULT_ASSERTION_MAX_AGE_MS) -> tuple[RequestDoc, str | None, str]:
    """(doc with the key, the producer's own caller fields and stage sections stripped and the
    verified caller filled in, rejection class or None, reason). The key never travels past this
    stage; only its key id reaches evidence. A front door's caller assertion stands for a key it
    verified (pipeline.security.caller_assertion)."""
    who = identify(doc, registry, required, keyring, max_age_ms)
    reset = {f: ([] if f in _LISTS else None) for f in UNSIGNED if f != "origin"}
    stripped = doc.model_copy(update=reset)
    if who.refused is not None:  # no tenant verified: a claimed one never reaches the answer or its rows
        return stripped.model_copy(update={"tenant_id": None}), who.refused, who.reason
    if who.caller is None:
        return stripped.model_copy(update={"tenant_id": who.tenant}), None, who.reason
    c = who.caller
    return stripped.model_copy(update={"tenant_id": c.tenant, "principal": c.principal, "roles": list(c.roles),
                                       "key_id": c.key_id}), None, who.reason


def tool_refusal(doc: RequestDoc, access: ToolAccess) -> str | None:
    """Why this caller may not offer these tools (the tenant's `tools` access, by the key's roles).
    Checked before any model sees them; the answer's calls are checked against what was offered."""
    refused = access.refused([t.function.name for t in doc.body.tools], doc.roles)
    return f"this API key may not offer the tool(s) {', '.join(refused[:5])}" if refused else None


def rollout_refusal(doc: RequestDoc, role: str | None) -> str | None:
    """Why this caller may not ask for rollouts (n samples, scored by hooks): the role must come
    from its API key's config, which `authenticate` alone fills in. None: allowed."""
    if doc.rollout is None or role is None or role in doc.roles:
        return None
    return f"a rollout request needs the role `{role}`, which no API key of this caller's grants"
