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
import itertools
import logging
import time
import uuid
from dataclasses import replace
from pathlib import Path

from pipeline.config.settings import Deployment
from pipeline.contracts import (
    BreakerUpdate,
    Cancel,
    RequestDoc,
    Response,
    Status,
    Usage,
    WeightEvent,
)
from pipeline.contracts.adapter import AdapterSpec
from pipeline.contracts.base import now_ms
from pipeline.contracts.control import AdapterStateChanged
from pipeline.engines.chat_engine import (
    ChatEngine,
    EngineError,
    Generation,
    OnDelta,
    Sampling,
)
from pipeline.engines.model_prep import resolve
from pipeline.engines.provenance import Provenance, provenance_for
from pipeline.engines.tokenizer import load_chat_tokenizer
from pipeline.registries.adapters import AdapterRegistry, refuse_adapter
from pipeline.runtime.stage import Outcome, SideRecord, Stage, StageContext
from pipeline.runtime.topics import TopicNames
from pipeline.security.sealing import Keyring, RestoreError, keyring_for, open_sealed
from pipeline.security.stream_unmask import StreamUnmasker
from pipeline.stages.generate.actor import ActorReplica
from pipeline.stages.generate.attempts import (
    Attempted,
    Attempts,
    Plan,
    PlanError,
    billed,
    generated_labels,
    generated_scores,
    plan_for,
    section_from,
    side_effecting,
)
from pipeline.stages.generate.config import GeneratePolicy
from pipeline.stages.generate.deployments import (
    RETRYABLE,
    Breaker,
    NextStep,
    breaker_allows,
    breaker_record,
    next_step,
)
from pipeline.stages.generate.fair_gate import FairGate
from pipeline.stages.generate.lora.host import AdapterHost
from pipeline.stages.generate.lora.refusal import adapter_refusal
from pipeline.stages.generate.rollouts.rewards import HookFailed, Scored
from pipeline.stages.generate.rollouts.samples import (
    rollout_rows,
    sample_seeds,
    score_samples,
)
from pipeline.stages.generate.stream import DeltaFlusher, DeltaSink
from pipeline.stages.postprocess.config import PostprocessPolicy

log = logging.getLogger(__name__)
NO_DEADLINE_MS = 10**9


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
                      lora=s.lora if d.lora else None, adapters_dir=s.resolved_data_dir() / "adapters",
                      stall_timeout_s=attempt_timeout_s)


def gate_for(d: Deployment, ctx: StageContext, policy: GeneratePolicy) -> FairGate:
    """A LoRA deployment admits no more than the engine batches at once, so the gate (not vLLM's
    arrival-order queue) decides which adapter runs next."""
    if not d.lora:
        return FairGate(d.concurrency, policy.adapter_token_budget)
    capacity = min(d.concurrency, ctx.settings.engine.max_num_seqs)
    return FairGate(capacity, policy.adapter_token_budget, reserve=min(policy.adapter_reserve_slots, capacity - 1))


