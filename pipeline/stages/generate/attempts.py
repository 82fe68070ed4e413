"""One request's way through the deployments, as data: the plan (what it needs and where it may run),
each attempt's result, and the record of rows that ends in the answer or the failure.

generate/stage.py drives the loop (plan → attempt → record); nothing here calls an engine or Kafka.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from pipeline.config.settings import Deployment
from pipeline.contracts import Evidence, RequestDoc, Response, Usage
from pipeline.contracts.adapter import AdapterSpec
from pipeline.contracts.request import Choice, GenerationSection
from pipeline.engines.chat_engine import Generation, Sampling, as_chat, chat_prompt_len
from pipeline.engines.tool_prompt import ToolSpec, spec_for
from pipeline.registries.adapters import AdapterRegistry
from pipeline.runtime.stage import SideRecord
from pipeline.stages.generate.config import (
    GeneratePolicy,
)
from pipeline.stages.generate.deployments import Needs, candidates, estimated_cost
from pipeline.stages.generate.rollouts.hooks import scorer_for
from pipeline.stages.generate.rollouts.rewards import HookError, Scorer
from pipeline.stages.generate.rollouts.samples import actor_revision_of


def sampling_for(doc: RequestDoc, policy: GeneratePolicy) -> Sampling:
    b = doc.body
    return Sampling(max_tokens=min(b.max_tokens or policy.default_max_tokens, policy.max_tokens_cap),
                    temperature=b.temperature if b.temperature is not None else 0.0,
                    top_p=b.top_p if b.top_p is not None else 1.0, seed=b.seed,
                    logprobs=b.logprobs or doc.rollout is not None,  # a rollout without logprobs trains nothing
                    top_logprobs=b.top_logprobs if b.logprobs else 0,
                    json_schema=b.output_schema(), tools=tool_spec(doc), stop=tuple(b.stop),
                    presence_penalty=b.presence_penalty or 0.0, frequency_penalty=b.frequency_penalty or 0.0,
                    logit_bias=b.logit_bias)


def tool_spec(doc: RequestDoc) -> ToolSpec | None:
    """The tools the engine offers the model: the caller's, narrowed by route when it narrowed them."""
    return spec_for(doc.body, doc.route.tools_kept if doc.route is not None else None)


def side_effecting(doc: RequestDoc, policy: GeneratePolicy) -> bool:
    """Declared by the caller, or a tool the policy marks as acting on the world may be called."""
    if doc.context.tool_side_effects:
        return True
    if doc.body.tool_choice == "none" or not policy.side_effect_tools:
        return False
    return any(fnmatchcase(t.function.name, p) for t in doc.body.tools for p in policy.side_effect_tools)


def needs_for(doc: RequestDoc, prompt_tokens: int, sampling: Sampling, adapter: AdapterSpec | None = None) -> Needs:
    c = doc.context
    return Needs(context_tokens=prompt_tokens, expected_output_tokens=sampling.max_tokens,
                 adapter_of=None if adapter is None else adapter.base_model,
                 # described by vision, the images reach a text-only model as text
                 images=bool(doc.body.images) and not (doc.vision and doc.vision.description),
                 json_schema=sampling.json_schema is not None,
                 tools=sampling.tools is not None and sampling.tools.active(),
                 regions=frozenset(c.residency) if c.residency is not None else None, max_cost_usd=c.max_cost_usd)


def where_to_run(doc: RequestDoc, policy: GeneratePolicy) -> tuple[list[str], bool]:
    """The deployments in preference order, and whether only those may serve it: admit counted the
    request against its deployments' limits, route named them; otherwise the policy's order."""
    if doc.admission and doc.admission.deployments:
        return list(doc.admission.deployments), True
    if doc.route and doc.route.deployments:
        return list(doc.route.deployments), True
    return list(policy.prefer), False


@dataclass(frozen=True)
class Plan:
    """What one request needs and where it may run, computed once before any attempt."""

    messages: list[dict[str, str]]
    sampling: Sampling
    n: int  # samples: a rollout's n, else 1
    spec: AdapterSpec | None  # the adapter (or actor revision) every attempt applies
    scorer: Scorer | None
    prompt_tokens: int
    needs: Needs
    deployments: list[Deployment]  # compatible, in order
    refused: dict[str, str]  # deployment -> why it cannot serve this request

    @property
    def lane(self) -> str:
        """The fair gate's lane: the adapter's name, "" for the base model."""
        return "" if self.spec is None else self.spec.name

    @property
    def engine_tokens(self) -> int:
        """A rollout's n samples enter the engine together: one slot, n times the tokens."""
        return self.n * (self.prompt_tokens + self.sampling.max_tokens)


class PlanError(ValueError):
    """The request cannot be planned: `error_class` is its answer's."""

    def __init__(self, error_class: str, reason: str) -> None:
        super().__init__(reason)
        self.error_class = error_class


def plan_for(doc: RequestDoc, policy: GeneratePolicy, tokenizer, deployments: list[Deployment],
             adapters: AdapterRegistry, actor: AdapterSpec | None) -> Plan:
    """Raises PlanError for a rollout naming a hook or an argument the policy does not allow."""
    sampling = sampling_for(doc, policy)
    scorer: Scorer | None = None
    if doc.rollout is not None:
        try:
            scorer = scorer_for(doc.rollout.verifier, doc.rollout.reward, policy.rollout_hooks)
        except HookError as exc:
            raise PlanError("invalid_request", str(exc)) from None
    spec = actor or (adapters.specs.get(doc.route.adapter) if doc.route and doc.route.adapter else None)
    messages = as_chat(doc.body.messages, doc.route.system_prompt if doc.route else None)
    prompt_tokens = chat_prompt_len(tokenizer, messages)  # the length only: a third of the ids' cost
    needs = needs_for(doc, prompt_tokens, sampling, spec)
    preferred, strict = where_to_run(doc, policy)
    ok, refused = candidates(deployments, preferred, needs, only_preferred=strict)
    return Plan(messages=messages, sampling=sampling, n=doc.rollout.n if doc.rollout is not None else doc.body.n,
                spec=spec,
                scorer=scorer, prompt_tokens=prompt_tokens, needs=needs, deployments=ok, refused=refused)


