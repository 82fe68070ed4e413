"""generate: the model call, across deployments.

Every record of a micro-batch is submitted at once and several processors run side by side, so
vLLM's continuous batching is fed (never one request at a time). Per request: the deployments that
can serve it (route's preference first; incompatible ones refused with their reason), then
attempts under the deadline budget: a retryable failure retries after a jittered backoff or falls
back to the next deployment, a per-deployment circuit breaker skips a deployment that keeps
failing, and its state changes go on `control`, which every generate worker follows. Each attempt
is an evidence row (`generate.attempt`, step 1, 2, ...); the final decision is the `generate` row.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

from pydantic import BaseModel, Field

from pipeline.config.settings import Deployment
from pipeline.contracts import BreakerUpdate, Evidence, RequestDoc, Response, Status, WeightEvent
from pipeline.contracts.adapter import AdapterSpec
from pipeline.contracts.base import now_ms
from pipeline.contracts.control import AdapterStateChanged
from pipeline.contracts.request import GenerationSection
from pipeline.engines.chat_engine import ChatEngine, EngineError, Generation, Sampling, chat_prompt_ids
from pipeline.engines.model_prep import resolve
from pipeline.engines.provenance import Provenance, provenance_for
from pipeline.engines.tokenizer import load_chat_tokenizer
from pipeline.registries.adapters import AdapterRegistry, refuse_adapter
from pipeline.runtime.stage import Outcome, SideRecord, Stage, StageContext
from pipeline.runtime.topics import TopicNames
from pipeline.stages.generate.actor import ActorReplica
from pipeline.stages.generate.deployments import (
    RETRYABLE,
    Breaker,
    BreakerPolicy,
    Needs,
    RetryPolicy,
    breaker_allows,
    breaker_record,
    candidates,
    estimated_cost,
    next_step,
)
from pipeline.stages.generate.fair_gate import FairGate
from pipeline.stages.generate.lora.host import AdapterHost
from pipeline.stages.generate.lora.refusal import adapter_refusal
from pipeline.stages.generate.rollouts.rewards import HookError, Scorer, scorer_for
from pipeline.stages.generate.rollouts.samples import actor_revision_of, rollout_rows, sample_seeds

log = logging.getLogger(__name__)
NO_DEADLINE_MS = 10**9


class GeneratePolicy(BaseModel):
    version: str = "generate-v2"
    default_max_tokens: int = Field(128, ge=1)
    max_tokens_cap: int = Field(512, ge=1)
    prefer: list[str] = Field(default_factory=list, description="deployment order when route names none")
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    breaker: BreakerPolicy = Field(default_factory=BreakerPolicy)
    adapter_token_budget: int = Field(2048, ge=1, description="tokens (prompt + max_tokens) one adapter may have "
                                                              "in the engine while another adapter's requests wait")
    adapter_reserve_slots: int = Field(2, ge=0, description="LoRA engines: slots kept for an adapter with nothing "
                                                            "running, so a burst cannot take them all")


def sampling_for(doc: RequestDoc, policy: GeneratePolicy) -> Sampling:
    b = doc.body
    return Sampling(max_tokens=min(b.max_tokens or policy.default_max_tokens, policy.max_tokens_cap),
                    temperature=b.temperature if b.temperature is not None else 0.0,
                    top_p=b.top_p if b.top_p is not None else 1.0, seed=b.seed,
                    logprobs=b.logprobs or doc.rollout is not None,  # a rollout without logprobs trains nothing
                    json_schema=b.output_schema())


def needs_for(doc: RequestDoc, prompt_tokens: int, sampling: Sampling, adapter: AdapterSpec | None = None) -> Needs:
    c = doc.context
    return Needs(context_tokens=prompt_tokens, expected_output_tokens=sampling.max_tokens,
                 adapter_of=None if adapter is None else adapter.base_model,
                 # described by vision, the images reach a text-only model as text
                 images=bool(doc.body.images) and not (doc.vision and doc.vision.description),
                 json_schema=sampling.json_schema is not None,
                 regions=frozenset(c.residency) if c.residency is not None else None, max_cost_usd=c.max_cost_usd)


def section_from(gens: list[Generation], d: Deployment, *, attempts: int, fallback_from: list[str],
                 adapter: str | None = None) -> GenerationSection:
    """The first generation is the answer; tokens and cost count every sample (a rollout's n)."""
    g = gens[0]
    tokens_in, tokens_out = sum(len(x.prompt_token_ids) for x in gens), sum(len(x.token_ids) for x in gens)
    cost = (tokens_in * d.cost_per_1k_input + tokens_out * d.cost_per_1k_output) / 1000
    return GenerationSection(
        deployment=d.name, model=d.model, model_revision=g.model_revision, text=g.text,
        prompt_token_ids=g.prompt_token_ids, token_ids=g.token_ids, logprobs=g.logprobs,
        finish_reason=g.finish_reason, tokens_in=tokens_in, tokens_out=tokens_out,
        ttft_ms=round(g.ttft_ms, 2), tpot_ms=None if g.tpot_ms is None else round(g.tpot_ms, 2),
        itl_p50_ms=round(statistics.median(g.itl_ms), 2) if g.itl_ms else None,
        itl_max_ms=round(max(g.itl_ms), 2) if g.itl_ms else None,
        engine_queue_ms=None if g.engine_queue_ms is None else round(g.engine_queue_ms, 2),
        attempts=attempts, fallback_from=fallback_from, cost_usd=round(cost, 8), adapter=adapter,
        actor_revision=actor_revision_of(g))


def build_engine(d: Deployment, *, default_model_dir: Path, default_revision: str, ctx: StageContext,
                 attempt_timeout_s: float) -> ChatEngine:
    if d.engine == "openai":
        from pipeline.engines.openai_engine import OpenAIEngine

        return OpenAIEngine(d.base_url or "", d.model, revision=d.revision, api_key_env=d.api_key_env,
                            read_timeout_s=attempt_timeout_s)
    from pipeline.engines.vllm_engine import VllmEngine

    s = ctx.settings
    model_dir, revision = (default_model_dir, default_revision) if d.model_dir is None else \
        resolve(s.resolved_data_dir(), d.model_dir, s.engine.dtype)
    revision = d.revision or revision
    return VllmEngine(model_dir, revision=revision, cache_dir=s.resolved_data_dir() / "cache", dtype=s.engine.dtype,
                      max_model_len=min(d.max_context, s.engine.max_model_len), max_num_seqs=s.engine.max_num_seqs,
                      lora=s.lora if d.lora else None, adapters_dir=s.resolved_data_dir() / "adapters")


def gate_for(d: Deployment, ctx: StageContext, policy: GeneratePolicy) -> FairGate:
    """A LoRA deployment admits no more than the engine batches at once, so the gate (not vLLM's
    arrival-order queue) decides which adapter runs next."""
    if not d.lora:
        return FairGate(d.concurrency, policy.adapter_token_budget)
    capacity = min(d.concurrency, ctx.settings.engine.max_num_seqs)
    return FairGate(capacity, policy.adapter_token_budget, reserve=min(policy.adapter_reserve_slots, capacity - 1))


@dataclass
class _Attempts:
    """What happened to one request so far: evidence rows in order, failures, added latency."""

    doc: RequestDoc
    rows: list[Evidence] = field(default_factory=list)
    side: list[SideRecord] = field(default_factory=list)  # weight_events of adapter moves it caused
    failures: list[str] = field(default_factory=list)  # "deployment:error_class"
    tried: list[str] = field(default_factory=list)
    wrong_actor: list[str] = field(default_factory=list)  # deployments refused: another actor revision
    started: float = field(default_factory=time.perf_counter)


class GenerateStage(Stage):
    max_batch = 16
    max_wait_ms = 5
    policy_model = GeneratePolicy

    def __init__(self, ctx: StageContext) -> None:
        super().__init__(ctx)
        self.deployments: list[Deployment] = list(ctx.settings.deployments)
        self.engines: dict[str, ChatEngine] = {}
        self.gates: dict[str, FairGate] = {d.name: gate_for(d, ctx, self.policy) for d in self.deployments}
        self.breakers: dict[str, Breaker] = {d.name: Breaker() for d in self.deployments}
        self.adapters = AdapterRegistry(ctx.settings.adapters)
        self.tokenizer = None
        self.provenance: dict[str, Provenance] = {}
        self.member = f"{ctx.settings.worker_id or 'generate'}:{uuid.uuid4().hex[:8]}"
        self.actor = ActorReplica(self.member, self._publish_actor_report)
        self.host = AdapterHost(self.member, self.deployments, self.engines, ctx.settings.lora, self.adapters,
                                self._publish_control, self._publish_weight_event,
                                snapshots=ctx.settings.resolved_data_dir() / "adapters" / "verified")

    async def start(self) -> None:
        s = self.ctx.settings
        path, revision = await asyncio.to_thread(resolve, s.resolved_data_dir(), s.engine.model_dir, s.engine.dtype)
        # counts prompt tokens for the compatibility check, whichever deployment serves the request
        self.tokenizer = await asyncio.to_thread(load_chat_tokenizer, s)
        timeout_s = self.policy.retry.attempt_timeout_ms / 1000
        for d in self.deployments:
            engine = build_engine(d, default_model_dir=path, default_revision=revision, ctx=self.ctx,
                                  attempt_timeout_s=timeout_s)
            self.engines[d.name] = await engine.start()
            self.provenance[d.name] = provenance_for(getattr(engine, "model_dir", None),
                                                     getattr(engine, "tokenizer", None) or self.tokenizer,
                                                     dtype=getattr(engine, "dtype", ""))
        self.host.started()
        actor_home = next((d for d in self.deployments if d.lora and s.lora.enabled), None)
        if actor_home is not None:  # the RL actor's weights are a LoRA adapter: served where adapters are
            self.actor.attach(self._actor_loader(actor_home),
                              lambda msgs, sampling, spec: self.engines[actor_home.name].generate(
                                  msgs, sampling, None, adapter=spec))
        await self.follow_control(self.apply_control)

    async def stop(self) -> None:
        await self.actor.drain_tasks()
        await self.host.drain()
        await self.stop_following()
        for engine in self.engines.values():
            await engine.stop()

    # ---- circuit breakers, shared through control ----------------------------------------------

    def apply_control(self, record: object) -> None:
        """Adopt a `control` record: an adapter registry change (promote/demote also move the adapter
        in the engines), the actor lifecycle, or another worker's breaker change. Its half-open
        probe counts as open here: this worker waits out a cooldown of its own rather than probing
        at the same time."""
        if self.adapters.apply(record):
            if isinstance(record, AdapterStateChanged):
                self.host.state_changed(record)
            return
        if self.actor.apply(record):
            return
        if not isinstance(record, BreakerUpdate) or record.worker == self.member or record.deployment not in self.breakers:
            return
        if record.state == "closed":
            self.breakers[record.deployment] = Breaker()
        else:
            opened = record.opened_ms if record.state == "open" else record.at_ms
            self.breakers[record.deployment] = Breaker(state="open", opened_ms=opened)

    async def _breaker_changed(self, name: str, before: Breaker, after: Breaker, reason: str) -> None:
        if before.state == after.state or self.follower is None:
            return
        try:
            await self.follower.publish(BreakerUpdate(deployment=name, state=after.state, opened_ms=after.opened_ms,
                                                      worker=self.member, reason=reason),
                                        key=f"breaker:{name}".encode())
        except Exception as exc:  # noqa: BLE001 - the local breaker still protects this worker
            log.warning("generate: could not publish breaker state of %s: %s", name, type(exc).__name__)

    async def _allow(self, name: str) -> bool:
        before = self.breakers[name]
        ok, after = breaker_allows(before, now_ms(), self.policy.breaker)
        self.breakers[name] = after
        await self._breaker_changed(name, before, after, "cooldown over: one probe")
        return ok

    async def _record(self, name: str, ok: bool, reason: str) -> None:
        before = self.breakers[name]
        after = breaker_record(before, ok, now_ms(), self.policy.breaker)
        self.breakers[name] = after
        await self._breaker_changed(name, before, after, reason)

    # ---- LoRA adapters and the actor -------------------------------------------------------------

    async def _prepare_adapter(self, a: "_Attempts", d: Deployment, spec: AdapterSpec) -> tuple[str, float]:
        """Make `spec` resident in `d`'s engine (AdapterHost). Every move is evidence (`generate.adapter`)
        of this request and a `weight_events` row. Returns the state it found and the load time."""
        before, load_ms, moves = await self.host.prepare(d, spec)
        key = f"{spec.name}@{spec.revision}"
        for t in moves:
            took = load_ms if t.label == "cold->warm" and t.key == key else None
            ev = self.evidence(a.doc, t.label, f"{t.key} {t.label} on {d.name}", candidates=[d.name],
                               labels={"adapter": t.key, "from": t.before, "to": t.after},
                               scores={"load_ms": round(took, 2)} if took is not None else {})
            a.rows.append(ev.model_copy(update={"stage": f"{self.name}.adapter", "step": len(a.rows) + 1}))
            a.side.append(SideRecord("weight_events", t.key.partition("@")[0].encode(),
                                     self.host.weight_event(d, t, took, a.doc.request_id)))
        return before, load_ms

    def _actor_loader(self, d: Deployment):
        async def load(spec: AdapterSpec) -> float:
            ms, _ = await self.host.load_verified(d, spec)
            return ms

        return load

    async def _publish_actor_report(self, report: object, event: WeightEvent) -> None:
        await self._publish_control(report, f"actor:{event.revision}".encode())
        await self._publish_weight_event(event, event.name.encode())

    async def _publish_control(self, record: object, key: bytes) -> None:
        if self.follower is not None:
            await self.follower.publish(record, key=key)

    async def _publish_weight_event(self, event: object, key: bytes) -> None:
        if self.follower is not None:
            await self.follower.publish_to(TopicNames(self.ctx.topic_prefix)("weight_events"), event, key=key)

    # ---- one request -----------------------------------------------------------------------------

    def _row(self, a: _Attempts, decision: str, reason: str, deployment: str, **fields) -> None:
        ev = self.evidence(a.doc, decision, reason, candidates=[deployment], **fields)
        a.rows.append(ev.model_copy(update={"stage": f"{self.name}.attempt", "step": len(a.rows) + 1}))

    def _failed(self, a: _Attempts, error_class: str, reason: str, status: Status = Status.error) -> Outcome:
        added = (time.perf_counter() - a.started) * 1000
        final = self.evidence(a.doc, "failed", f"{error_class}: {reason}", candidates=a.tried,
                              scores={"attempts": float(len(a.tried)), "added_latency_ms": round(added, 2)})
        resp = Response(request_id=a.doc.request_id, status=status, error_class=error_class, reason=reason,
                        answered_by=self.name)
        out = Outcome.answer(a.doc, resp, *a.rows, final)
        out.side = a.side
        return out

    async def _one(self, doc: RequestDoc) -> Outcome:
        refused = refuse_adapter(doc, self.adapters)  # admit checked it too: a tenant's adapter never runs unchecked
        if refused is not None:
            return adapter_refusal(self, doc, *refused)
        # a rollout samples the active actor revision, taken once: a switch mid-request does not move it
        actor = self.actor.current() if doc.rollout is not None and not (doc.route and doc.route.adapter) else None
        if actor is None:
            return await self._serve(doc, None)
        with self.actor.serving(actor.revision):
            return await self._serve(doc, actor)

    async def _serve(self, doc: RequestDoc, actor: AdapterSpec | None) -> Outcome:
        assert self.tokenizer is not None, "start() first"
        p = self.policy
        a = _Attempts(doc)
        messages = doc.chat_messages()
        sampling = sampling_for(doc, p)
        scorer: Scorer | None = None
        if doc.rollout is not None:
            try:
                scorer = scorer_for(doc.rollout.verifier, doc.rollout.reward)
            except HookError as exc:
                return self._failed(a, "invalid_request", str(exc), Status.rejected)
        n = doc.rollout.n if doc.rollout is not None else 1
        spec = actor or (self.adapters.specs.get(doc.route.adapter) if doc.route and doc.route.adapter else None)
        prompt_tokens = len(chat_prompt_ids(self.tokenizer, messages))
        needs = needs_for(doc, prompt_tokens, sampling, spec)
        lane = "" if spec is None else spec.name
        if doc.admission and doc.admission.deployments:  # admit counted it against these limits
            preferred, strict = list(doc.admission.deployments), True
        elif doc.route and doc.route.deployments:
            preferred, strict = list(doc.route.deployments), True
        else:
            preferred, strict = list(p.prefer), False
        ok, refused = candidates(self.deployments, preferred, needs, only_preferred=strict)
        for name, why in refused.items():
            self._row(a, "refused", f"incompatible: {why}", name)
        if not ok:
            why = "; ".join(f"{n}: {w}" for n, w in refused.items())
            return self._failed(a, "no_compatible_deployment", f"no deployment can serve this request ({why})")
        i, attempt = 0, 0
        while i < len(ok):
            d = ok[i]
            remaining = (doc.deadline_ms - now_ms()) if doc.deadline_ms else NO_DEADLINE_MS
            if remaining <= 0:
                return self._failed(a, "deadline_exceeded", f"deadline passed after {attempt} attempt(s)",
                                    Status.deadline_exceeded)
            if not await self._allow(d.name):
                self._row(a, "skipped", "circuit breaker open", d.name)
                i += 1
                continue
            wanted = doc.rollout.actor_revision if doc.rollout is not None else None
            serving = self._actor_revision(d, spec)
            if wanted and wanted != serving and not (actor is not None and wanted == actor.revision):
                self._row(a, "refused", f"serves actor revision {serving}, the rollout asked for {wanted}", d.name)
                a.wrong_actor.append(d.name)
                i += 1
                continue
            attempt += 1
            a.tried.append(d.name)
            t0 = time.perf_counter()
            adapter_before, load_ms, waited = "", 0.0, 0.0
            in_flight = self.gates[d.name].in_flight  # batch context of a rollout: how busy the engine was
            try:
                # a rollout's n samples enter the engine together: one slot, n times the tokens
                async with self.gates[d.name].slot(lane, n * (prompt_tokens + sampling.max_tokens)) as waited:
                    if spec is not None:
                        adapter_before, load_ms = await self._prepare_adapter(a, d, spec)
                    timeout_s = max(0.001, min(p.retry.attempt_timeout_ms, remaining) / 1000 - load_ms / 1000)
                    try:
                        gens = await asyncio.wait_for(self._sample(d, doc, messages, sampling, spec, n), timeout_s)
                    except TimeoutError:
                        raise EngineError("timeout", f"no answer within {timeout_s:.1f} s") from None
            except EngineError as exc:
                ms = (time.perf_counter() - t0) * 1000
                await self._record(d.name, exc.error_class not in RETRYABLE, exc.error_class)
                step = next_step(exc.error_class, request_id=doc.request_id, attempt=attempt,
                                 remaining_ms=(doc.deadline_ms - now_ms()) if doc.deadline_ms else NO_DEADLINE_MS,
                                 has_fallback=i + 1 < len(ok), side_effects=doc.context.tool_side_effects,
                                 idempotency_key=doc.idempotency_key, p=p.retry)
                a.failures.append(f"{d.name}:{exc.error_class}")
                self._row(a, "failed", f"{exc.error_class}; next: {step.action} ({step.reason})", d.name,
                          scores={"latency_ms": round(ms, 2), "wait_ms": float(step.wait_ms), "attempt": float(attempt)})
                if step.action == "give_up":
                    return self._failed(a, exc.error_class, f"{', '.join(a.failures)} ({exc}); {step.reason}")
                if step.action == "fallback":
                    i += 1
                else:
                    await asyncio.sleep(step.wait_ms / 1000)
                continue
            await self._record(d.name, True, "success")
            ms = (time.perf_counter() - t0) * 1000
            sec = section_from(gens, d, attempts=attempt, fallback_from=list(a.tried[:-1]),
                               adapter=None if spec is None else spec.name)
            rollouts = []
            if doc.rollout is not None and scorer is not None:
                rollouts, summary = rollout_rows(
                    doc, gens, sample_seeds(doc, sampling, n), sampling, scorer, self.provenance[d.name],
                    {"deployment": d.name, "worker": self.member, "n": n, "engine_max_num_seqs":
                     self.ctx.settings.engine.max_num_seqs, "gate_in_flight_at_start": in_flight})
                sec = sec.model_copy(update={"samples": summary})
            revisions = {"model": sec.model_revision, **({"adapter": spec.revision} if spec is not None else {})}
            self._row(a, "ok", sec.finish_reason, d.name, revisions=revisions,
                      scores={"latency_ms": round(ms, 2), "tokens_in": float(sec.tokens_in),
                              "tokens_out": float(sec.tokens_out), "attempt": float(attempt)})
            doc = doc.model_copy(update={"generation": sec})
            added = (t0 - a.started) * 1000  # what the failed attempts and waits cost before this one
            final = self.evidence(doc, "generated", sec.finish_reason if attempt == 1 else
                                  f"{sec.finish_reason} after {', '.join(a.failures)}",
                                  scores={"tokens_in": float(sec.tokens_in), "tokens_out": float(sec.tokens_out),
                                          "ttft_ms": sec.ttft_ms, "attempts": float(attempt),
                                          "added_latency_ms": round(added, 2), "cost_usd": sec.cost_usd,
                                          "estimated_cost_usd": estimated_cost(d, needs),
                                          **({"tpot_ms": sec.tpot_ms} if sec.tpot_ms else {}),
                                          **({"engine_queue_ms": sec.engine_queue_ms}
                                             if sec.engine_queue_ms is not None else {}),
                                          # time in the fair gate behind other adapters' work, and a cold
                                          # adapter's load: both before the engine saw the request
                                          "gate_wait_ms": round(waited, 2), "adapter_load_ms": round(load_ms, 2)},
                                  candidates=a.tried, revisions=revisions,
                                  labels={"adapter_requested": (doc.route.adapter if doc.route else None) or "",
                                          "adapter_applied": sec.adapter or "",
                                          **({"adapter_state": adapter_before} if spec is not None else {})})
            out = Outcome.forward(doc, *a.rows, final)
            out.side = a.side
            out.rollouts = rollouts
            return out
        if a.wrong_actor and not a.tried:
            return self._failed(a, "actor_revision_unavailable",
                                f"no deployment serves actor revision {doc.rollout.actor_revision if doc.rollout else ''}",
                                Status.rejected)
        return self._failed(a, "all_deployments_unavailable",
                            f"{', '.join(a.failures) or 'no attempt'}; every compatible deployment is failing or "
                            "its circuit breaker is open")

    def _actor_revision(self, d: Deployment, spec: AdapterSpec | None) -> str:
        revision = self.engines[d.name].revision
        return revision if spec is None else f"{revision}+{spec.name}@{spec.revision}"

    async def _sample(self, d: Deployment, doc: RequestDoc, messages: list[dict[str, str]], sampling: Sampling,
                      spec: AdapterSpec | None, n: int) -> list[Generation]:
        """One generation, or a rollout's n samples side by side (seed + i each, so each is reproducible)."""
        engine = self.engines[d.name]
        if doc.rollout is None:
            return [await engine.generate(messages, sampling, doc.request_id, adapter=spec)]
        seeds = sample_seeds(doc, sampling, n)
        return list(await asyncio.gather(*(
            engine.generate(messages, replace(sampling, seed=seed), f"{doc.request_id}:{i}", adapter=spec)
            for i, seed in enumerate(seeds))))

    async def process_batch(self, docs: list[RequestDoc]) -> list[Outcome | BaseException]:
        return list(await asyncio.gather(*(self._one(d) for d in docs), return_exceptions=True))
