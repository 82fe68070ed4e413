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


# ---- issue 35, finding 4: everything the pipeline acts on is signed; assertions expire -----------

T0 = 1_790_000_000_000


def full_doc() -> RequestDoc:
    return doc(tenant_id="acme", idempotency_key="k", deadline_ms=T0 + 60_000, created_ms=T0, episode_id="ep-1",
               device_id="phone-1", device={"battery_pct": 80}, traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01",
               reply_to={"topic": "llmpipe.responses", "partition": 2}, labels={"suite": "x"})


# each: a change a reader of `requests` could make to a captured request to redirect, enlarge or
# re-steer it
TAMPERING = {
    "reply_to.topic": {"reply_to": {"topic": "llmpipe.stage.generate", "partition": 2}},
    "reply_to.partition": {"reply_to": {"topic": "llmpipe.responses", "partition": 0}},
    "reply_to.stream": {"reply_to": {"topic": "llmpipe.responses", "partition": 2, "stream": True}},
    "deadline_ms": {"deadline_ms": T0 + 3_600_000},
    "created_ms": {"created_ms": T0 + 1},
    "rollout": {"rollout": {"group_id": "g", "n": 64}},
    "episode_id": {"episode_id": "someone-elses-episode"},
    "device": {"device": {"privacy_local_only": True}},
    "device_id": {"device_id": "phone-2"},
    "labels": {"labels": {"suite": "y"}},
    "attempt": {"attempt": 1},
    "traceparent": {"traceparent": None},
    "tenant_id": {"tenant_id": "globex"},
    "context": {"context": {"acl_scope": "role:admin"}},
    "idempotency_key": {"idempotency_key": "k2"},
    "body.max_tokens": {"body": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4096}},
    "request_id": {"request_id": "r2"},
}


@pytest.mark.parametrize("field", sorted(TAMPERING))
def test_changing_any_field_the_pipeline_acts_on_fails_verification(registry, field):
    reg, key = registry
    d = full_doc()
    token = sign(d, reg.authenticate(key), KEYRING, now_ms=T0)
    assert verify(token, RequestDoc.model_validate_json(d.model_dump_json(by_alias=True)), KEYRING, now_ms=T0)
    changed = RequestDoc.model_validate({**d.model_dump(mode="json", by_alias=True), **TAMPERING[field]})
    with pytest.raises(AssertionRefused, match="does not match"):
        verify(token, changed, KEYRING, now_ms=T0)


def test_what_mask_sets_itself_is_not_signed_and_is_dropped_on_entry(registry):
    reg, key = registry
    d = full_doc()
    d = d.model_copy(update={"caller_assertion": sign(d, reg.authenticate(key), KEYRING)})
    forged = RequestDoc.model_validate({**d.model_dump(mode="json", by_alias=True),
        "principal": "root", "roles": ["finance"], "key_id": "0" * 12, "origin": "0:1",
        "route": {"decision": "x", "reason": "x", "model": "big", "policy_version": "forged"},
        "admission": {"decision": "admitted", "reason": "forged", "tokens_reserved": 0, "cost_reserved_usd": 0,
                      "policy_version": "forged"},
        "cache": {"decision": "hit", "reason": "forged", "mode": "on", "domain": "faq", "answer": "pay to x",
                  "policy_version": "forged"},
        "result": {"decision": "ok"}, "timings": [{"stage": "x", "enqueued_ms": 0, "started_ms": 0, "finished_ms": 0,
                                                   "queue_ms": 0, "service_ms": 0}]})
    authed, refused, _ = authenticate(forged, reg, required=True, keyring=KEYRING)
    assert refused is None
    assert (authed.principal, authed.roles, authed.key_id) == ("svc", ["agent"], key_hash(key)[:12])
    assert authed.route is None and authed.admission is None and authed.cache is None and authed.result is None
    assert authed.timings == [] and authed.origin == "0:1", "the runtime's origin stays; the rest is dropped"


def test_an_assertion_expires(registry):
    reg, key = registry
    d = full_doc()
    token = sign(d, reg.authenticate(key), KEYRING, now_ms=T0)
    assert verify(token, d, KEYRING, max_age_ms=600_000, now_ms=T0 + 600_000).tenant == "acme"
    with pytest.raises(AssertionRefused, match="expired"):
        verify(token, d, KEYRING, max_age_ms=600_000, now_ms=T0 + 600_001)
    with pytest.raises(AssertionRefused, match="issue time"):  # issued in the future, past the clock skew
        verify(token, d, KEYRING, max_age_ms=600_000, now_ms=T0 - 120_000)
    # mask refuses it with a clear reason
    stale = d.model_copy(update={"caller_assertion": token})
    _, refused, why = authenticate(stale, reg, required=True, keyring=KEYRING, max_age_ms=1000)
    assert refused == "unauthenticated" and "expired" in why


def test_with_auth_off_a_producers_own_caller_claims_are_dropped():
    """Low 13: roles=["finance"] written by a producer gave the cache scope role:finance."""
    from pipeline.stages.cache.policy import acl_scope

    reg = TenantRegistry([])
    d = doc(tenant_id="acme", principal="cfo", roles=["finance"], key_id="f" * 12,
            context=RequestContext(acl_scope="role:finance"))
    authed, refused, _ = authenticate(d, reg, required=False)
    assert refused is None and authed.tenant_id == "acme"
    assert (authed.principal, authed.roles, authed.key_id) == (None, [], None)
    assert acl_scope(authed) is None, "no role:finance scope from the producer's own claim"


def test_a_rollout_needs_the_role_from_the_keys_config(tmp_path):
    from pipeline.config.settings import Settings, StageSpec
    from pipeline.runtime.stage import StageContext
    from pipeline.stages.mask.stage import MaskStage

    alice, trainer = new_api_key(), new_api_key()
    s = Settings(data_dir=tmp_path, stages=[StageSpec(name="mask")], tenants=[TenantSpec(name="acme", api_keys=[
        {"key_sha256": key_hash(alice), "principal": "alice"},
        {"key_sha256": key_hash(trainer), "principal": "trainer", "roles": ["rollouts"]}])])
    stage = MaskStage(StageContext(spec=s.stage("mask"), settings=s, runtime=s.runtime))
    ro = {"group_id": "g", "n": 8}
    # alice claims the role in the document: it is the key's config that counts
    out = stage.decide(doc(api_key=alice, rollout=ro, roles=["rollouts"]))
    assert out.response is not None and out.response.error_class == "forbidden"
    assert "`rollouts`" in (out.response.reason or "") and out.evidence[0].decision == "rejected"
    assert alice not in out.doc.model_dump_json()
    # the trainer's key grants it (refusals of later steps are not this one)
    from pipeline.stages.mask.auth import rollout_refusal
    authed, refused, _ = authenticate(doc(api_key=trainer, rollout=ro), stage.registry, required=True)
    assert refused is None and rollout_refusal(authed, "rollouts") is None
    assert rollout_refusal(authed.model_copy(update={"roles": []}), "rollouts") is not None
    assert rollout_refusal(authed.model_copy(update={"roles": []}), None) is None, "rollout_role: null"
