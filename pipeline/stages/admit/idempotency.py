"""Idempotency keys: the first request with a key claims it; duplicates get its result (at once if
known, else parked and answered when it arrives), or `in_progress` when they cannot wait.

A tenant holds at most `max_idempotency_claims` claims (each a sealed answer in admit's memory
and on `admit.state`): a new claim past it forgets the tenant's oldest finished one (that key
then runs afresh), and is refused `too_many_idempotency_keys` when none has finished."""

from __future__ import annotations

import hashlib
import heapq
from collections import defaultdict
from collections.abc import Callable

from pipeline.config.tenants import TenantLimits
from pipeline.contracts import Evidence, RequestDoc, Response, Status
from pipeline.contracts.admit import IdempotencyRecord
from pipeline.runtime.stage import Outcome, SideRecord
from pipeline.stages.admit.config import AdmitPolicy


def key_digest(idempotency_key: str, principal: str | None = None) -> str:
    """A claim's identity: the key as the authenticated principal used it. Two principals of one
    tenant who pick the same key never see each other's answer (claims are per tenant already)."""
    return hashlib.sha256(f"{principal or ''}\x00{idempotency_key}".encode()).hexdigest()[:32]


# An idempotency claim in memory is its changelog record (mutable: state, response and waiters change).
Claim = IdempotencyRecord


def _claim_ad(c: Claim) -> str:
    """What a sealed result is bound to: it opens only as this tenant's claim of this key."""
    return f"{c.tenant}/{c.key_digest}/{c.request_id}"


class IdempotencyKeys:
    """The claims of the tenants this worker owns: per tenant, key digest -> claim (oldest written
    first), which request owns which claim, and when finished claims expire. `record(claim, gone)`
    is the changelog's record of a claim (state.py); `evidence` and `answered_by` are the stage's."""

    def __init__(self, limits_for: Callable[[str], TenantLimits], policy: AdmitPolicy, answered_by: str,
                 evidence: Callable[..., Evidence], record: Callable[[Claim, bool], SideRecord]) -> None:
        self.limits_for, self.policy, self.answered_by = limits_for, policy, answered_by
        self.evidence, self.record = evidence, record
        self.claims: dict[str, dict[str, Claim]] = defaultdict(dict)  # tenant -> key digest -> claim
        self.owned: dict[str, Claim] = {}  # request_id -> the claim it owns
        self._expiry: list[tuple[int, str, str]] = []  # heap of (expires_ms, tenant, digest)

    def remember(self, c: Claim) -> None:
        claims = self.claims[c.tenant]
        claims.pop(c.key_digest, None)  # kept in the order last written: the oldest first
        claims[c.key_digest] = c
        if c.state == "in_progress":
            self.owned[c.request_id] = c
        heapq.heappush(self._expiry, (c.expires_ms, c.tenant, c.key_digest))

    def forget(self, tenants: list[str]) -> None:
        for t in tenants:
            for c in self.claims.pop(t, {}).values():
                if self.owned.get(c.request_id) is c:
                    del self.owned[c.request_id]

    def expire(self, now: int) -> list[SideRecord]:
        out = []
        while self._expiry and self._expiry[0][0] <= now:
            _, tenant, digest = heapq.heappop(self._expiry)
            c = self.claims.get(tenant, {}).get(digest)
            if c is not None and c.expires_ms <= now and c.state == "done":
                del self.claims[tenant][digest]
                out.append(self.record(c, True))
        return out

    def _duplicate(self, waiter: RequestDoc, c: Claim, resp: Response, decision: str) -> Outcome:
        answer = resp.model_copy(update={"duplicate_of": c.request_id})
        ev = self.evidence(waiter, decision, f"idempotency key of {c.request_id}: its result ({resp.status.value})")
        return Outcome.answer(waiter, answer, ev)

    def resolve(self, c: Claim, resp: Response, decision: str) -> tuple[list[Outcome], list[SideRecord]]:
        """The claim's owner ended: keep its result for the window and answer every parked duplicate."""
        self.owned.pop(c.request_id, None)
        c.state, c.response = "done", resp
        waiters, c.waiters = c.waiters, []
        return [self._duplicate(w, c, resp, decision) for w in waiters], [self.record(c, False)]

    def abandon(self, c: Claim, resp: Response) -> tuple[list[Outcome], list[SideRecord]]:
        """The owner did not run (rejected here): the key is free again; parked duplicates get the same answer."""
        self.owned.pop(c.request_id, None)
        self.claims[c.tenant].pop(c.key_digest, None)
        return [self._duplicate(w, c, resp, "duplicate_answered") for w in c.waiters], [self.record(c, True)]

    def _make_room(self, tenant: str, side: list[SideRecord]) -> bool:
        """Below the tenant's cap on claims, forgetting its oldest finished ones if need be (their
        tombstones into `side`); False when every claim held is still running."""
        claims = self.claims[tenant]
        cap = self.limits_for(tenant).max_idempotency_claims
        while len(claims) >= cap:
            oldest = next((c for c in claims.values() if c.state == "done"), None)
            if oldest is None:
                return False
            del claims[oldest.key_digest]
            side.append(self.record(oldest, True))
        return True

    def claim(self, doc: RequestDoc, tenant: str, now: int, side: list[SideRecord] | None = None) -> Outcome | Claim:
        """Claim the request's key, or decide for a duplicate: the original's result, park, or in_progress.
        Claims forgotten to make room go into `side`."""
        assert doc.idempotency_key is not None
        digest = key_digest(doc.idempotency_key, doc.principal)
        c = self.claims[tenant].get(digest)
        if c is not None and c.state == "done" and c.expires_ms <= now:
            c = None  # past the window: a new execution
        if c is None and not self._make_room(tenant, side if side is not None else []):
            resp = Response(request_id=doc.request_id, status=Status.rejected, error_class="too_many_idempotency_keys",
                            reason="this tenant holds as many running idempotency keys as it may; retry shortly",
                            retry_after_ms=1000, answered_by=self.answered_by)
            return Outcome.answer(doc, resp, self.evidence(doc, "rejected", "too_many_idempotency_keys"))
        if c is None:
            c = Claim(tenant=tenant, key_digest=digest, request_id=doc.request_id, state="in_progress", at_ms=now,
                      expires_ms=now + self.limits_for(tenant).idempotency_window_s * 1000)
            self.remember(c)
            return c
        if c.request_id == doc.request_id:
            return c  # the owner itself, redelivered
        if c.state == "done":
            assert c.response is not None
            return self._duplicate(doc, c, c.response, "duplicate_replayed")
        if any(w.request_id == doc.request_id for w in c.waiters):
            return Outcome.park(doc, [self.record(c, False)], self.evidence(doc, "duplicate_parked", "redelivered"))
        if (doc.deadline_ms is None or doc.deadline_ms > now) and len(c.waiters) < self.policy.max_duplicate_waiters:
            c.waiters.append(doc)
            return Outcome.park(doc, [self.record(c, False)],
                                self.evidence(doc, "duplicate_parked", f"waits for {c.request_id} (same idempotency key)"))
        resp = Response(request_id=doc.request_id, status=Status.rejected, error_class="in_progress",
                        reason=f"a request with this idempotency key ({c.request_id}) is still running",
                        retry_after_ms=1000, answered_by=self.answered_by)
        return Outcome.answer(doc, resp, self.evidence(doc, "rejected", f"in_progress: duplicate of {c.request_id}"))
