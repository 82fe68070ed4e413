"""The door's caller assertion replaces the API key on topics: it vouches for one request only."""

from __future__ import annotations

import os

import pytest

from pipeline.config.tenants import TenantSpec
from pipeline.contracts import RequestDoc
from pipeline.contracts.control import ApiKeyRevoked
from pipeline.contracts.request import RequestContext
from pipeline.registries.tenants import TenantRegistry, key_hash, new_api_key
from pipeline.security.caller_assertion import AssertionRefused, sign, verify
from pipeline.security.sealing import Keyring
from pipeline.stages.mask.auth import authenticate

KEYRING = Keyring({"k1": os.urandom(32)}, "k1")


def doc(text: str = "hi", request_id: str = "r1", **kw) -> RequestDoc:
    return RequestDoc(request_id=request_id, body={"messages": [{"role": "user", "content": text}]}, **kw)


@pytest.fixture
def registry():
    key = new_api_key()
    reg = TenantRegistry([TenantSpec(name="acme", api_keys=[{"key_sha256": key_hash(key), "principal": "svc",
                                                             "roles": ["agent"]}])])
    return reg, key


def test_an_assertion_vouches_for_exactly_one_request(registry):
    reg, key = registry
    caller = reg.authenticate(key)
    d = doc(tenant_id="acme", idempotency_key="k")
    token = sign(d, caller, KEYRING)
    assert key not in token and verify(token, d, KEYRING) == caller
    for other in (doc(request_id="r2", tenant_id="acme", idempotency_key="k"),  # another request
                  doc("changed prompt", tenant_id="acme", idempotency_key="k"),  # the same id, another ask
                  doc(tenant_id="acme", idempotency_key="k2"),
                  d.model_copy(update={"context": RequestContext(acl_scope="role:admin")})):
        with pytest.raises(AssertionRefused):
            verify(token, other, KEYRING)
    with pytest.raises(AssertionRefused):  # another stack's key
        verify(token, d, Keyring({"k1": os.urandom(32)}, "k1"))
    head, kid, claims, mac = token.split(".")
    forged = ".".join((head, kid, claims.replace(claims[:4], "AAAA"), mac))
    with pytest.raises(AssertionRefused):
        verify(forged, d, KEYRING)
    with pytest.raises(AssertionRefused):
        verify("not.a.token", d, KEYRING)


def test_mask_accepts_an_assertion_fills_the_caller_and_strips_it(registry):
    reg, key = registry
    d = doc(tenant_id="acme")
    d = d.model_copy(update={"caller_assertion": sign(d, reg.authenticate(key), KEYRING)})
    authed, refused, why = authenticate(d, reg, required=True, keyring=KEYRING)
    assert refused is None and "asserted" in why
    assert authed.caller_assertion is None and authed.api_key is None
    assert (authed.tenant_id, authed.principal, authed.roles) == ("acme", "svc", ["agent"])
    # a request that claims roles of its own gets the key's, and a tampered one is refused
    tampered = d.model_copy(update={"body": doc("other").body})
    assert authenticate(tampered, reg, required=True, keyring=KEYRING)[1] == "unauthenticated"
    # revoked between door and mask: refused
    reg.apply(ApiKeyRevoked(key_sha256=key_hash(key)))
    _, refused, why = authenticate(d, reg, required=True, keyring=KEYRING)
    assert refused == "unauthenticated" and why == "revoked_key"
