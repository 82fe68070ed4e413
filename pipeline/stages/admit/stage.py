"""admit: the gateway's limits, after route has said where a request may run (and so what it may
cost). Its topic is keyed by tenant, so exactly one worker decides for a tenant: RPM, TPM and
concurrency are exact, and budgets reserve each request's worst-case cost before it runs and
settle the real cost when it ends (completions arrive on `admit.release`, a side input keyed by
tenant, so they reach the same worker). A request that cannot run yet waits in its tenant's
bounded queue while its deadline allows, or is rejected with a reason and a retry-after.

Deployments may have limits too: a tenant's own per deployment, and global ones, of which each
admit partition owns an equal share (shares sum to the limit, so no coordination is needed to
never exceed it). A request is admitted on the first deployment in route's order with room.

Idempotency keys: the first request with a key claims it; duplicates get its result (at once if
known, else parked and answered when it arrives on `admit.release`), or `in_progress` when they
cannot wait. A request id the tenant already used, on another record, is a replay: dropped or
answered `duplicate_request` (request_ids.py).

Every state change is written to `admit.state` (partition = the tenant's admit partition, produced
with the decision's outputs, so before its input offset is committed) and restored when a worker
is assigned the partition, before any of its records is processed.

Composed of: the meters (`AdmitBook`) and the changelog (`AdmitChangelog`) in state.py, the
idempotency claims (`IdempotencyKeys`) in idempotency.py, replayed request ids (`Replays`) in
request_ids.py; decisions in policy.py; tenants and limits in pipeline/registries/tenants.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import defaultdict

from aiokafka.partitioner import DefaultPartitioner
from pydantic import BaseModel

from pipeline.config.tenants import RateLimits, TenantLimits
from pipeline.contracts import AdmitRelease, Evidence, RequestDoc, Response, Status
from pipeline.contracts.admit import StateMarker
from pipeline.contracts.base import now_ms
from pipeline.contracts.request import ANONYMOUS_TENANT, AdmissionSection
from pipeline.engines.chat_engine import as_chat, chat_prompt_len
from pipeline.engines.tokenizer import load_chat_tokenizer
from pipeline.registries.adapters import AdapterRegistry, refuse_adapter
from pipeline.registries.tenants import TenantRegistry
from pipeline.runtime.codec import encode
from pipeline.runtime.follow.changelog import ChangelogReader
from pipeline.runtime.stage import Outcome, SideEffects, SideRecord, Stage, StageContext
from pipeline.runtime.topics import TopicNames, load_registry
from pipeline.security.sealing import keyring_for
from pipeline.stages.admit.config import AdmitPolicy
from pipeline.stages.admit.idempotency import Claim, IdempotencyKeys
from pipeline.stages.admit.policy import (
    Ask,
    Hold,
    Lane,
    Meter,
    Verdict,
    admit,
    decided_key,
    evaluate,
    forget_settled,
    roll,
    settle,
    split_share,
    worst_case_cost,
)
from pipeline.stages.admit.request_ids import Replays
from pipeline.stages.admit.state import STATE_TOPIC, AdmitBook, AdmitChangelog
from pipeline.stages.generate.lora.refusal import adapter_refusal

log = logging.getLogger(__name__)



class AdmitStage(Stage):
    # One record per processor: the runtime sends a batch's outputs when the whole batch is decided,
    # so a waiting request in a batch would hold back an admitted one whose completion it waits for.
    max_batch = 1
    policy_model = AdmitPolicy
    side_inputs = {"admit.release": AdmitRelease}

    def __init__(self, ctx: StageContext) -> None:
        super().__init__(ctx)
        self.registry = TenantRegistry(ctx.settings.tenants, ctx.settings.tenant_defaults)
        self.keyring = keyring_for(ctx.settings)  # seals idempotency results at rest
        self.adapters = AdapterRegistry(ctx.settings.adapters)
        self.deployments = {d.name: d for d in ctx.settings.deployments}
        # composed, each with what it needs: the meters, the idempotency claims, the request ids
        # taken (replays), and the changelog that records and restores all three
        self.book = AdmitBook(self.deployments, self.partition_of)
        self.keys = IdempotencyKeys(self.registry.limits_for, self.policy, self.name, self.evidence,
                                    lambda c, gone: self.changelog.claim(c, gone))
        self.replays = Replays(self.registry.limits_for, self.policy, self.name, self.evidence, self.book.answered)
        self.changelog = AdmitChangelog(self.book, self.keys, self.replays.ids, self.keyring, self.policy)
        self.queued: dict[str, int] = defaultdict(int)
        self.changed: dict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.tokenizer = None
        self.max_waiting = max(0, ctx.runtime.concurrency // 2)
        self.names = TopicNames(ctx.topic_prefix)
        spec = load_registry().get("stage.admit")
        self.partitions = spec.partitions if spec else 6
        self.reader: ChangelogReader | None = None
        self._partition_cache: dict[str, int] = {}

    async def start(self) -> None:
        self.tokenizer = await asyncio.to_thread(load_chat_tokenizer, self.ctx.settings)
        await self.follow_control(lambda r: self.registry.apply(r) or self.adapters.apply(r))
        if self.ctx.bootstrap:
            marker = lambda mid: encode(StateMarker(marker_id=mid))  # noqa: E731
            self.reader = await ChangelogReader(self.ctx.bootstrap, self.names(STATE_TOPIC), marker,
                                                self.ctx.settings.kafka).start()
            self.partitions = await self.reader.partitions(self.names.stage_input(self.name))

    async def stop(self) -> None:
        if self.reader is not None:
            await self.reader.stop()
        await super().stop()

    async def on_assigned(self, partitions: list[int]) -> None:
        await self.changelog.restore(self.reader, partitions)

    async def on_revoked(self, partitions: list[int]) -> None:
        self.changelog.forget(partitions)

    def partition_of(self, tenant: str) -> int:
        """The admit partition of a tenant: how the runtime's producers place a tenant-keyed record."""
        p = self._partition_cache.get(tenant)
        if p is None:
            parts = list(range(self.partitions))
            p = self._partition_cache[tenant] = DefaultPartitioner()(tenant.encode(), parts, parts)
        return p

    # ---- completions ---------------------------------------------------------------------------

    async def on_side_input(self, topic: str, value: BaseModel) -> SideEffects:
        assert isinstance(value, AdmitRelease)
        fx = SideEffects()
        tenant = value.tenant_id
        state = self.book.states.get(tenant)
        shares = self.book.shares_of(self.partition_of(tenant))
        hold = settle(state, value.request_id, tokens=value.tokens_in + value.tokens_out, cost_usd=value.cost_usd,
                      shares=shares, remember_until_ms=now_ms() + self.policy.remember_settled_ms
                      ) if state is not None else None
        if hold is not None:
            self._wake(tenant)
            fx.side += self.changelog.changed(tenant, [hold], settled=True)
            fx.evidence.append(Evidence(
                request_id=value.request_id, tenant_id=tenant, stage=f"{self.name}.release", decision="settled",
                reason=value.status, policy_version=self.policy_version,
                scores={"cost_usd": value.cost_usd, "cost_reserved_usd": hold.cost_usd,
                        "tokens": float(value.tokens_in + value.tokens_out), "tokens_reserved": float(hold.tokens),
                        "held_ms": float(max(0, value.finished_ms - hold.at_ms))}))
        c = self.keys.owned.get(value.request_id)
        if c is not None:
            resp = value.response or Response(request_id=value.request_id, tenant_id=tenant, status=Status(value.status),
                                              answered_by=value.answered_by, deployment=value.deployment,
                                              cost_usd=value.cost_usd)
            answers, side = self.keys.resolve(c, resp, "duplicate_answered")
            fx.answers += answers
            fx.side += side
        return fx

    def _wake(self, tenant: str) -> None:
        ev = self.changed[tenant]
        ev.set()
        self.changed[tenant] = asyncio.Event()

    # ---- admission -----------------------------------------------------------------------------

    def _order(self, doc: RequestDoc) -> list[str]:
        order = [d for d in (doc.route.deployments if doc.route else []) if d in self.deployments]
        return order or list(self.deployments)

    def ask_for(self, doc: RequestDoc, order: list[str]) -> Ask:
        assert self.tokenizer is not None, "start() first"
        p = self.policy
        messages = as_chat(doc.body.messages, doc.route.system_prompt if doc.route else None)
        tokens_in = chat_prompt_len(self.tokenizer, messages)
        max_tokens = doc.body.max_tokens or p.assumed_max_tokens
        n = doc.rollout.n if doc.rollout is not None else doc.body.n  # each sample or choice: prompt + output
        cost = n * worst_case_cost([self.deployments[d] for d in order], tokens_in, max_tokens)
        now = now_ms()
        expires = (doc.deadline_ms + p.hold_grace_ms) if doc.deadline_ms else now + p.hold_without_deadline_ms
        return Ask(doc.request_id, n * (tokens_in + max_tokens), round(cost, 10), now, expires, doc.attempt)

    def _lanes(self, tenant: str, limits: TenantLimits, order: list[str]) -> list[Lane] | None:
        p = self.partition_of(tenant)
        shares = self.book.shares_of(p)
        state = self.book.states[tenant]
        if not any(d in shares or (d in limits.deployments and limits.deployments[d].any()) for d in order):
            return None
        lanes = []
        for d in order:
            gates: list[tuple[str, Meter, RateLimits]] = []
            own = limits.deployments.get(d)
            if own is not None and own.any():
                gates.append((f"{tenant} on {d}", state.lane(d), own))
            if d in shares:
                g = self.deployments[d].limits
                share = RateLimits(rpm=split_share(g.rpm, self.partitions, p), tpm=split_share(g.tpm, self.partitions, p),
                                   concurrency=split_share(g.concurrency, self.partitions, p))
                gates.append((f"{d}: this partition's share of its global limits", shares[d], share))
            lanes.append(Lane(d, tuple(gates)))
        return lanes

    async def process(self, doc: RequestDoc) -> Outcome:
        """1. expire idempotency claims, end a replayed request id (request_ids.py); 2. refuse an
        adapter the tenant may not use, answer a duplicate of a keyed request (or claim its key);
        3. decide under the tenant's limits: admit, reject, or wait for a completion and decide again."""
        if doc.tenant_id is None:  # published past mask: metered as `anonymous`, and answered as it
            doc = doc.model_copy(update={"tenant_id": ANONYMOUS_TENANT})  # so its release comes back here
        tenant = doc.tenant_id or ANONYMOUS_TENANT
        side: list[SideRecord] = self.keys.expire(now_ms())
        replayed = self.replays.check(doc, tenant, now_ms())
        if replayed is not None:
            replayed.side[:0] = side
            return replayed
        early = self._before_deciding(doc, tenant, side)
        if isinstance(early, Outcome):
            return early
        return await self._decide(doc, tenant, early, side)

    def _before_deciding(self, doc: RequestDoc, tenant: str, side: list[SideRecord]) -> Outcome | Claim | None:
        """An answer that needs no decision (a refused adapter, a keyed duplicate), else the key's
        claim (None without a key)."""
        refused = refuse_adapter(doc, self.adapters)
        if refused is not None:  # it never runs: nothing is held or claimed
            out = adapter_refusal(self, doc, *refused)
            out.side = side
            return out
        if not (tenant and doc.idempotency_key):
            return None
        got = self.keys.claim(doc, tenant, now_ms(), side)
        if isinstance(got, Outcome):
            got.side[:0] = side
            return got
        side.append(self.changelog.claim(got))
        return got

    async def _decide(self, doc: RequestDoc, tenant: str, claim: Claim | None, side: list[SideRecord]) -> Outcome:
        limits = self.registry.limits_for(tenant)
        order = self._order(doc)
        a = self.ask_for(doc, order)
        t0 = time.monotonic()
        shares = self.book.shares_of(self.partition_of(tenant))
        others: list[Outcome] = []
        while True:
            state = self.book.states[tenant]
            others += self._roll(tenant, a.now_ms, shares, side)
            # waiting requests occupy processors; completions need free ones: at most half may wait
            room = self.queued[tenant] if sum(self.queued.values()) < self.max_waiting else limits.max_queue
            if decided_key(a.request_id, a.attempt) in state.settled:  # a copy redelivered after it was answered
                ev = self.evidence(doc, "already_answered", "a redelivered copy of an answered request: not decided again")
                out = Outcome.park(doc, side, ev)
                break
            lanes = self._lanes(tenant, limits, order)
            v = evaluate(state, limits, a, queued=room, lanes=lanes)
            waited_ms = int((time.monotonic() - t0) * 1000)
            if v.action == "admit":
                hold = admit(state, a, v.deployment, shares)
                side += self.changelog.changed(tenant, [hold], settled=False)
                out = self._admitted(doc, a, v, order, lanes, side, waited_ms=waited_ms, metered=True)
                break
            if v.action == "reject":
                until = a.now_ms + self.policy.remember_settled_ms
                state.settled[decided_key(a.request_id, a.attempt)] = until
                side.append(self.changelog.hold(tenant, Hold(a.request_id, a.now_ms, 0, 0.0, until, None, a.attempt), until))
                out = self._rejected(doc, v, claim, side, waited_ms=waited_ms)
                break
            await self._wait_for_change(tenant, min(v.retry_after_ms, a.expires_ms - a.now_ms))
            a = dataclasses.replace(a, now_ms=now_ms())
        out.others[:0] = others
        return out

    def _roll(self, tenant: str, at_ms: int, shares: int, side: list[SideRecord]) -> list[Outcome]:
        """Move the tenant's windows to `at_ms`: expired holds are settled (their changes into `side`),
        waiters woken; the owners of expired idempotency claims are answered (returned)."""
        state = self.book.states[tenant]
        expired = roll(state, at_ms, shares, self.policy.remember_settled_ms)
        side += [self.changelog.record(tenant, f"h/{tenant}/{k}", None) for k in forget_settled(state, at_ms)]
        if not expired:
            return []
        self._wake(tenant)
        side += self.changelog.changed(tenant, expired, settled=True)
        owned = self.keys.owned
        return self._lost([owned[h.request_id] for h in expired if h.request_id in owned], side)

    async def _wait_for_change(self, tenant: str, timeout_ms: int) -> None:
        """Wait for a completion of this tenant (or the window to move), counted as queued meanwhile."""
        self.queued[tenant] += 1
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                await self.changed[tenant].wait()
        except TimeoutError:
            pass
        finally:
            self.queued[tenant] -= 1

    def _lost(self, claims: list[Claim], side: list[SideRecord]) -> list[Outcome]:
        """Owners whose hold expired without a completion: their duplicates get an error, the key is free."""
        out: list[Outcome] = []
        for c in claims:
            resp = Response(request_id=c.request_id, status=Status.error, error_class="original_lost",
                            reason="the request owning this idempotency key never finished", answered_by=self.name)
            answers, records = self.keys.abandon(c, resp)
            out += answers
            side += records
        return out

    def _rejected(self, doc: RequestDoc, v: Verdict, claim: Claim | None, side: list[SideRecord], *,
                  waited_ms: int) -> Outcome:
        resp = Response(request_id=doc.request_id, status=Status.rejected, error_class=v.reason,
                        reason=v.detail, retry_after_ms=v.retry_after_ms or None, answered_by=self.name)
        ev = self.evidence(doc, "rejected", f"{v.reason}: {v.detail}",
                           scores={**v.remaining, "retry_after_ms": float(v.retry_after_ms), "waited_ms": float(waited_ms)})
        out = Outcome.answer(doc, resp, ev)
        out.side = side
        if claim is not None:  # it did not run: the key is free, its parked duplicates get this answer
            answers, records = self.keys.abandon(claim, resp)
            out.others += answers
            side += records
        return out

    def _admitted(self, doc: RequestDoc, a: Ask, v: Verdict | None, order: list[str], lanes: list[Lane] | None,
                  side: list[SideRecord], *, waited_ms: int, metered: bool) -> Outcome:
        chosen = v.deployment if v is not None else None
        deployments: list[str] = []
        if chosen is not None:  # fall back only where no limit applies, so a fallback never bypasses one
            gated = {ln.deployment for ln in lanes or [] if ln.gates}
            deployments = [chosen] + [d for d in order if d != chosen and d not in gated]
        reason = ("within limits" if metered else "no limits configured") + (f" on {chosen}" if chosen else "")
        sec = AdmissionSection(decision="admitted", reason=reason, tokens_reserved=a.tokens, cost_reserved_usd=a.cost_usd,
                               waited_ms=waited_ms, metered=metered, deployment=chosen, deployments=deployments,
                               policy_version=self.policy_version)
        doc = doc.model_copy(update={"admission": sec})
        remaining = v.remaining if v is not None else {}
        ev = self.evidence(doc, "admitted" if waited_ms == 0 else "admitted_after_wait", sec.reason,
                           scores={**remaining, "tokens_reserved": float(a.tokens), "cost_reserved_usd": a.cost_usd,
                                   "waited_ms": float(waited_ms)})
        out = Outcome.forward(doc, ev)
        out.side = side
        return out
