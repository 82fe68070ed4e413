"""RL rollouts as plain functions: the seed of every sample, the actor revision a generation really
came from, and the `rollouts` rows (full provenance, score) plus the caller's summary of them."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import orjson

from pipeline.contracts import RequestDoc, Rollout
from pipeline.contracts.request import SampleSummary
from pipeline.engines.chat_engine import Generation, Sampling
from pipeline.engines.provenance import Provenance
from pipeline.stages.generate.rollouts.rewards import HookFailed, Sample, Scored, Scorer


def sample_seeds(doc: RequestDoc, sampling: Sampling, n: int) -> list[int]:
    """Sample i uses seed + i. Without a caller's seed, one is derived from the request id, so every
    sample is reproducible and its seed is on record."""
    base = sampling.seed if sampling.seed is not None else \
        int(hashlib.sha256(doc.request_id.encode()).hexdigest()[:8], 16) % 2**31
    return [base + i for i in range(n)]


def actor_revision_of(g: Generation) -> str:
    """The weights that produced `g`: the model revision, plus the LoRA adapter (name@revision) applied."""
    return g.model_revision if g.adapter is None else f"{g.model_revision}+{g.adapter}"


async def score_samples(scorer: Scorer, gens: list[Generation], timeout_s: float) -> list[Scored]:
    """Every sample scored in a thread, never on the event loop (a caller's pattern, an operator's
    hook), and all of it within `timeout_s`. Raises HookFailed: the request's answer. A hook that
    never returns keeps its thread; the request is answered all the same."""
    samples = [Sample(g.text, g.tokens_out, g.finish_reason) for g in gens]
    try:
        async with asyncio.timeout(timeout_s):
            return await asyncio.to_thread(scorer.score_all, samples)
    except TimeoutError:
        raise HookFailed("rollout_hook_timeout", f"scoring the samples took more than {timeout_s:g} s") from None


def rollout_rows(doc: RequestDoc, gens: list[Generation], seeds: list[int], sampling: Sampling, scorer: Scorer,
                 scores: list[Scored], prov: Provenance,
                 batch: dict[str, Any]) -> tuple[list[Rollout], list[SampleSummary]]:
    """A reward clipped into its declared range says so in the row's batch_context (`reward_clipped_from`)."""
    r = doc.rollout
    assert r is not None
    rows, summary = [], []
    for i, (g, seed, sc) in enumerate(zip(gens, seeds, scores, strict=True)):
        sample_id = f"{doc.request_id}:{i}"
        ok, score = sc.verified, sc.score
        flag = {} if sc.clipped_from is None else {"reward_clipped_from": sc.clipped_from}
        rows.append(Rollout(
            sample_id=sample_id, group_id=r.group_id, request_id=doc.request_id, tenant_id=doc.tenant_id or "",
            episode_id=doc.episode_id or "",
            prompt_dataset_revision=r.prompt_dataset_revision, actor_revision=actor_revision_of(g),
            reward_revision=scorer.reward.revision if scorer.reward else "",
            verifier_revision=scorer.verifier.revision if scorer.verifier else "",
            reference_revision=r.reference_revision, tokenizer_revision=prov.tokenizer_revision,
            chat_template_revision=prov.chat_template_revision, temperature=sampling.temperature,
            top_p=sampling.top_p, max_tokens=sampling.max_tokens, seed=seed, runtime=prov.runtime,
            hardware=prov.hardware, batch_context=orjson.dumps({**batch, "sample": i, **flag}).decode(),
            prompt_token_ids=g.prompt_token_ids, generated_token_ids=g.token_ids, logprobs=g.logprobs or [],
            finish_reason=g.finish_reason, score=score))
        summary.append(SampleSummary(sample_id=sample_id, text=g.text, tokens_out=g.tokens_out,
                                     finish_reason=g.finish_reason, verified=ok, score=score))
    return rows, summary
