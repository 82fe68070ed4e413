"""postprocess: the answer. Takes the generated (or cached) text, un-masks it where the tenant's policy
allows, validates it against the JSON schema the caller asked for, writes cacheable misses back to
the cache (a `control` record every cache worker applies), and answers the caller; the runtime
writes the finished-request row from the answer.
"""

from __future__ import annotations

from pipeline.contracts import RequestDoc, Response, Status
from pipeline.contracts.request import ToolCall
from pipeline.contracts.response import Usage
from pipeline.engines.embedder import Embedder, ready_shared_embedder
from pipeline.engines.tool_prompt import ToolCallInvalid, ToolSpec, check_calls, spec_for
from pipeline.runtime.stage import Outcome, SideRecord, StageContext, ThreadedStage
from pipeline.security.sealing import RestoreError, keyring_for, open_sealed, unmask
from pipeline.stages.cache.config import CachePolicy
from pipeline.stages.cache.semantic import put_record
from pipeline.stages.postprocess.config import PostprocessPolicy
from pipeline.stages.postprocess.schema import schema_violation


def unmasked_calls(calls: list[ToolCall] | None, mapping: dict) -> list[ToolCall]:
    return [c.model_copy(update={"function": c.function.model_copy(update={"arguments": unmask(c.function.arguments,
                                                                                               mapping)})})
            for c in calls or ()]


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
            self.embedder = await ready_shared_embedder(self.ctx.settings.resolved_data_dir() / "models")

    def decide(self, doc: RequestDoc) -> Outcome:
        """1. the answer's text (a cache hit or the generation); 2. the caller's schema, never repaired;
        3. a generated answer that finished cleanly goes back to the cache (masked); 4. un-mask where
        the tenant allows it; 5. the terminal answer and its evidence (with a shadow hit's verdict)."""
        cache, gen = doc.cache, doc.generation
        if cache is not None and cache.decision == "hit" and cache.answer is not None:
            text, source = cache.answer, "cache"
        elif gen is not None:
            text, source = gen.text, "generation"
        else:
            return self._error(doc, "no_answer", "neither a cache hit nor a generation reached postprocess")
        generated = gen if gen is not None and source == "generation" else None
        calls = list(generated.tool_calls or []) if generated is not None else []
        choices = list(generated.choices) if generated is not None else []
        answers = [(0, text, calls), *((c.index, c.text, list(c.tool_calls or [])) for c in choices)]
        for index, answer, its_calls in answers:  # each choice, never repaired: the caller learns what is wrong
            refused = self._refusal(doc, answer, its_calls, index if len(answers) > 1 else None)
            if refused is not None:
                return self._error(doc, *refused, deployment=gen.deployment if gen else None)
        side = self._write_back(doc, text) if source == "generation" else []
        samples = list(gen.samples) if gen is not None and source == "generation" else []
        unmasked = False
        token = doc.masking.restore_token if doc.masking else None
        if token and self.policy.unmask_for(doc.tenant_id):
            try:
                mapping = open_sealed(token, doc.request_id, self.keyring)
            except RestoreError:
                return self._error(doc, "unmask_failed", "the restore mapping does not open with this stack's keys")
            text, calls = unmask(text, mapping), unmasked_calls(calls, mapping)
            choices = [c.model_copy(update={"text": unmask(c.text, mapping),
                                            "tool_calls": unmasked_calls(c.tool_calls, mapping) or None})
                       for c in choices]
            samples = [x.model_copy(update={"text": unmask(x.text, mapping)}) for x in samples]
            unmasked = True
        scores = {"unmasked": float(unmasked), "written_back": float(bool(side))} | self._shadow_verdict(doc)
        ev = self.evidence(doc, "answered", f"from_{source}", scores=scores,
                           labels={"domain": cache.domain, "cache": cache.decision} if cache else {})
        resp = self._response(doc, text, source, samples)
        if calls or choices:
            resp = resp.model_copy(update={"tool_calls": calls or None, "choices": choices,
                                           **({"finish_reason": "tool_calls"} if calls else {})})
        out = Outcome.answer(doc, resp, ev)
        out.side = side
        return out

    def _refusal(self, doc: RequestDoc, text: str, calls: list, index: int | None) -> tuple[str, str] | None:
        """Why this answer (choice `index` of several) may not leave: a tool call that is not one of the
        offered tools' (the engine checked too: this is the last word), or text outside the schema."""
        which = f"choice {index}: " if index is not None else ""
        if calls:
            try:
                check_calls([c.model_dump(mode="json") for c in calls],
                            spec_for(doc.body, doc.route.tools_kept if doc.route else None) or ToolSpec(()))
            except ToolCallInvalid as exc:
                return "tool_call_refused", f"{which}{exc}"
            return None
        schema = doc.body.output_schema()
        problem = schema_violation(text, schema) if schema is not None else None
        if problem is not None:
            return "schema_invalid", f"{which}the answer does not satisfy the requested JSON schema: {problem}"
        return None

    def _error(self, doc: RequestDoc, error_class: str, reason: str, deployment: str | None = None) -> Outcome:
        resp = Response(request_id=doc.request_id, status=Status.error, error_class=error_class, reason=reason,
                        answered_by=self.name, deployment=deployment)
        return Outcome.answer(doc, resp, self.evidence(doc, "error", error_class))

    def _write_back(self, doc: RequestDoc, text: str) -> list[SideRecord]:
        """A cache miss whose generation stopped on its own is written back (masked text: the cache
        never holds PII), as a side record committed with the answer. An answer made under an
        experiment variant is not: served from the cache it would reach the other variants' units."""
        cache, gen = doc.cache, doc.generation
        if self.embedder is None or cache is None or cache.decision != "miss" or gen is None \
                or gen.finish_reason != "stop" or (doc.route is not None and doc.route.experiment):
            return []
        put = put_record(doc, text, self.embedder, self.cache_policy, self.keyring)
        return [] if put is None else [SideRecord("control", f"cache:{doc.tenant_id or ''}".encode(), put)]

    def _response(self, doc: RequestDoc, text: str, source: str, samples: list) -> Response:
        cache, route = doc.cache, doc.route
        gen = doc.generation
        generated = gen if gen is not None and source == "generation" else None
        want_logprobs = generated is not None and bool(doc.body.logprobs)
        return Response(
            request_id=doc.request_id, status=Status.ok, text=text, answered_by=self.name,
            finish_reason=generated.finish_reason if generated else "stop",
            route=route.decision if route else None, model=(gen.model if gen else (route.model if route else None)),
            deployment=gen.deployment if gen else None,
            token_ids=generated.token_ids if want_logprobs else None,  # type: ignore[union-attr]
            prompt_token_ids=generated.prompt_token_ids if want_logprobs else None,  # type: ignore[union-attr]
            logprobs=generated.logprobs if want_logprobs else None,  # type: ignore[union-attr]
            top_logprobs=generated.top_logprobs if want_logprobs else None,  # type: ignore[union-attr]
            cost_usd=generated.cost_usd if generated else 0.0,
            adapter=gen.adapter if gen else None, placement=route.placement if route else None,
            cache=cache.decision if cache else None,
            usage=Usage(prompt_tokens=gen.tokens_in if gen else 0, completion_tokens=gen.tokens_out if gen else 0),
            ttft_ms=gen.ttft_ms if gen else None, tpot_ms=gen.tpot_ms if gen else None,
            actor_revision=(generated.actor_revision or None) if generated else None, samples=samples)

    def _shadow_verdict(self, doc: RequestDoc) -> dict[str, float]:
        """A shadow hit: would serving the cached answer have been right? (agreement with the generation)"""
        cache, gen = doc.cache, doc.generation
        if cache is None or cache.decision != "shadow_hit" or cache.answer is None or gen is None \
                or self.embedder is None:
            return {}
        a, b = self.embedder.embed([gen.text, cache.answer])
        agreement = float(a @ b)
        return {"shadow_agreement": round(agreement, 4),
                "shadow_false_hit": float(agreement < self.policy.shadow_agree_min)}