@dataclass
class Attempts:
    """What happened to one request so far: evidence rows in order, failures, added latency."""

    doc: RequestDoc
    rows: list[Evidence] = field(default_factory=list)
    side: list[SideRecord] = field(default_factory=list)  # weight_events of adapter moves it caused
    failures: list[str] = field(default_factory=list)  # "deployment:error_class"
    tried: list[str] = field(default_factory=list)
    wrong_actor: list[str] = field(default_factory=list)  # deployments refused: another actor revision
    started: float = field(default_factory=time.perf_counter)
    prompt_tokens: int = 0  # once planned
    tokens_used: int = 0  # generated by every attempt so far, finished or not (a cancel is settled with it)
    attempt_ids: list[str] = field(default_factory=list)  # the engine attempts, as deltas name them


@dataclass(frozen=True)
class Attempted:
    """One successful attempt: the generations and what it waited for before the engine saw it."""

    gens: list[Generation]
    t0: float  # perf_counter when the attempt began
    ms: float  # the attempt, gate wait and adapter load included
    waited_ms: float  # in the fair gate, behind other adapters' work
    load_ms: float  # a cold adapter's load
    adapter_before: str  # the adapter's residency when the attempt found it ("" for the base model)
    in_flight: int  # how busy the gate was when the attempt started (a rollout's batch context)


def section_from(gens: list[Generation], d: Deployment, *, attempts: int, fallback_from: list[str],
                 adapter: str | None = None, rollout: bool = False) -> GenerationSection:
    """The first generation is the answer, the others its choices (a rollout's samples are summarised
    apart); tokens and cost count every generation."""
    g = gens[0]
    tokens_in, tokens_out = sum(x.tokens_in for x in gens), sum(x.tokens_out for x in gens)
    cost = (tokens_in * d.cost_per_1k_input + tokens_out * d.cost_per_1k_output) / 1000
    return GenerationSection(
        deployment=d.name, model=d.model, model_revision=g.model_revision, text=g.text, tool_calls=g.tool_calls,
        prompt_token_ids=g.prompt_token_ids, token_ids=g.token_ids, logprobs=g.logprobs,
        top_logprobs=g.top_logprobs,
        finish_reason=g.finish_reason, tokens_in=tokens_in, tokens_out=tokens_out,
        ttft_ms=round(g.ttft_ms, 2), tpot_ms=None if g.tpot_ms is None else round(g.tpot_ms, 2),
        itl_p50_ms=round(statistics.median(g.itl_ms), 2) if g.itl_ms else None,
        itl_max_ms=round(max(g.itl_ms), 2) if g.itl_ms else None,
        engine_queue_ms=None if g.engine_queue_ms is None else round(g.engine_queue_ms, 2),
        attempts=attempts, fallback_from=fallback_from, cost_usd=round(cost, 8), adapter=adapter,
        actor_revision=actor_revision_of(g),
        choices=[Choice(index=i, text=x.text, tool_calls=x.tool_calls, finish_reason=x.finish_reason)
                 for i, x in enumerate(gens[1:], start=1)] if not rollout else [])


def billed(resp: Response, gens: list[Generation], d: Deployment) -> Response:
    """An error answer after the engine ran (a rollout whose scoring failed) still carries what the
    samples cost: admit settles the tenant's hold with it, so a failing hook is no free generation."""
    sec = section_from(gens, d, attempts=1, fallback_from=[])
    return resp.model_copy(update={"deployment": d.name, "cost_usd": sec.cost_usd,
                                   "usage": Usage(prompt_tokens=sec.tokens_in, completion_tokens=sec.tokens_out)})


def generated_scores(sec: GenerationSection, plan: Plan, d: Deployment, done: Attempted, attempt: int,
                     added_ms: float) -> dict[str, float]:
    """The `generate` row's numbers for an answer."""
    return {"tokens_in": float(sec.tokens_in), "tokens_out": float(sec.tokens_out), "ttft_ms": sec.ttft_ms,
            "attempts": float(attempt), "added_latency_ms": round(added_ms, 2), "cost_usd": sec.cost_usd,
            "estimated_cost_usd": estimated_cost(d, plan.needs),
            **({"tpot_ms": sec.tpot_ms} if sec.tpot_ms else {}),
            **({"engine_queue_ms": sec.engine_queue_ms} if sec.engine_queue_ms is not None else {}),
            # time in the fair gate behind other adapters' work, and a cold adapter's load: both
            # before the engine saw the request
            "gate_wait_ms": round(done.waited_ms, 2), "adapter_load_ms": round(done.load_ms, 2)}


def generated_labels(doc: RequestDoc, sec: GenerationSection, plan: Plan, done: Attempted) -> dict[str, str]:
    return {"adapter_requested": (doc.route.adapter if doc.route else None) or "",
            "adapter_applied": sec.adapter or "",
            **({"adapter_state": done.adapter_before} if plan.spec is not None else {})}
