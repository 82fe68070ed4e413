"""The semantic cache's per-tenant bound (`max_entries_per_tenant`) on the real embedder and the
embedded Qdrant index: the oldest entries go, other tenants keep theirs, re-puts and invalidations
do not skew the count, and a restarted cache counts what its persistent index already holds."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from pipeline.contracts import CacheInvalidate, CachePut, RequestDoc
from pipeline.contracts.request import RequestContext
from pipeline.engines.embedder import Embedder
from pipeline.security.sealing import Keyring
from pipeline.stages.cache.config import CachePolicy
from pipeline.stages.cache.semantic import KEYWORD_FIELDS, NUMERIC_FIELDS, SemanticCache
from pipeline.stores.index_spec import open_index
from pipeline.stores.vector_index import IndexEntry, Match, VectorIndex

PROMPTS = [  # faq, far apart: a lookup of one never passes the gate on another
    "What are your opening hours on weekdays?",
    "Do you offer gift wrapping for presents?",
    "Can I bring my dog into the store?",
    "Is there parking near your main office?",
    "Do you have a student discount?",
]
DAY_MS = 86_400_000


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder()


@pytest.fixture
def keyring() -> Keyring:
    return Keyring.ephemeral()


@pytest.fixture
def index(embedder, tmp_path):
    idx = open_index(f"edge:{tmp_path / 'idx'}", embedder.dim, KEYWORD_FIELDS, NUMERIC_FIELDS)
    yield idx
    idx.close()


@pytest.fixture
def cache(index, embedder, keyring) -> SemanticCache:
    return SemanticCache(index, embedder, CachePolicy(max_entries_per_tenant=3), keyring)


def doc(text: str, tenant: str = "acme", **ctx) -> RequestDoc:
    return RequestDoc(request_id="r", tenant_id=tenant, body={"messages": [{"role": "user", "content": text}]},
                      principal="alice", context=RequestContext(**ctx))


def put(cache: SemanticCache, d: RequestDoc, at_ms: int) -> CachePut:
    record = cache.put_record(d, f"answer to {d.body.messages[0].content}", at_ms=at_ms)
    assert record is not None
    assert cache.apply(record) == 1
    return record


def served(cache: SemanticCache, d: RequestDoc, at_ms: int = 100_000) -> str | None:
    """The answer a lookup serves, None on a miss."""
    sec = cache.lookup_many([d], at_ms)[0].section
    return sec.answer if sec.decision == "hit" else None


def held(index: VectorIndex, tenant: str) -> int:
    return index.count([Match("tenant", tenant)])


def evictions() -> float:
    return sum(REGISTRY.get_sample_value("llmpipe_cache_evictions_total", {"expired": e}) or 0.0
               for e in ("true", "false"))


def test_a_tenant_over_the_bound_loses_its_oldest_and_no_one_elses(cache, index):
    before = evictions()
    for i, p in enumerate(PROMPTS[:2]):  # globex's are the oldest entries in the index
        put(cache, doc(p, tenant="globex"), at_ms=500 + i)
    for i, p in enumerate(PROMPTS):
        put(cache, doc(p), at_ms=1_000 + i)
        assert served(cache, doc(p)) == f"answer to {p}"  # each entry hits while it is held
    assert held(index, "acme") == 3 and held(index, "globex") == 2
    assert [served(cache, doc(p)) for p in PROMPTS] == [None, None, *(f"answer to {p}" for p in PROMPTS[2:])]
    assert [served(cache, doc(p, tenant="globex")) for p in PROMPTS[:2]] == [f"answer to {p}" for p in PROMPTS[:2]]
    assert evictions() - before == 2


def test_a_re_put_moves_the_entry_to_newest_without_evicting(cache, index):
    for i, p in enumerate(PROMPTS[:3]):
        put(cache, doc(p), at_ms=1_000 + i)
    first = put(cache, doc(PROMPTS[0]), at_ms=2_000)  # the same request again: the same entry id
    assert first.entry_id in cache.tenants()["acme"].order
    assert held(index, "acme") == 3
    assert [served(cache, doc(p)) for p in PROMPTS[:3]] == [f"answer to {p}" for p in PROMPTS[:3]]
    put(cache, doc(PROMPTS[3]), at_ms=3_000)  # now PROMPTS[1] is the oldest
    assert held(index, "acme") == 3
    assert [served(cache, doc(p)) for p in PROMPTS[:4]] == [
        f"answer to {PROMPTS[0]}", None, f"answer to {PROMPTS[2]}", f"answer to {PROMPTS[3]}"]


def test_entries_an_invalidation_deleted_no_longer_count(cache, index):
    put(cache, doc(PROMPTS[0], data_version="kb-1"), at_ms=1_000)
    put(cache, doc(PROMPTS[1], data_version="kb-2"), at_ms=1_001)
    put(cache, doc(PROMPTS[2], data_version="kb-1"), at_ms=1_002)
    assert cache.apply(CacheInvalidate(tenant="acme", data_version="kb-1", before_ms=5_000)) == 2
    put(cache, doc(PROMPTS[3], data_version="kb-2"), at_ms=6_000)
    put(cache, doc(PROMPTS[4], data_version="kb-2"), at_ms=6_001)
    # 3 held: counting the 2 invalidated ones as well would have evicted PROMPTS[1]
    assert held(index, "acme") == 3 and len(cache.tenants()["acme"].order) == 3
    assert [served(cache, doc(p, data_version="kb-2")) for p in (PROMPTS[1], PROMPTS[3], PROMPTS[4])] == [
        f"answer to {p}" for p in (PROMPTS[1], PROMPTS[3], PROMPTS[4])]


def test_expired_entries_are_evicted_before_older_live_ones(cache, index):
    put(cache, doc(PROMPTS[0]), at_ms=1_000)  # faq: 7 days
    put(cache, doc("How long does shipping take to Canada?"), at_ms=2_000)  # shipping: 1 day
    put(cache, doc(PROMPTS[1]), at_ms=3_000)
    later = 2 * DAY_MS
    put(cache, doc(PROMPTS[2]), at_ms=later)
    assert held(index, "acme") == 3
    assert index.count([Match("domain", "shipping")]) == 0
    assert served(cache, doc(PROMPTS[0]), at_ms=later + 1) == f"answer to {PROMPTS[0]}"


def test_a_restarted_cache_counts_what_its_index_already_holds(cache, index, embedder, keyring):
    for i, p in enumerate(PROMPTS[:3]):
        put(cache, doc(p), at_ms=1_000 + i)
    restarted = SemanticCache(index, embedder, CachePolicy(max_entries_per_tenant=3), keyring)
    put(restarted, doc(PROMPTS[3]), at_ms=2_000)  # no replay of the first three: `control` was compacted
    assert held(index, "acme") == 3
    assert served(restarted, doc(PROMPTS[0])) is None
    assert served(restarted, doc(PROMPTS[3])) == f"answer to {PROMPTS[3]}"


@pytest.mark.parametrize("spec", ["edge", "qdrant-memory:"])
def test_delete_by_ids_and_payloads_on_both_indexes(spec, tmp_path):
    idx = open_index(f"edge:{tmp_path / 'e'}" if spec == "edge" else spec, 4, ("tenant",), ("created_ms",))
    try:
        idx.upsert([IndexEntry(f"e{i}", [1.0, 0.0, 0.0, 0.0], {"tenant": "t", "created_ms": i, "big": "x"})
                    for i in range(3)])
        idx.delete_ids(["e0", "never-written"])
        idx.delete_ids([])
        assert idx.count() == 2
        assert sorted(idx.payloads(["created_ms"])) == [("e1", {"created_ms": 1}), ("e2", {"created_ms": 2})]
    finally:
        idx.close()
