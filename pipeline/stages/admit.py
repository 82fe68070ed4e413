"""admit: the gateway's limits, after route has said where a request may run (and so what it may
cost). Its topic is keyed by tenant, so exactly one worker decides for a tenant: RPM, TPM and
concurrency are exact, and budgets reserve each request's worst-case cost before it runs and
settle the real cost when it ends (completions arrive on `admit.release`, a side input keyed by
tenant, so they reach the same worker). A request that cannot run yet waits in its tenant's
bounded queue while its deadline allows, or is rejected with a reason and a retry-after.

Policy in admission.py; tenants and limits in tenants.py (config + `control`).
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict

from pydantic import BaseModel, Field

from pipeline.contracts import AdmitRelease, Evidence, RequestDoc, Response, Status
from pipeline.contracts.request import AdmissionSection
from pipeline.engines.chat_engine import chat_prompt_ids
from pipeline.engines.tokenizer import load_chat_tokenizer
from pipeline.runtime.stage import Outcome, Stage, StageContext
from pipeline.settings import Deployment
from pipeline.stages.admission import Ask, TenantState, admit, evaluate, now_ms, roll, settle
from pipeline.stages.tenants import TenantRegistry


class AdmitPolicy(BaseModel):
    version: str = "admit-v1"
    assumed_max_tokens: int = Field(128, ge=1, description="reserved when a request does not set max_tokens")
    hold_grace_ms: int = Field(60_000, ge=0, description="a hold outlives its deadline by this, then settles at cost")
    hold_without_deadline_ms: int = Field(900_000, ge=1000)


def worst_case_cost(deployments: list[Deployment], tokens_in: int, max_tokens: int) -> float:
    """The most this request can cost: generate may fall back to any deployment, so the priciest."""
    return max(((tokens_in * d.cost_per_1k_input + max_tokens * d.cost_per_1k_output) / 1000 for d in deployments),
               default=0.0)


class AdmitStage(Stage):
    # One record per processor: the runtime sends a batch's outputs when the whole batch is decided,
    # so a waiting request in a batch would hold back an admitted one whose completion it waits for.
    max_batch = 1
    policy_model = AdmitPolicy
    side_inputs = {"admit.release": AdmitRelease}

    def __init__(self, ctx: StageContext) -> None:
        super().__init__(ctx)
        self.registry = TenantRegistry(ctx.settings.tenants)
        self.states: dict[str, TenantState] = defaultdict(TenantState)
        self.queued: dict[str, int] = defaultdict(int)
        self.changed: dict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.tokenizer = None
        self.max_waiting = max(0, ctx.runtime.concurrency // 2)

    async def start(self) -> None:
        self.tokenizer = await asyncio.to_thread(load_chat_tokenizer, self.ctx.settings)
        await self.follow_control(self.registry.apply)

    # ---- completions ---------------------------------------------------------------------------

    async def on_side_input(self, topic: str, value: BaseModel) -> list[Evidence]:
        assert isinstance(value, AdmitRelease)
        state = self.states.get(value.tenant_id)
        if state is None:
            return []
        hold = settle(state, value.request_id, tokens=value.tokens_in + value.tokens_out, cost_usd=value.cost_usd)
        if hold is None:
            return []  # never admitted here (rejected earlier, or a cache hit)
        self._wake(value.tenant_id)
        return [Evidence(request_id=value.request_id, tenant_id=value.tenant_id, stage=f"{self.name}.release",
                         decision="settled", reason=value.status, policy_version=self.policy_version,
                         scores={"cost_usd": value.cost_usd, "cost_reserved_usd": hold.cost_usd,
                                 "tokens": float(value.tokens_in + value.tokens_out),
                                 "tokens_reserved": float(hold.tokens),
                                 "held_ms": float(max(0, value.finished_ms - hold.at_ms))})]

    def _wake(self, tenant: str) -> None:
        ev = self.changed[tenant]
        ev.set()
        self.changed[tenant] = asyncio.Event()

    # ---- admission -----------------------------------------------------------------------------

    def ask_for(self, doc: RequestDoc) -> Ask:
        assert self.tokenizer is not None, "start() first"
        p = self.policy
        messages = [{"role": m.role, "content": m.content} for m in doc.body.messages]
        tokens_in = len(chat_prompt_ids(self.tokenizer, messages))
        max_tokens = doc.body.max_tokens or p.assumed_max_tokens
        cost = worst_case_cost(self.ctx.settings.deployments, tokens_in, max_tokens)
        now = now_ms()
        expires = (doc.deadline_ms + p.hold_grace_ms) if doc.deadline_ms else now + p.hold_without_deadline_ms
        return Ask(doc.request_id, tokens_in + max_tokens, round(cost, 10), now, expires)

    async def process(self, doc: RequestDoc) -> Outcome:
        tenant = doc.tenant_id or ""
        limits = self.registry.limits_for(tenant)
        a = self.ask_for(doc)
        if limits is None:  # a tenant nobody configured: admitted, and the evidence says it ran unmetered
            return self._admitted(doc, a, waited_ms=0, metered=False, remaining={})
        t0 = time.monotonic()
        while True:
            state = self.states[tenant]
            for _ in roll(state, a.now_ms):
                self._wake(tenant)
            # waiting requests occupy processors; completions need free ones: at most half may wait
            room = self.queued[tenant] if sum(self.queued.values()) < self.max_waiting else limits.max_queue
            v = evaluate(state, limits, a, queued=room)
            if v.action == "admit":
                admit(state, a)
                return self._admitted(doc, a, waited_ms=int((time.monotonic() - t0) * 1000), metered=True,
                                      remaining=v.remaining)
            if v.action == "reject":
                resp = Response(request_id=doc.request_id, status=Status.rejected, error_class=v.reason,
                                reason=v.detail, retry_after_ms=v.retry_after_ms or None, answered_by=self.name)
                ev = self.evidence(doc, "rejected", f"{v.reason}: {v.detail}",
                                   scores={**v.remaining, "retry_after_ms": float(v.retry_after_ms),
                                           "waited_ms": float(int((time.monotonic() - t0) * 1000))})
                return Outcome.answer(doc, resp, ev)
            # wait for a completion (or the window to move), then decide again
            self.queued[tenant] += 1
            try:
                await asyncio.wait_for(self.changed[tenant].wait(), min(v.retry_after_ms, a.expires_ms - a.now_ms) / 1000)
            except TimeoutError:
                pass
            finally:
                self.queued[tenant] -= 1
            a = Ask(a.request_id, a.tokens, a.cost_usd, now_ms(), a.expires_ms)

    def _admitted(self, doc: RequestDoc, a: Ask, *, waited_ms: int, metered: bool,
                  remaining: dict[str, float]) -> Outcome:
        sec = AdmissionSection(decision="admitted", reason="within limits" if metered else "no limits configured",
                               tokens_reserved=a.tokens, cost_reserved_usd=a.cost_usd, waited_ms=waited_ms,
                               metered=metered, policy_version=self.policy_version)
        doc = doc.model_copy(update={"admission": sec})
        ev = self.evidence(doc, "admitted" if waited_ms == 0 else "admitted_after_wait", sec.reason,
                           scores={**remaining, "tokens_reserved": float(a.tokens), "cost_reserved_usd": a.cost_usd,
                                   "waited_ms": float(waited_ms)})
        return Outcome.forward(doc, ev)