class GenerateStage(Stage):
    max_batch = 16
    max_wait_ms = 5
    policy_model = GeneratePolicy
    replay_reruns = "calls the model again (new answers, new cost)"

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
        self._attempt_seq = itertools.count(1)
        self.names = TopicNames(ctx.topic_prefix)
        pp = next((x for x in ctx.settings.stages if x.name == "postprocess"), None)
        self.unmask_policy = PostprocessPolicy.model_validate(pp.policy if pp else {})  # one source for streams
        self.keyring: Keyring | None = None
        self.actor = ActorReplica(self.member, self._publish_actor_report)
        self.deltas: DeltaFlusher | None = None  # every streaming attempt's deltas (generate/stream.py)
        self.host = AdapterHost(self.member, self.deployments, self.engines, ctx.settings.lora, self.adapters,
                                self._publish_control, self._publish_weight_event,
                                snapshots=ctx.settings.resolved_data_dir() / "adapters" / "verified")

    async def start(self) -> None:
        s = self.ctx.settings
        path, revision = await asyncio.to_thread(resolve, s.resolved_data_dir(), s.engine.model_dir, s.engine.dtype)
        # counts prompt tokens for the compatibility check, whichever deployment serves the request
        self.tokenizer = await asyncio.to_thread(load_chat_tokenizer, s)
        self.keyring = await asyncio.to_thread(keyring_for, s)  # opens restore mappings for streamed deltas
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
        if self.deltas is not None:
            await self.deltas.stop()
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

    async def _prepare_adapter(self, a: Attempts, d: Deployment, spec: AdapterSpec) -> tuple[str, float]:
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

    def _row(self, a: Attempts, decision: str, reason: str, deployment: str, **fields) -> None:
        ev = self.evidence(a.doc, decision, reason, candidates=[deployment], **fields)
        a.rows.append(ev.model_copy(update={"stage": f"{self.name}.attempt", "step": len(a.rows) + 1}))

    def _failed(self, a: Attempts, error_class: str, reason: str, status: Status = Status.error) -> Outcome:
        added = (time.perf_counter() - a.started) * 1000
        final = self.evidence(a.doc, "failed", f"{error_class}: {reason}", candidates=a.tried,
                              scores={"attempts": float(len(a.tried)), "added_latency_ms": round(added, 2)})
        resp = Response(request_id=a.doc.request_id, status=status, error_class=error_class, reason=reason,
                        answered_by=self.name)
        out = Outcome.answer(a.doc, resp, *a.rows, final)
        out.side = a.side
        return out

    async def _cancellable(self, doc: RequestDoc) -> Outcome:
        """One request, stopped when its caller withdraws it (runtime/follow/cancels.py):
        1. watch the request_id; the request runs as its own task;
        2. a cancel cancels that task: the engine call is cancelled with it, which aborts the request
           in vLLM (or closes the HTTP stream), and its fair-gate slot is given back;
        3. the answer is `cancelled`, with the tokens the attempts generated until then (admit
           settles the hold with them). Other requests of the batch are not touched."""
        a = Attempts(doc)
        task = asyncio.ensure_future(self._one(doc, a))
        withdrawn: list[Cancel] = []

        def cancel(c: Cancel) -> None:
            withdrawn.append(c)
            task.cancel()

        unwatch = self.cancels.watch(doc, cancel) if self.cancels is not None else (lambda: None)
        try:
            return await task
        except asyncio.CancelledError:
            if not withdrawn or not task.cancelled():
                raise  # this worker is stopping, not the caller withdrawing
            return self._withdrawn(a, withdrawn[0])
        finally:
            unwatch()

    def _withdrawn(self, a: Attempts, c: Cancel) -> Outcome:
        d = next((x for x in self.deployments if a.tried and x.name == a.tried[-1]), None)
        cost = 0.0 if d is None else (a.prompt_tokens * d.cost_per_1k_input + a.tokens_used * d.cost_per_1k_output) / 1000
        ms = (time.perf_counter() - a.started) * 1000
        final = self.evidence(a.doc, "cancelled", f"withdrawn by the caller ({c.reason}) during generation",
                              candidates=a.tried,
                              scores={"tokens_in": float(a.prompt_tokens), "tokens_out": float(a.tokens_used),
                                      "attempts": float(len(a.tried)), "latency_ms": round(ms, 2),
                                      "cancel_lag_ms": float(max(0, now_ms() - c.at_ms))})
        resp = Response(request_id=a.doc.request_id, status=Status.cancelled, error_class="cancelled",
                        reason="cancelled by the caller during generation", answered_by=self.name,
                        deployment=d.name if d else None, cost_usd=round(cost, 8),
                        usage=Usage(prompt_tokens=a.prompt_tokens if a.tried else 0, completion_tokens=a.tokens_used))
        out = Outcome.answer(a.doc, resp, *a.rows, final)
        out.side = a.side
        return out

    async def _one(self, doc: RequestDoc, a: Attempts) -> Outcome:
        refused = refuse_adapter(doc, self.adapters)  # admit checked it too: a tenant's adapter never runs unchecked
        if refused is not None:
            return adapter_refusal(self, doc, *refused)
        # a rollout samples the active actor revision, taken once: a switch mid-request does not move it
        actor = self.actor.current() if doc.rollout is not None and not (doc.route and doc.route.adapter) else None
        if actor is None:
            return await self._serve(doc, None, a)
        with self.actor.serving(actor.revision):
            return await self._serve(doc, actor, a)

    async def _serve(self, doc: RequestDoc, actor: AdapterSpec | None, a: Attempts) -> Outcome:
        """plan → attempts (each recorded as a row) → the answer or the failure."""
        assert self.tokenizer is not None, "start() first"
        try:
            plan = plan_for(doc, self.policy, self.tokenizer, self.deployments, self.adapters, actor)
        except PlanError as exc:
            return self._failed(a, exc.error_class, str(exc), Status.rejected)
        a.prompt_tokens = plan.prompt_tokens
        for name, why in plan.refused.items():
            self._row(a, "refused", f"incompatible: {why}", name)
        if not plan.deployments:
            why = "; ".join(f"{n}: {w}" for n, w in plan.refused.items())
            return self._failed(a, "no_compatible_deployment", f"no deployment can serve this request ({why})")
        i, attempt = 0, 0
        while i < len(plan.deployments):
            d = plan.deployments[i]
            remaining = (doc.deadline_ms - now_ms()) if doc.deadline_ms else NO_DEADLINE_MS
            if remaining <= 0:
                return self._failed(a, "deadline_exceeded", f"deadline passed after {attempt} attempt(s)",
                                    Status.deadline_exceeded)
            if not await self._may_try(a, plan, d, actor):
                i += 1
                continue
            attempt += 1
            a.tried.append(d.name)
            t0 = time.perf_counter()
            try:
                done = await self._attempt(a, plan, d, remaining, t0)
            except EngineError as exc:
                step = await self._attempt_failed(a, d, exc, attempt, (time.perf_counter() - t0) * 1000,
                                                  has_fallback=i + 1 < len(plan.deployments))
                if step.action == "give_up":
                    return self._failed(a, exc.error_class, f"{', '.join(a.failures)} ({exc}); {step.reason}")
                if step.action == "fallback":
                    i += 1
                else:
                    await asyncio.sleep(step.wait_ms / 1000)
                continue
            await self._record(d.name, True, "success")
            return await self._scored(a, plan, d, done, attempt)
        if a.wrong_actor and not a.tried:
            return self._failed(a, "actor_revision_unavailable",
                                f"no deployment serves actor revision {doc.rollout.actor_revision if doc.rollout else ''}",
                                Status.rejected)
        return self._failed(a, "all_deployments_unavailable",
                            f"{', '.join(a.failures) or 'no attempt'}; every compatible deployment is failing or "
                            "its circuit breaker is open")

    async def _may_try(self, a: Attempts, plan: Plan, d: Deployment, actor: AdapterSpec | None) -> bool:
        """False (and a row that says why) when `d`'s breaker is open or it serves another actor revision
        than the rollout asked for."""
        if not await self._allow(d.name):
            self._row(a, "skipped", "circuit breaker open", d.name)
            return False
        wanted = a.doc.rollout.actor_revision if a.doc.rollout is not None else None
        serving = self._actor_revision(d, plan.spec)
        if wanted and wanted != serving and not (actor is not None and wanted == actor.revision):
            self._row(a, "refused", f"serves actor revision {serving}, the rollout asked for {wanted}", d.name)
            a.wrong_actor.append(d.name)
            return False
        return True

    async def _attempt(self, a: Attempts, plan: Plan, d: Deployment, remaining_ms: float, t0: float) -> Attempted:
        """One attempt on `d`: a fair-gate slot, the adapter made resident, the engine call under the
        attempt timeout (less the adapter's load). An engine that watches its own progress (in-process
        vLLM fails an attempt when it stalls) is bounded by the deadline alone: a slow but working
        engine is not a failure, and a retry would only queue the same work again. Raises EngineError."""
        adapter_before, load_ms = "", 0.0
        in_flight = self.gates[d.name].in_flight
        async with self.gates[d.name].slot(plan.lane, plan.engine_tokens) as waited:
            if plan.spec is not None:
                adapter_before, load_ms = await self._prepare_adapter(a, d, plan.spec)
            limit_ms = remaining_ms if getattr(self.engines[d.name], "watches_progress", False) else \
                min(self.policy.retry.attempt_timeout_ms, remaining_ms)
            timeout_s = max(0.001, (limit_ms - load_ms) / 1000)
            sink = self._sink(a)
            try:
                async with asyncio.timeout(timeout_s):
                    gens = await self._sample(d, a.doc, plan.messages, plan.sampling, plan.spec, plan.n,
                                              sink.piece if a.doc.rollout is None else None)
            except TimeoutError:
                await sink.abandon()
                raise EngineError("timeout", f"no answer within {timeout_s:.1f} s") from None
            except BaseException:
                await asyncio.shield(sink.abandon())
                raise
            finally:
                a.tokens_used += sink.tokens
            await sink.finish()
        return Attempted(gens=gens, t0=t0, ms=(time.perf_counter() - t0) * 1000, waited_ms=waited, load_ms=load_ms,
                         adapter_before=adapter_before, in_flight=in_flight)

    async def _attempt_failed(self, a: Attempts, d: Deployment, exc: EngineError, attempt: int, ms: float, *,
                              has_fallback: bool) -> NextStep:
        """Record the failure (breaker, row) and decide: retry after a backoff, fall back, or give up."""
        doc = a.doc
        await self._record(d.name, exc.error_class not in RETRYABLE, exc.error_class)
        step = next_step(exc.error_class, request_id=doc.request_id, attempt=attempt,
                         remaining_ms=(doc.deadline_ms - now_ms()) if doc.deadline_ms else NO_DEADLINE_MS,
                         has_fallback=has_fallback, side_effects=side_effecting(doc, self.policy),
                         idempotency_key=doc.idempotency_key, p=self.policy.retry)
        a.failures.append(f"{d.name}:{exc.error_class}")
        self._row(a, "failed", f"{exc.error_class}; next: {step.action} ({step.reason})", d.name,
                  scores={"latency_ms": round(ms, 2), "wait_ms": float(step.wait_ms), "attempt": float(attempt)})
        return step

    async def _scored(self, a: Attempts, plan: Plan, d: Deployment, done: Attempted, attempt: int) -> Outcome:
        """A rollout's samples are scored in a thread under the policy's bounds (rollouts/samples.py); a
        hook that fails or runs out of time is this request's answer, never the worker's failure."""
        scores: list[Scored] = []
        if a.doc.rollout is not None and plan.scorer is not None:
            try:
                scores = await score_samples(plan.scorer, done.gens, self.policy.rollout_hooks.score_timeout_s)
            except HookFailed as exc:  # the samples were made: the answer bills them (attempts.billed)
                out = self._failed(a, exc.error_class, str(exc), Status.rejected)
                out.response = billed(out.response, done.gens, d) if out.response is not None else None
                return out
        return self._generated(a, plan, d, done, attempt, scores)

    def _generated(self, a: Attempts, plan: Plan, d: Deployment, done: Attempted, attempt: int,
                   scores: list[Scored]) -> Outcome:
        """The answer: the generation section, a rollout's scored samples, the `ok` and `generated` rows."""
        doc, spec = a.doc, plan.spec
        sec = section_from(done.gens, d, attempts=attempt, fallback_from=list(a.tried[:-1]),
                           adapter=None if spec is None else spec.name, rollout=doc.rollout is not None)
        rollouts = []
        if doc.rollout is not None and plan.scorer is not None:
            rollouts, summary = rollout_rows(
                doc, done.gens, sample_seeds(doc, plan.sampling, plan.n), plan.sampling, plan.scorer, scores,
                self.provenance[d.name],
                {"deployment": d.name, "worker": self.member, "n": plan.n, "engine_max_num_seqs":
                 self.ctx.settings.engine.max_num_seqs, "gate_in_flight_at_start": done.in_flight})
            sec = sec.model_copy(update={"samples": summary})
        prov = self.provenance.get(d.name)
        revisions = {"model": sec.model_revision, **({"adapter": spec.revision} if spec is not None else {}),
                     **({"tokenizer": prov.tokenizer_revision, "chat_template": prov.chat_template_revision}
                        if prov is not None else {})}
        self._row(a, "ok", sec.finish_reason, d.name, revisions=revisions,
                  scores={"latency_ms": round(done.ms, 2), "tokens_in": float(sec.tokens_in),
                          "tokens_out": float(sec.tokens_out), "attempt": float(attempt)})
        doc = doc.model_copy(update={"generation": sec})
        added = (done.t0 - a.started) * 1000  # what the failed attempts and waits cost before this one
        final = self.evidence(doc, "generated", sec.finish_reason if attempt == 1 else
                              f"{sec.finish_reason} after {', '.join(a.failures)}",
                              scores=generated_scores(sec, plan, d, done, attempt, added),
                              candidates=a.tried, revisions=revisions, labels=generated_labels(doc, sec, plan, done))
        out = Outcome.forward(doc, *a.rows, final)
        out.side = a.side
        out.rollouts = rollouts
        return out

    def _actor_revision(self, d: Deployment, spec: AdapterSpec | None) -> str:
        revision = self.engines[d.name].revision
        return revision if spec is None else f"{revision}+{spec.name}@{spec.revision}"

    def _sink(self, a: Attempts) -> DeltaSink:
        """The attempt's delta sink (generate/stream.py): it streams when the caller asked for a stream,
        and counts the tokens in any case."""
        doc = a.doc
        attempt = f"{self.member}:{next(self._attempt_seq)}"
        a.attempt_ids.append(attempt)
        reply = doc.reply_to
        if reply is None or not reply.stream or doc.rollout is not None or self.ports is None:
            return DeltaSink(doc.request_id, attempt)
        if self.deltas is None:
            self.deltas = DeltaFlusher(self.ports.stream(self.names.deltas))
        self.deltas.configure(self.policy.stream, self.keyring)  # coalescing, and sealing (stream.seal)
        return self.deltas.sink(doc.request_id, attempt, reply.partition, self._unmasker(doc), doc.tenant_id)

    def _unmasker(self, doc: RequestDoc) -> StreamUnmasker:
        """What postprocess will do to the whole answer, done to each piece: restore the placeholders
        where the tenant's policy allows it (the mapping opened here, in memory, never logged)."""
        token = doc.masking.restore_token if doc.masking else None
        if not token or self.keyring is None or not self.unmask_policy.unmask_for(doc.tenant_id):
            return StreamUnmasker(None, restore=False)
        try:
            return StreamUnmasker(open_sealed(token, doc.request_id, self.keyring))
        except RestoreError:  # postprocess answers unmask_failed; the stream shows placeholders meanwhile
            return StreamUnmasker(None, restore=False)

    async def _sample(self, d: Deployment, doc: RequestDoc, messages: list[dict[str, str]], sampling: Sampling,
                      spec: AdapterSpec | None, n: int, on_delta: OnDelta | None = None) -> list[Generation]:
        """One generation, or n side by side (a rollout's samples, a caller's choices: seed + i each, so
        each is reproducible)."""
        engine = self.engines[d.name]
        if n == 1 and doc.rollout is None:  # a rollout's one sample still gets its recorded seed
            return [await engine.generate(messages, sampling, doc.request_id, adapter=spec, on_delta=on_delta)]
        seeds = sample_seeds(doc, sampling, n)  # n choices, or a rollout's samples: never streamed
        return list(await asyncio.gather(*(
            engine.generate(messages, replace(sampling, seed=seed), f"{doc.request_id}:{i}", adapter=spec)
            for i, seed in enumerate(seeds))))

    async def process_batch(self, docs: list[RequestDoc]) -> list[Outcome | BaseException]:
        return list(await asyncio.gather(*(self._cancellable(d) for d in docs), return_exceptions=True))
