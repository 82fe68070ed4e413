"""postprocess: the answer. Takes the generated (or cached) text, un-masks it where the tenant's
policy allows, validates it against the JSON schema the caller asked for, writes cacheable misses back to the cache (a `control` record every cache worker
applies), and answers the caller; the runtime writes the finished-request row from the answer.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from pipeline.contracts import RequestDoc, Response, Status
from pipeline.contracts.response import Usage
from pipeline.engines.embedder import Embedder, ready_shared_embedder
from pipeline.runtime.stage import Outcome, SideRecord, StageContext, ThreadedStage
from pipeline.security.sealing import RestoreError, keyring_for, open_sealed, unmask
from pipeline.stages.cache.policy import CachePolicy
from pipeline.stages.cache.semantic import put_record
from pipeline.stages.postprocess.schema import schema_violation


class PostprocessPolicy(BaseModel):
    version: str = "postprocess-v1"
    unmask: bool = True
    tenant_unmask: dict[str, bool] = Field(default_factory=dict)
    cache: CachePolicy | None = Field(None, description="write-backs' boundaries and TTLs; None: the cache "
                                                        "stage's own policy from the topology (one source)")
    write_back: bool = True
    shadow_agree_min: float = Field(0.8, ge=0, le=1, description="a shadow hit whose cached answer is less "
                                                                 "similar than this to the generated one counts "
                                                                 "as a would-be false hit")

    def unmask_for(self, tenant: str | None) -> bool:
        return self.tenant_unmask.get(tenant or "", self.unmask)


class PostprocessStage(ThreadedStage):
    max_batch = 16
    max_wait_ms = 2
    policy_model = PostprocessPolicy

    def __init__(self, ctx: StageContext) -> None:
        super().__init__(ctx)
        self.keyring = keyring_for(ctx.settings)
        self.embedder: Embedder | None = None  # for write-backs; the index itself is the cache stage's
        cache_spec = next((s for s in ctx.settings.stages if s.name == "cache"), None)
        self.cache_policy = self.policy.cache or CachePolicy.model_validate(cache_spec.policy if cache_spec else {})

    async def start(self) -> None:
        if self.policy.write_back:
            self.embedder = await ready_shared_embedder()

    def decide(self, doc: RequestDoc) -> Outcome:
        cache, gen, route = doc.cache, doc.generation, doc.route
        if cache is not None and cache.decision == "hit" and cache.answer is not None:
            text, source = cache.answer, "cache"
        elif gen is not None:
            text, source = gen.text, "generation"
        else:
            resp = Response(request_id=doc.request_id, status=Status.error, error_class="no_answer",
                            reason="neither a cache hit nor a generation reached postprocess", answered_by=self.name)
            return Outcome.answer(doc, resp, self.evidence(doc, "error", "no_answer"))
        schema = doc.body.output_schema()
        if schema is not None:
            problem = schema_violation(text, schema)
            if problem is not None:  # no silent repair: the caller learns what is wrong
                resp = Response(request_id=doc.request_id, status=Status.error, error_class="schema_invalid",
                                reason=f"the answer does not satisfy the requested JSON schema: {problem}",
                                answered_by=self.name, deployment=gen.deployment if gen else None)
                return Outcome.answer(doc, resp, self.evidence(doc, "error", "schema_invalid"))
        side: list[SideRecord] = []
        if source == "generation" and self.embedder is not None and cache is not None and cache.decision == "miss" \
                and gen is not None and gen.finish_reason == "stop":
            put = put_record(doc, text, self.embedder, self.cache_policy)  # masked text: the cache never holds PII
            if put is not None:
                side.append(SideRecord("control", f"cache:{doc.tenant_id or ''}".encode(), put))
        unmasked = False
        samples = list(gen.samples) if gen is not None and source == "generation" else []
        token = doc.masking.restore_token if doc.masking else None
        if token and self.policy.unmask_for(doc.tenant_id):
            try:
                mapping = open_sealed(token, doc.request_id, self.keyring)
                text = unmask(text, mapping)
                samples = [x.model_copy(update={"text": unmask(x.text, mapping)}) for x in samples]
                unmasked = True
            except RestoreError:
                resp = Response(request_id=doc.request_id, status=Status.error, error_class="unmask_failed",
                                reason="the restore mapping does not open with this stack's keys",
                                answered_by=self.name)
                return Outcome.answer(doc, resp, self.evidence(doc, "error", "unmask_failed"))
        usage = Usage(prompt_tokens=gen.tokens_in if gen else 0, completion_tokens=gen.tokens_out if gen else 0)
        resp = Response(
            request_id=doc.request_id, status=Status.ok, text=text, answered_by=self.name,
            finish_reason=gen.finish_reason if gen and source == "generation" else "stop",
            route=route.decision if route else None, model=(gen.model if gen else (route.model if route else None)),
            deployment=gen.deployment if gen else None,
            token_ids=gen.token_ids if gen and source == "generation" and doc.body.logprobs else None,
            logprobs=gen.logprobs if gen and source == "generation" and doc.body.logprobs else None, cost_usd=gen.cost_usd if gen and source == "generation" else 0.0,
            adapter=gen.adapter if gen else None, placement=route.placement if route else None,
            cache=cache.decision if cache else None, usage=usage,
            ttft_ms=gen.ttft_ms if gen else None, tpot_ms=gen.tpot_ms if gen else None,
            actor_revision=gen.actor_revision or None if gen and source == "generation" else None, samples=samples)
        scores = {"unmasked": float(unmasked), "written_back": float(bool(side))}
        if cache is not None and cache.decision == "shadow_hit" and cache.answer is not None and gen is not None \
                and self.embedder is not None:  # would serving the cached answer have been right?
            a, b = self.embedder.embed([gen.text, cache.answer])
            agreement = float(a @ b)
            scores |= {"shadow_agreement": round(agreement, 4),
                       "shadow_false_hit": float(agreement < self.policy.shadow_agree_min)}
        ev = self.evidence(doc, "answered", f"from_{source}", scores=scores,
                           labels={"domain": cache.domain, "cache": cache.decision} if cache else {})
        out = Outcome.answer(doc, resp, ev)
        out.side = side
        return out
