"""The semantic cache on the real embedder and the embedded Qdrant index: boundaries, freshness,
invalidation and shadow mode never let a wrong answer out."""

from __future__ import annotations

import pytest

from pipeline.contracts import CacheInvalidate, RequestDoc
from pipeline.contracts.request import RequestContext
from pipeline.engines.embedder import Embedder
from pipeline.security.sealing import Keyring
from pipeline.stages.cache.config import CachePolicy
from pipeline.stages.cache.semantic import KEYWORD_FIELDS, NUMERIC_FIELDS, SemanticCache
from pipeline.stores.index_spec import open_index

Q = "What are your opening hours on weekdays?"


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder()


@pytest.fixture
def cache(embedder, tmp_path):
    index = open_index(f"edge:{tmp_path / 'idx'}", embedder.dim, KEYWORD_FIELDS, NUMERIC_FIELDS)
    c = SemanticCache(index, embedder, CachePolicy(), Keyring.ephemeral())
    yield c
    index.close()


def doc(text: str = Q, tenant: str = "acme", model: str | None = None, principal: str | None = "alice",
        **ctx) -> RequestDoc:
    return RequestDoc(request_id="r", tenant_id=tenant, body={"messages": [{"role": "user", "content": text}], "model": model},
                      principal=principal, context=RequestContext(**ctx))


def lookup(cache: SemanticCache, d: RequestDoc, at_ms: int | None = None):
    return cache.lookup_many([d], at_ms)[0].section


def test_a_paraphrase_hits_with_the_stored_answer(cache):
    cache.apply(cache.put_record(doc(), "9 to 6, Monday to Friday"))
    sec = lookup(cache, doc("what are your opening hours on weekdays"))
    assert sec.decision == "hit" and sec.answer == "9 to 6, Monday to Friday"
    assert sec.similarity is not None and sec.similarity >= sec.threshold and all(sec.gate.values())


@pytest.mark.parametrize("other", [
    {"tenant": "globex"},
    {"model": "large"},
    {"acl_scope": "user"},  # alice's own entries are not the tenant's
    {"locale": "ko"},
    {"data_version": "kb-2"},
])
def test_no_hit_across_any_boundary(cache, other):
    policy_models = {"default": "small@r1", "large": "large@r3"}
    cache.policy = CachePolicy(model_revisions=policy_models)
    cache.apply(cache.put_record(doc(), "9 to 6"))
    assert lookup(cache, doc()).decision == "hit"  # the same request does hit
    tenant = other.pop("tenant", "acme")
    model = other.pop("model", None)
    sec = lookup(cache, doc(tenant=tenant, model=model, **other))
    assert sec.decision == "miss" and sec.answer is None


def test_a_key_claiming_another_principals_scope_neither_reads_nor_poisons_it(cache):
    """The scope comes from the authenticated principal: bob writing `user:alice` lands in his own."""
    cache.apply(cache.put_record(doc(acl_scope="user"), "alice's private answer"))
    assert lookup(cache, doc(acl_scope="user")).decision == "hit"  # alice reads her own
    assert lookup(cache, doc(principal="bob", acl_scope="user:alice")).decision == "miss"
    cache.apply(cache.put_record(doc(principal="bob", acl_scope="user:alice"), "bob's poison"))
    sec = lookup(cache, doc(acl_scope="user"))
    assert sec.decision == "hit" and sec.answer == "alice's private answer"


def test_another_system_prompt_is_another_boundary(cache):
    def with_system(system: str | None) -> RequestDoc:
        msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": Q}]
        return RequestDoc(request_id="r", tenant_id="acme", body={"messages": msgs})

    cache.apply(cache.put_record(with_system("Answer in one short sentence."), "9 to 6"))
    assert lookup(cache, with_system("Answer in one short sentence.")).decision == "hit"
    assert lookup(cache, with_system("Answer like a pirate.")).decision == "miss"
    assert lookup(cache, with_system(None)).decision == "miss"


def test_a_new_model_revision_is_a_new_boundary(cache):
    cache.apply(cache.put_record(doc(), "old model's answer"))
    cache.policy = CachePolicy(model_revisions={"default": "default@r2"})
    assert lookup(cache, doc()).decision == "miss"


def test_expired_entries_never_hit(cache):
    put = cache.put_record(doc(), "9 to 6", at_ms=1_000)
    cache.apply(put)
    ttl_ms = cache.policy.domains["faq"].ttl_s * 1000
    assert lookup(cache, doc(), at_ms=1_000 + ttl_ms - 1).decision == "hit"
    assert lookup(cache, doc(), at_ms=1_000 + ttl_ms + 1).decision == "miss"


