"""admit's state as a changelog: every change is a record on `admit.state` (keyed by tenant, on
the tenant's admit partition), and a worker assigned a partition restores it before deciding."""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable

from pydantic import BaseModel

from pipeline.config.settings import Deployment
from pipeline.contracts import AdmitStateRecord, Response
from pipeline.contracts.admit import (
    Buckets,
    HoldRecord,
    IdempotencyRecord,
    ShareWindow,
    TenantTotals,
)
from pipeline.runtime.codec import decode
from pipeline.runtime.follow.changelog import ChangelogReader
from pipeline.runtime.stage import SideRecord
from pipeline.security.sealing import Keyring, RestoreError, open_sealed, seal
from pipeline.stages.admit.config import AdmitPolicy
from pipeline.stages.admit.idempotency import Claim, IdempotencyKeys, _claim_ad
from pipeline.stages.admit.policy import (
    Hold,
    Meter,
    TenantState,
    Window,
    decided_key,
)
from pipeline.stages.admit.request_ids import RequestIds

log = logging.getLogger(__name__)

STATE_TOPIC = "admit.state"


def _buckets(w: Window) -> Buckets:
    return [(s, n, t) for s, (n, t) in sorted(w.buckets.items())]


def _window(b: Buckets) -> Window:
    return Window({s: [n, t] for s, n, t in b})


class AdmitBook:
    """What admit meters for the partitions this worker owns: each tenant's state (windows, holds,
    budgets, settled requests) and each partition's share of every deployment with global limits."""

    def __init__(self, deployments: dict[str, Deployment], partition_of: Callable[[str], int]) -> None:
        self.deployments, self.partition_of = deployments, partition_of
        self.states: dict[str, TenantState] = defaultdict(TenantState)
        self.shares: dict[int, dict[str, Meter]] = {}  # partition -> deployment -> its share's meter

    def answered(self, tenant: str, key: str) -> bool:
        """Has admit answered this decided key (a request id and attempt) of the tenant?"""
        state = self.states.get(tenant)
        return state is not None and key in state.settled

    def shares_of(self, p: int) -> dict[str, Meter]:
        """Meters of this partition's shares of every deployment with global limits."""
        got = self.shares.get(p)
        if got is None:
            got = self.shares[p] = {name: Meter() for name, d in self.deployments.items() if d.limits.any()}
        return got

    def count_in_flight(self, tenant: str, h: Hold) -> None:
        s = self.states[tenant]
        s.meter.in_flight.add(h.request_id)
        if h.deployment is not None:
            s.lane(h.deployment).in_flight.add(h.request_id)
            share = self.shares_of(self.partition_of(tenant)).get(h.deployment)
            if share is not None:
                share.in_flight.add(h.request_id)

    def forget(self, tenants: list[str], partitions: list[int]) -> None:
        for t in tenants:
            self.states.pop(t, None)
        for p in partitions:
            self.shares.pop(p, None)


