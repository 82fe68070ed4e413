"""admit's state as a changelog: every change is a record on `admit.state` (keyed by tenant, on
the tenant's admit partition), and a worker assigned a partition restores it before deciding."""

from __future__ import annotations

import logging
import time

from pydantic import BaseModel

from pipeline.contracts import AdmitStateRecord, Response
from pipeline.contracts.admit import (
    Buckets,
    HoldRecord,
    IdempotencyRecord,
    ShareWindow,
    TenantTotals,
)
from pipeline.runtime.codec import decode
from pipeline.runtime.stage import SideRecord
from pipeline.security.sealing import RestoreError, open_sealed, seal
from pipeline.stages.admit.idempotency import Claim, _claim_ad
from pipeline.stages.admit.policy import (
    Hold,
    Meter,
    Window,
    decided_key,
)

log = logging.getLogger(__name__)

STATE_TOPIC = "admit.state"


def _buckets(w: Window) -> Buckets:
    return [(s, n, t) for s, (n, t) in sorted(w.buckets.items())]


def _window(b: Buckets) -> Window:
    return Window({s: [n, t] for s, n, t in b})


class AdmitState:
    """The changelog half of AdmitStage: its records, and restore on assignment."""

    # changelog records --------------------------------------------------

    def _rec(self, tenant: str, key: str, value: BaseModel | None) -> SideRecord:
        return SideRecord(STATE_TOPIC, key.encode(), value, partition=self.partition_of(tenant))

    def _totals(self, tenant: str) -> TenantTotals:
        s = self.states[tenant]
        return TenantTotals(day=s.day, spent_day_usd=s.spent_day_usd, month=s.month, spent_month_usd=s.spent_month_usd,
                            window=_buckets(s.meter.window), lanes={d: _buckets(m.window) for d, m in s.lanes.items()})

    def _share(self, tenant: str, deployment: str | None) -> ShareWindow | None:
        m = self.shares.get(self.partition_of(tenant), {}).get(deployment or "")
        return None if m is None else ShareWindow(deployment=deployment or "", window=_buckets(m.window))

    def _hold(self, tenant: str, h: Hold, settled_until: int | None = None, *, with_totals: bool = False) -> SideRecord:
        settled = settled_until is not None
        return self._rec(tenant, f"h/{tenant}/{h.decided_key}", HoldRecord(
            tenant=tenant, request_id=h.request_id, at_ms=h.at_ms, tokens=h.tokens, cost_usd=h.cost_usd,
            expires_ms=settled_until if settled_until is not None else h.expires_ms, deployment=h.deployment,
            attempt=h.attempt, settled=settled, origin=self.request_ids.origin_of(tenant, h.decided_key),
            totals=self._totals(tenant) if with_totals else None,
            share=self._share(tenant, h.deployment) if with_totals else None))

    def _claim(self, c: Claim, gone: bool = False) -> SideRecord:
        value = None
        if not gone:  # as of now; the result is an un-masked answer: it rests on the topic sealed
            sealed = seal(c.response.model_dump(mode="json"), _claim_ad(c), self.keyring) if c.response else None
            value = c.model_copy(update={"waiters": list(c.waiters), "response": None, "response_sealed": sealed})
        return self._rec(c.tenant, f"i/{c.tenant}/{c.key_digest}", value)

    def _changed(self, tenant: str, holds: list[Hold], settled: bool) -> list[SideRecord]:
        """One record per hold that changed, each with the tenant's totals and its deployment share."""
        s = self.states[tenant]
        return [self._hold(tenant, h, s.settled.get(h.decided_key, 0) if settled else None, with_totals=True)
                for h in holds]

    async def on_assigned(self, partitions: list[int]) -> None:
        if self.reader is None or not partitions:
            return
        t0 = time.monotonic()
        data = await self.reader.read(partitions, self.policy.restore_timeout_s)
        self._forget(partitions)
        n = 0
        for p, records in data.items():
            for value in records.values():
                if value is not None:
                    self._restore(p, decode(value, AdmitStateRecord).root)
                    n += 1
        for tenant, state in self.states.items():  # in-flight sets are derived from the holds
            if self.partition_of(tenant) in partitions:
                for h in state.holds.values():
                    self._count_in_flight(tenant, h)
        self._log_restore(partitions, n, time.monotonic() - t0)

    def _restore(self, p: int, rec: BaseModel) -> None:
        if isinstance(rec, HoldRecord):
            if rec.origin is not None:  # remembered while its record lives (until its settled copy is forgotten)
                self.request_ids.restore(rec.tenant, decided_key(rec.request_id, rec.attempt), rec.origin,
                                         rec.at_ms + self.policy.remember_request_ids_ms)
            s = self.states[rec.tenant]
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
                self._shares(p).setdefault(rec.share.deployment, Meter()).window = _window(rec.share.window)
        elif isinstance(rec, IdempotencyRecord):
            if rec.response_sealed is not None:
                try:
                    rec.response = Response.model_validate(open_sealed(rec.response_sealed, _claim_ad(rec), self.keyring))
                except RestoreError:  # another stack's key: the claim is gone, the key runs afresh
                    log.warning("admit: an idempotency result does not open with this stack's keys; dropped")
                    return
                rec.response_sealed = None
            self._remember(rec)

    def _count_in_flight(self, tenant: str, h: Hold) -> None:
        s = self.states[tenant]
        s.meter.in_flight.add(h.request_id)
        if h.deployment is not None:
            s.lane(h.deployment).in_flight.add(h.request_id)
            share = self._shares(self.partition_of(tenant)).get(h.deployment)
            if share is not None:
                share.in_flight.add(h.request_id)

    def _log_restore(self, partitions: list[int], records: int, seconds: float) -> None:
        log.info("admit restored partitions %s: %d state records in %.2fs", partitions, records, seconds)

    async def on_revoked(self, partitions: list[int]) -> None:
        self._forget(partitions)

    def _forget(self, partitions: list[int]) -> None:
        gone = [t for t in self.states if self.partition_of(t) in partitions]
        for t in gone:
            del self.states[t]
        for t in [t for t in self.claims if self.partition_of(t) in partitions]:
            for c in self.claims.pop(t).values():
                if self.claim_of.get(c.request_id) is c:
                    del self.claim_of[c.request_id]
        self.request_ids.forget([t for t in self.request_ids.by_tenant if self.partition_of(t) in partitions])
        for p in partitions:
            self.shares.pop(p, None)

    def _shares(self, p: int) -> dict[str, Meter]:
        """Meters of this partition's shares of every deployment with global limits."""
        got = self.shares.get(p)
        if got is None:
            got = self.shares[p] = {name: Meter() for name, d in self.deployments.items() if d.limits.any()}
        return got