def test_invalidated_entries_never_hit_even_if_a_put_arrives_late(cache):
    put = cache.put_record(doc(), "9 to 6", at_ms=5_000)
    cache.apply(put)
    other = cache.put_record(doc(tenant="globex"), "globex hours", at_ms=5_000)
    cache.apply(other)
    deleted = cache.apply(CacheInvalidate(tenant="acme", before_ms=10_000))
    assert deleted == 1
    assert lookup(cache, doc(), at_ms=6_000).decision == "miss"
    assert lookup(cache, doc(tenant="globex"), at_ms=6_000).decision == "hit"  # other tenants untouched
    cache.apply(put)  # a write-back racing the invalidation
    assert lookup(cache, doc(), at_ms=6_000).decision == "miss"
    fresh = cache.put_record(doc(), "new hours", at_ms=20_000)
    cache.apply(fresh)  # written after the invalidation: valid
    assert lookup(cache, doc(), at_ms=21_000).answer == "new hours"


def test_invalidation_narrowed_by_revision(cache):
    cache.apply(cache.put_record(doc(), "9 to 6", at_ms=5_000))
    assert cache.apply(CacheInvalidate(tenant="acme", model_revision="other@r9", before_ms=10_000)) == 0
    assert lookup(cache, doc(), at_ms=6_000).decision == "hit"


def test_shadow_mode_records_the_would_be_hit_and_serves_none(cache):
    cache.apply(cache.put_record(doc(), "9 to 6"))
    cache.policy = CachePolicy(tenant_modes={"acme": "shadow"})
    sec = lookup(cache, doc())
    # the would-be answer rides along for postprocess to compare (a stage test shows it is never served)
    assert sec.decision == "shadow_hit" and sec.answer == "9 to 6" and sec.candidate_id
    cache.policy = CachePolicy(mode="off")
    assert lookup(cache, doc()).decision == "bypass"


def test_near_misses_and_bypasses_are_refused(cache):
    cache.apply(cache.put_record(doc("How do I reset my password?"), "Use the reset link"))
    assert lookup(cache, doc("How do I reset my router?")).decision == "miss"
    assert lookup(cache, doc("How do I reset my password?", personalised=True)).reason == "personalised"
    assert cache.put_record(doc("What is my balance?"), "42") is None  # volatile: never written
    assert cache.put_record(doc(), "  ") is None


def test_the_write_back_reuses_the_lookup_vector(cache, monkeypatch):
    """postprocess writes back the vector the cache stage computed for the same text: no second
    embedding per request, unless the vector came from another model revision."""
    import numpy as np

    sec = lookup(cache, doc())
    assert sec.decision == "miss" and sec.query_embedding is not None
    looked_up = doc().model_copy(update={"cache": sec})
    calls = []
    real = cache.embedder.embed
    monkeypatch.setattr(cache.embedder, "embed", lambda texts, **kw: calls.append(texts) or real(texts, **kw))
    put = cache.put_record(looked_up, "9 to 6")
    assert calls == []
    assert np.allclose(put.vector, real([Q])[0], atol=1e-5)
    stale = doc().model_copy(update={"cache": sec.model_copy(update={"embedding_revision": "other@r0"})})
    assert cache.put_record(stale, "9 to 6") is not None and calls == [[Q]]


def test_an_entry_is_sealed_in_the_write_back_and_in_the_index(cache, embedder, tmp_path):
    # a name the masker missed must not sit readable in the control topic or the index
    prompt, answer = "Is Ottoline Vasquez-Brandt's order ready?", "Ottoline Vasquez-Brandt's order ships today"
    put = cache.put_record(doc(prompt), answer)
    assert put is not None and "Ottoline" not in put.model_dump_json()
    assert set(put.payload) >= {"sealed", "entry_id", "tenant"} and "prompt" not in put.payload
    cache.apply(put)
    [stored] = cache.index.search(put.vector, [], limit=1)
    assert "Ottoline" not in repr(stored.payload)
    assert lookup(cache, doc(prompt)).answer == answer  # the cache itself still opens it
    # files on disk: the index's storage holds no readable copy either
    raw = b"".join(p.read_bytes() for p in (tmp_path / "idx").rglob("*") if p.is_file())
    assert b"Ottoline" not in raw


def test_an_entry_that_does_not_open_is_never_served(cache, embedder):
    cache.apply(cache.put_record(doc(), "9 to 6"))
    assert lookup(cache, doc()).decision == "hit"
    cache.keyring = Keyring.ephemeral()  # the writer's key is gone (rotated out of the keyring)
    sec = lookup(cache, doc())
    assert sec.decision == "miss" and sec.answer is None