class AdmitChangelog:
    """Every change of admit's state as a record on `admit.state` (keyed `h/<tenant>/<decided key>`
    for holds and settled requests, `i/<tenant>/<key digest>` for idempotency claims, on the tenant's
    admit partition), and the state rebuilt from them when a worker is assigned a partition."""

    def __init__(self, book: AdmitBook, keys: IdempotencyKeys, ids: RequestIds, keyring: Keyring,
                 policy: AdmitPolicy) -> None:
        self.book, self.keys, self.ids, self.keyring, self.policy = book, keys, ids, keyring, policy

    def record(self, tenant: str, key: str, value: BaseModel | None) -> SideRecord:
        return SideRecord(STATE_TOPIC, key.encode(), value, partition=self.book.partition_of(tenant))

    def totals(self, tenant: str) -> TenantTotals:
        s = self.book.states[tenant]
        return TenantTotals(day=s.day, spent_day_usd=s.spent_day_usd, month=s.month, spent_month_usd=s.spent_month_usd,
                            window=_buckets(s.meter.window), lanes={d: _buckets(m.window) for d, m in s.lanes.items()})

    def share(self, tenant: str, deployment: str | None) -> ShareWindow | None:
        m = self.book.shares.get(self.book.partition_of(tenant), {}).get(deployment or "")
        return None if m is None else ShareWindow(deployment=deployment or "", window=_buckets(m.window))

    def hold(self, tenant: str, h: Hold, settled_until: int | None = None, *, with_totals: bool = False) -> SideRecord:
        settled = settled_until is not None
        return self.record(tenant, f"h/{tenant}/{h.decided_key}", HoldRecord(
            tenant=tenant, request_id=h.request_id, at_ms=h.at_ms, tokens=h.tokens, cost_usd=h.cost_usd,
            expires_ms=settled_until if settled_until is not None else h.expires_ms, deployment=h.deployment,
            attempt=h.attempt, settled=settled, origin=self.ids.origin_of(tenant, h.decided_key),
            totals=self.totals(tenant) if with_totals else None,
            share=self.share(tenant, h.deployment) if with_totals else None))

    def claim(self, c: Claim, gone: bool = False) -> SideRecord:
        value = None
        if not gone:  # as of now; the result is an un-masked answer: it rests on the topic sealed
            sealed = seal(c.response.model_dump(mode="json"), _claim_ad(c), self.keyring) if c.response else None
            value = c.model_copy(update={"waiters": list(c.waiters), "response": None, "response_sealed": sealed})
        return self.record(c.tenant, f"i/{c.tenant}/{c.key_digest}", value)

    def changed(self, tenant: str, holds: list[Hold], settled: bool) -> list[SideRecord]:
        """One record per hold that changed, each with the tenant's totals and its deployment share."""
        s = self.book.states[tenant]
        return [self.hold(tenant, h, s.settled.get(h.decided_key, 0) if settled else None, with_totals=True)
                for h in holds]

    async def restore(self, reader: ChangelogReader | None, partitions: list[int]) -> None:
        """Step 2 of the stage: read the partitions' changelog from the start and rebuild their tenants."""
        if reader is None or not partitions:
            return
        t0 = time.monotonic()
        data = await reader.read(partitions, self.policy.restore_timeout_s)
        self.forget(partitions)
        n = 0
        for p, records in data.items():
            for value in records.values():
                if value is not None:
                    self._restore_one(p, decode(value, AdmitStateRecord).root)
                    n += 1
        for tenant, state in self.book.states.items():  # in-flight sets are derived from the holds
            if self.book.partition_of(tenant) in partitions:
                for h in state.holds.values():
                    self.book.count_in_flight(tenant, h)
        log.info("admit restored partitions %s: %d state records in %.2fs", partitions, n, time.monotonic() - t0)

    def _restore_one(self, p: int, rec: BaseModel) -> None:
        if isinstance(rec, HoldRecord):
            if rec.origin is not None:  # remembered while its record lives (until its settled copy is forgotten)
                self.ids.restore(rec.tenant, decided_key(rec.request_id, rec.attempt), rec.origin,
                                 rec.at_ms + self.policy.remember_request_ids_ms)
            s = self.book.states[rec.tenant]
            if rec.settled:
                s.settled[decided_key(rec.request_id, rec.attempt)] = rec.expires_ms
            else:
                s.add_hold(Hold(rec.request_id, rec.at_ms, rec.tokens, rec.cost_usd, rec.expires_ms, rec.deployment,
                                rec.attempt))
            if rec.totals is not None:  # records come in offset order: the latest totals win
                t = rec.totals
                s.day, s.spent_day_usd, s.month, s.spent_month_usd = t.day, t.spent_day_usd, t.month, t.spent_month_usd
                s.meter.window = _window(t.window)
                for d, b in t.lanes.items():
                    s.lane(d).window = _window(b)
            if rec.share is not None:
                self.book.shares_of(p).setdefault(rec.share.deployment, Meter()).window = _window(rec.share.window)
        elif isinstance(rec, IdempotencyRecord):
            if rec.response_sealed is not None:
                try:
                    rec.response = Response.model_validate(open_sealed(rec.response_sealed, _claim_ad(rec), self.keyring))
                except RestoreError:  # another stack's key: the claim is gone, the key runs afresh
                    log.warning("admit: an idempotency result does not open with this stack's keys; dropped")
                    return
                rec.response_sealed = None
            self.keys.remember(rec)

    def forget(self, partitions: list[int]) -> None:
        """Revoked (or about to be restored): drop everything of these partitions' tenants."""
        gone = [t for t in set(self.book.states) | set(self.keys.claims) | set(self.ids.by_tenant)
                if self.book.partition_of(t) in partitions]
        self.book.forget(gone, partitions)
        self.keys.forget(gone)
        self.ids.forget(gone)
