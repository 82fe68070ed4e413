"""The semantic cache over a vector index: lookup (embed, filtered search, threshold, gate),
write-back and invalidation. Used by the cache stage, by postprocess (write-back) and by
`llmpipe cache-eval`.

An entry's prompt and answer are sealed (AES-GCM under the stack's keyring, the entry id as
associated data) in the write-back record and in the index: masking misses some PII, and what it
missed would otherwise sit readable in the control topic and the index files. Only the boundary
fields, the vector and the times are clear. An entry that no longer opens (its key was removed
from the keyring, or an unsealed entry from before) is never served.
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from prometheus_client import Counter

from pipeline.contracts import CacheInvalidate, CachePut, RequestDoc
from pipeline.contracts.base import now_ms
from pipeline.contracts.request import CacheSection
from pipeline.engines.embedder import Embedder, vector_from_b64, vector_to_b64
from pipeline.engines.multilingual import MultilingualEncoder, shared_multilingual
from pipeline.engines.text_analyzer import TextAnalyzer, shared_analyzer
from pipeline.security.sealing import Keyring, RestoreError, open_sealed, seal
from pipeline.stages.cache.config import CachePolicy
from pipeline.stages.cache.gate import GateRules, GateVerdict, gate
from pipeline.stages.cache.policy import BOUNDARY_FIELDS, Boundary, boundary_for, bypass_reason, cache_text, detect_domain
from pipeline.stages.cache.verifier import Verifier, features
from pipeline.stores.vector_index import Condition, IndexEntry, Match, Range, VectorIndex

KEYWORD_FIELDS = (*BOUNDARY_FIELDS, "entry_id")
NUMERIC_FIELDS = ("created_ms", "expires_ms")
# what the bound keeps of an entry: what `Invalidation.covers` reads, and its expiry
TRACKED_FIELDS = ("tenant", "model_revision", "prompt_revision", "data_version", "created_ms", "expires_ms")

log = logging.getLogger(__name__)
_EVICTED = Counter("llmpipe_cache_evictions", "cache index entries deleted to keep a tenant within "
                   "max_entries_per_tenant, by whether they had expired", ("expired",))


def open_entry(payload: dict, keyring: Keyring) -> tuple[str, str] | None:
    """(prompt, answer) of an index entry, or None when it does not open with this keyring."""
    try:
        opened = open_sealed(str(payload.get("sealed", "")), str(payload.get("entry_id", "")), keyring)
        return opened["prompt"], opened["answer"]
    except (RestoreError, KeyError, TypeError) as exc:
        log.warning("cache entry does not open (%s); it is never served", type(exc).__name__)
        return None


@dataclass(frozen=True)
class Invalidation:
    tenant: str
    model_revision: str | None = None
    prompt_revision: str | None = None
    data_version: str | None = None
    before_ms: int = 0  # entries created before this are invalid

    def conditions(self) -> list[Condition]:
        conds: list[Condition] = [Match("tenant", self.tenant), Range("created_ms", lt=self.before_ms)]
        for f in ("model_revision", "prompt_revision", "data_version"):
            if getattr(self, f) is not None:
                conds.append(Match(f, getattr(self, f)))
        return conds

    def covers(self, payload: dict) -> bool:
        if payload.get("tenant") != self.tenant or payload.get("created_ms", 0) >= self.before_ms:
            return False
        return all(getattr(self, f) is None or payload.get(f) == getattr(self, f)
                   for f in ("model_revision", "prompt_revision", "data_version"))


class TenantEntries:
    """One tenant's entries in the index, oldest applied first. `control` has one partition that every
    cache worker applies in order, so every replica evicts the same ids."""

    def __init__(self) -> None:
        self.order: OrderedDict[str, dict] = OrderedDict()  # entry_id -> its TRACKED_FIELDS
        # (expires_ms, entry_id), a heap; items of entries since gone or re-put are skipped when popped
        self.expiry: list[tuple[float, str]] = []

    def add(self, entry_id: str, fields: dict) -> None:
        self.order.pop(entry_id, None)  # a re-put (same boundary and text) is the newest, not a second entry
        self.order[entry_id] = fields
        heapq.heappush(self.expiry, (fields.get("expires_ms", math.inf), entry_id))
        if len(self.expiry) > 2 * len(self.order) + 64:  # rebuilt without stale items: amortised O(1)
            self.expiry = [(f.get("expires_ms", math.inf), i) for i, f in self.order.items()]
            heapq.heapify(self.expiry)

    def evict(self, bound: int, at_ms: int) -> tuple[list[str], int]:
        """The ids to delete to come down to `bound`, removed here: expired ones first (dead weight),
        then the oldest applied; and how many of them had expired."""
        out: list[str] = []
        while len(self.order) > bound and self.expiry and self.expiry[0][0] < at_ms:
            expires, entry_id = heapq.heappop(self.expiry)
            if entry_id in self.order and self.order[entry_id].get("expires_ms", math.inf) == expires:
                del self.order[entry_id]
                out.append(entry_id)
        expired = len(out)
        while len(self.order) > bound:
            out.append(self.order.popitem(last=False)[0])
        return out, expired

    def drop(self, inv: Invalidation) -> None:
        """Forget what the invalidation deletes from the index (the heap skips them later)."""
        for entry_id in [i for i, f in self.order.items() if inv.covers(f)]:
            del self.order[entry_id]


@dataclass
class Lookup:
    section: CacheSection
    boundary: Boundary | None = None
    verdict: GateVerdict | None = None
    candidates: list[str] = field(default_factory=list)


class WordVectors:
    """Embeddings of single words for the gate, memoised (bounded)."""

    def __init__(self, embedder: Embedder, capacity: int = 50_000) -> None:
        self.embedder = embedder
        self.capacity = capacity
        self._memo: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def _vectors(self, words: Sequence[str]) -> np.ndarray:
        with self._lock:
            missing = [w for w in dict.fromkeys(words) if w not in self._memo]
        if missing:
            vecs = self.embedder.embed(missing)
            with self._lock:
                for w, v in zip(missing, vecs):
                    self._memo[w] = v
                while len(self._memo) > self.capacity:
                    self._memo.popitem(last=False)
        with self._lock:
            return np.stack([self._memo[w] for w in words])

    def best_match(self, words: Sequence[str], against: Sequence[str]) -> list[float]:
        if not against:
            return [0.0] * len(words)
        sims = self._vectors(words) @ self._vectors(against).T
        return [float(x) for x in sims.max(axis=1)]


def reused_vector(doc: RequestDoc, embedder: Embedder) -> np.ndarray | None:
    """The cache stage's embedding of this request's text, when it was computed with the same model
    (route and the write-back embed the same text: cache_text, which no later stage changes for a
    cacheable request: images, conversations and rollouts bypass the cache)."""
    c = doc.cache
    if c is None or c.query_embedding is None or c.embedding_revision != embedder.revision:
        return None
    return vector_from_b64(c.query_embedding, embedder.dim)


def put_record(doc: RequestDoc, answer: str, embedder: Embedder, policy: CachePolicy, keyring: Keyring,
               at_ms: int | None = None) -> CachePut | None:
    """The write-back of a cacheable miss (postprocess publishes it on `control`; no index needed).
    None when the request may not be cached: bypass rules, mode off, or an empty answer."""
    at_ms = at_ms or now_ms()
    domain = detect_domain(doc, policy)
    if not answer.strip() or policy.mode_for(doc.tenant_id, domain) == "off":
        return None
    if bypass_reason(doc, policy, domain) is not None:
        return None
    boundary = boundary_for(doc, policy, domain, embedder.revision)
    text = cache_text(doc)
    entry_id = hashlib.sha256(repr((sorted(boundary.as_payload().items()), text)).encode()).hexdigest()[:32]
    ttl_ms = policy.domains[domain].ttl_s * 1000
    payload = {**boundary.as_payload(), "entry_id": entry_id,
               "sealed": seal({"prompt": text, "answer": answer}, entry_id, keyring),
               "created_ms": at_ms, "expires_ms": at_ms + ttl_ms, "policy_version": policy.version}
    vec = reused_vector(doc, embedder)
    if vec is None:
        vec = embedder.embed([text])[0]
    return CachePut(entry_id=entry_id, vector=[float(x) for x in vec], payload=payload, at_ms=at_ms)


class SemanticCache:
    def __init__(self, index: VectorIndex, embedder: Embedder, policy: CachePolicy, keyring: Keyring,
                 analyzer: TextAnalyzer | None = None, multilingual: MultilingualEncoder | None = None) -> None:
        self.index = index
        self.keyring = keyring
        self.embedder = embedder
        self.policy = policy
        self.words = WordVectors(embedder)
        self.analyzer = analyzer or shared_analyzer()
        self.rules = GateRules.build(policy)
        self._verifier: Verifier | None = None  # read on first use: no I/O in the constructor
        self.multilingual = multilingual or shared_multilingual()  # loaded on first use
        self.invalidations: list[Invalidation] = []
        self._tenants: dict[str, TenantEntries] | None = None  # read from the index on the first cache record

    @property
    def verifier(self) -> Verifier | None:
        """The policy's verifier (the shipped one unless `verifier_path`), or None when it is off."""
        if self._verifier is None and self.policy.verifier:
            self._verifier = Verifier.load(Path(self.policy.verifier_path) if self.policy.verifier_path else None)
        return self._verifier

    def pair_evidence(self, query: str, prompt: str, minilm_cos: float | None = None
                      ) -> tuple[GateVerdict, np.ndarray | None]:
        """The gate's verdict on (query, cached prompt) and the verifier's features; no features when
        the gate refused on numbers, entities or relations (no model runs then)."""
        verdict = gate(query, prompt, self.analyzer.analyze, self.words.best_match, self.rules)
        if not all(verdict.checks.get(k, True) for k in ("numbers", "entities", "relations")):
            return verdict, None
        if minilm_cos is None:
            a, b = self.embedder.embed([query, prompt])
            minilm_cos = float(a @ b)
        return verdict, self._features(query, prompt, minilm_cos, verdict)

    def _features(self, query: str, prompt: str, minilm_cos: float, verdict: GateVerdict) -> np.ndarray:
        u = self.multilingual.encode([query, prompt])
        return features(query, prompt, minilm_cos, float(u[0] @ u[1]), verdict)

    # ---- lookup ----------------------------------------------------------------------------

    def lookup_many(self, docs: list[RequestDoc], at_ms: int | None = None) -> list[Lookup]:
        """Micro-batched: one embedding call for every request that may use the cache."""
        at_ms = at_ms or now_ms()
        results: list[Lookup | None] = [None] * len(docs)
        todo: list[tuple[int, str, Boundary, str]] = []
        for i, doc in enumerate(docs):
            domain = detect_domain(doc, self.policy)
            mode = self.policy.mode_for(doc.tenant_id, domain)
            reason = "mode_off" if mode == "off" else bypass_reason(doc, self.policy, domain)
            if reason is not None:
                results[i] = Lookup(self._section("bypass", reason, mode, domain))
                continue
            todo.append((i, cache_text(doc), boundary_for(doc, self.policy, domain, self.embedder.revision), mode))
        if todo:
            vectors = self.embedder.embed([t for _, t, _, _ in todo])
            for (i, text, boundary, mode), vec in zip(todo, vectors):
                found = self._search(text, vec, boundary, mode, at_ms)
                # route and the write-back embed the same text with the same model: they reuse this vector
                found.section = found.section.model_copy(update={"query_embedding": vector_to_b64(vec)})
                results[i] = found
        return [r for r in results if r is not None]

    def _search(self, text: str, vec: np.ndarray, boundary: Boundary, mode: str, at_ms: int) -> Lookup:
        threshold = float(self.policy.threshold_for(boundary.domain, text))  # bypass_reason refused None
        conds: list[Condition] = [Match(f, v) for f, v in boundary.as_payload().items()]
        conds.append(Range("expires_ms", gt=at_ms))
        candidates = [c for c in self.index.search(vec.tolist(), conds, limit=self.policy.top_k)
                      if not any(inv.covers(c.payload) for inv in self.invalidations)]
        ids = [c.id for c in candidates]
        best = candidates[0] if candidates else None
        if best is None:
            return Lookup(self._section("miss", "no_candidate", mode, boundary.domain, threshold), boundary,
                          candidates=ids)
        last_verdict: GateVerdict | None = None
        for cand in candidates:
            if cand.score < threshold:
                break
            entry = open_entry(cand.payload, self.keyring)
            if entry is None:
                continue
            prompt, answer = entry
            verdict = gate(text, prompt, self.analyzer.analyze, self.words.best_match, self.rules)
            last_verdict = verdict
            p = None
            if verdict.passed and self.verifier is not None:
                ok, p = self.verifier.accepts(self._features(text, prompt, cand.score, verdict),
                                              self.policy.verifier_threshold)
                verdict.checks["verifier"] = ok
                if not ok:
                    verdict.passed, verdict.reason = False, "verifier_refused"
            if verdict.passed:
                decision = "hit" if mode == "on" else "shadow_hit"
                section = self._section(decision, "similar_and_verified", mode, boundary.domain, threshold,
                                        cand.id, cand.score, verdict.checks,
                                        answer=answer, verifier_p=p)  # shadow: postprocess compares it
                return Lookup(section, boundary, verdict, ids)
        if last_verdict is None:
            return Lookup(self._section("miss", "below_threshold", mode, boundary.domain, threshold, best.id,
                                        best.score), boundary, candidates=ids)
        return Lookup(self._section("miss", last_verdict.reason, mode, boundary.domain, threshold, best.id,
                                    best.score, last_verdict.checks), boundary, last_verdict, ids)

    def _section(self, decision: str, reason: str, mode: str, domain: str, threshold: float | None = None,
                 candidate_id: str | None = None, similarity: float | None = None,
                 gate_checks: dict[str, bool] | None = None, answer: str | None = None,
                 verifier_p: float | None = None) -> CacheSection:
        return CacheSection(decision=decision, reason=reason, mode=mode, domain=domain, threshold=threshold,
                            candidate_id=candidate_id, similarity=None if similarity is None else round(similarity, 4),
                            gate=gate_checks or {}, answer=answer, policy_version=self.policy.version,
                            verifier_p=None if verifier_p is None else round(verifier_p, 4),
                            verifier_revision=self.verifier.revision if self.verifier else None,
                            embedding_revision=self.embedder.revision)

    # ---- write-back and invalidation (applied from the control topic) -----------------------

    def put_record(self, doc: RequestDoc, answer: str, at_ms: int | None = None) -> CachePut | None:
        return put_record(doc, answer, self.embedder, self.policy, self.keyring, at_ms)

    def apply(self, record: object) -> int:
        """Apply a control record; returns entries written (1) or deleted. Others are not the cache's."""
        if not isinstance(record, (CachePut, CacheInvalidate)):
            return 0
        tenants = self.tenants()
        if isinstance(record, CachePut):
            if any(inv.covers(record.payload) for inv in self.invalidations):
                return 0  # written before an invalidation that has already been applied
            self.index.upsert([IndexEntry(id=record.entry_id, vector=record.vector, payload=dict(record.payload))])
            held = tenants.setdefault(str(record.payload.get("tenant", "")), TenantEntries())
            held.add(record.entry_id, {f: record.payload[f] for f in TRACKED_FIELDS if f in record.payload})
            # the record's own time, not the clock: every replica must pick the same victims
            victims, expired = held.evict(self.policy.max_entries_per_tenant, record.at_ms)
            if victims:
                self.index.delete_ids(victims)
                _EVICTED.labels(expired="true").inc(expired)
                _EVICTED.labels(expired="false").inc(len(victims) - expired)
            return 1
        inv = Invalidation(record.tenant, record.model_revision, record.prompt_revision, record.data_version,
                           record.before_ms)
        self.invalidations.append(inv)  # also hides entries a lagging put would bring back
        if inv.tenant in tenants:
            tenants[inv.tenant].drop(inv)
        return self.index.delete(inv.conditions())

    def tenants(self) -> dict[str, TenantEntries]:
        """Per tenant, the entries the bound counts. Seeded from the index itself, oldest created first:
        a persistent index outlives the process, and compaction of `control` (keyed by tenant) drops
        the puts that wrote most of it, so a replay alone would leave those entries uncounted."""
        if self._tenants is None:
            self._tenants = {}
            rows = sorted(self.index.payloads(TRACKED_FIELDS), key=lambda r: (r[1].get("created_ms", 0), r[0]))
            for entry_id, fields in rows:
                self._tenants.setdefault(str(fields.get("tenant", "")), TenantEntries()).add(entry_id, fields)
        return self._tenants
