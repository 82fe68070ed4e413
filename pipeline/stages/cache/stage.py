"""cache: serve an earlier answer only when meaning AND boundaries match.

Per micro-batch: one embedding call, then per request a filtered search (tenant, ACL scope,
model and prompt revision, data version, locale, embedding revision, domain, unexpired), the
domain's threshold and the verification gate. A hit skips to postprocess (or answers directly
while postprocess is not in the topology); shadow mode records the would-be hit and serves
nothing. Write-backs and invalidations arrive on `control`, which every cache worker follows.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from pipeline.contracts import RequestDoc, Response, Status
from pipeline.engines.embedder import ready_shared_embedder
from pipeline.engines.text_analyzer import shared_analyzer
from pipeline.runtime.stage import Outcome, Stage, StageContext
from pipeline.security.sealing import keyring_for
from pipeline.stages.cache.config import CachePolicy
from pipeline.stages.cache.semantic import KEYWORD_FIELDS, NUMERIC_FIELDS, Lookup, SemanticCache
from pipeline.stages.catalog import PRODUCT_STAGES
from pipeline.stores.index_spec import open_index


def index_spec(ctx: StageContext) -> str:
    return ctx.settings.vector_index or f"edge:{ctx.settings.resolved_data_dir() / 'cache-index' / 'edge'}"


class CacheStage(Stage):
    max_batch = 16
    max_wait_ms = 3
    policy_model = CachePolicy

    def __init__(self, ctx: StageContext) -> None:
        super().__init__(ctx)
        self.cache: SemanticCache | None = None
        self.topology_names = [s.name for s in ctx.settings.stages] or list(PRODUCT_STAGES)

    async def start(self) -> None:
        embedder = await ready_shared_embedder(self.ctx.settings.resolved_data_dir() / "models")
        spec = index_spec(self.ctx)
        if spec.startswith("edge:"):
            Path(spec[5:]).mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - once, at start
        key = self.ctx.settings.qdrant_api_key
        index = await asyncio.to_thread(open_index, spec, embedder.dim, KEYWORD_FIELDS, NUMERIC_FIELDS,
                                        key.get_secret_value() if key else None)
        analyzer = await asyncio.to_thread(shared_analyzer)  # Kiwi + spaCy + wordfreq: 3-9 s
        await asyncio.to_thread(analyzer.analyze, "warm up 준비")
        self.cache = SemanticCache(index, embedder, self.policy, keyring_for(self.ctx.settings), analyzer)
        await self.follow_control(self.cache.apply)  # the whole changelog, before answering anyone

    async def stop(self) -> None:
        await self.stop_following()
        if self.cache is not None:
            self.cache.index.close()

    def outcome(self, doc: RequestDoc, lookup: Lookup) -> Outcome:
        sec = lookup.section
        doc = doc.model_copy(update={"cache": sec})
        ev = self.evidence(doc, sec.decision, sec.reason, candidates=lookup.candidates,
                           scores={k: v for k, v in {"similarity": sec.similarity, "threshold": sec.threshold}.items()
                                   if v is not None} | {f"gate.{k}": float(v) for k, v in sec.gate.items()},
                           revisions={"embedding": sec.embedding_revision or "",
                                      "gate_analyzer": self.cache.analyzer.revision if self.cache else ""},
                           labels={"domain": sec.domain, "mode": sec.mode})
        if sec.decision == "hit":
            if "postprocess" in self.topology_names:
                return Outcome.forward(doc, ev, to="postprocess")
            resp = Response(request_id=doc.request_id, status=Status.ok, text=sec.answer, answered_by=self.name,
                            cache="hit")
            return Outcome.answer(doc, resp, ev)
        return Outcome.forward(doc, ev)

    async def process_batch(self, docs: list[RequestDoc]) -> list[Outcome | BaseException]:
        assert self.cache is not None, "start() first"
        lookups = await asyncio.to_thread(self.cache.lookup_many, docs)
        return [self.outcome(d, lk) for d, lk in zip(docs, lookups)]
