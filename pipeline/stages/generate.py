"""generate: the model call. Every record of a micro-batch is submitted to the engine at once, and
several processors run side by side, so vLLM's continuous batching is fed (never one at a time).

This first version serves the in-process vLLM deployment; retries, fallbacks across deployments
and circuit breaking follow (issue: generate and postprocess).
"""

from __future__ import annotations

import asyncio
import statistics
from pathlib import Path

from pydantic import BaseModel, Field

from pipeline.contracts import RequestDoc
from pipeline.contracts.request import GenerationSection
from pipeline.engines.model_prep import prepare
from pipeline.engines.vllm_engine import Generation, Sampling, VllmEngine
from pipeline.runtime.errors import PermanentError
from pipeline.runtime.stage import Outcome, Stage, StageContext


class GeneratePolicy(BaseModel):
    version: str = "generate-v1"
    deployment: str = "local-vllm"
    model: str = "smollm2-135m-instruct"
    default_max_tokens: int = Field(128, ge=1)
    max_tokens_cap: int = Field(512, ge=1)


def sampling_for(doc: RequestDoc, policy: GeneratePolicy) -> Sampling:
    b = doc.body
    return Sampling(max_tokens=min(b.max_tokens or policy.default_max_tokens, policy.max_tokens_cap),
                    temperature=b.temperature if b.temperature is not None else 0.0,
                    top_p=b.top_p if b.top_p is not None else 1.0, seed=b.seed, logprobs=b.logprobs)


def section_from(g: Generation, policy: GeneratePolicy) -> GenerationSection:
    return GenerationSection(
        deployment=policy.deployment, model=policy.model, model_revision=g.model_revision, text=g.text,
        prompt_token_ids=g.prompt_token_ids, token_ids=g.token_ids, logprobs=g.logprobs,
        finish_reason=g.finish_reason, tokens_in=len(g.prompt_token_ids), tokens_out=len(g.token_ids),
        ttft_ms=round(g.ttft_ms, 2), tpot_ms=None if g.tpot_ms is None else round(g.tpot_ms, 2),
        itl_p50_ms=round(statistics.median(g.itl_ms), 2) if g.itl_ms else None,
        itl_max_ms=round(max(g.itl_ms), 2) if g.itl_ms else None)


class GenerateStage(Stage):
    max_batch = 16
    max_wait_ms = 5
    policy_model = GeneratePolicy

    def __init__(self, ctx: StageContext) -> None:
        super().__init__(ctx)
        self.engine: VllmEngine | None = None

    async def start(self) -> None:
        s = self.ctx.settings
        data_dir = s.resolved_data_dir()
        if s.engine.model_dir is not None:
            model_dir, revision = Path(s.engine.model_dir), f"{self.policy.model}@{Path(s.engine.model_dir).name}"
        else:
            info = await asyncio.to_thread(prepare, data_dir, s.engine.dtype)
            model_dir, revision = Path(info.path), info.revision
        self.engine = await VllmEngine(model_dir, revision=revision, cache_dir=data_dir / "cache", dtype=s.engine.dtype,
                                       max_model_len=s.engine.max_model_len,
                                       max_num_seqs=s.engine.max_num_seqs).start()

    async def stop(self) -> None:
        if self.engine is not None:
            await self.engine.stop()

    async def _one(self, doc: RequestDoc) -> Outcome:
        assert self.engine is not None, "start() first"
        messages = [{"role": m.role, "content": m.content} for m in doc.body.messages]
        if len(self.engine.prompt_ids(messages)) >= self.ctx.settings.engine.max_model_len:
            raise PermanentError("prompt longer than the model's context", error_class="context_too_long")
        g = await self.engine.generate(messages, sampling_for(doc, self.policy), request_id=doc.request_id)
        sec = section_from(g, self.policy)
        doc = doc.model_copy(update={"generation": sec})
        ev = self.evidence(doc, "generated", sec.finish_reason,
                           scores={"tokens_in": float(sec.tokens_in), "tokens_out": float(sec.tokens_out),
                                   "ttft_ms": sec.ttft_ms, **({"tpot_ms": sec.tpot_ms} if sec.tpot_ms else {})},
                           candidates=[self.policy.deployment], revisions={"model": sec.model_revision})
        return Outcome.forward(doc, ev)

    async def process_batch(self, docs: list[RequestDoc]) -> list[Outcome | BaseException]:
        return list(await asyncio.gather(*(self._one(d) for d in docs), return_exceptions=True))
