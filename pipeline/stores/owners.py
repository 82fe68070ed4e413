"""Whose request (or episode) is it: the tenants the warehouse's `requests` table names for it.

Feedback may only be given by the tenant that made the request. `requests` is the durable record
of every answer, kept longer than any topic, so feedback days later is checked the same way as
feedback a second later; the one cost is the sink's lag, which the check waits out briefly.

Bounded cost (issue 35, finding 9): an unknown target costs at most three lookups (at once, at a
quarter of the wait, at its end), not one every 0.25 s; an episode is looked up among the asking
tenant's rows only (the key's prefix; another tenant's episode is unknown to it, never a 403 that
says someone used the id); both paths meter feedback per tenant first (registries/metering.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Literal

from pipeline.contracts.feedback import Refusal
from pipeline.stores.warehouse import QueryResult

Verdict = Literal["ok", "forbidden", "unknown"]
# Ids are the caller's: two tenants may both have answered requests with one id, each its own row
# (`requests` is keyed by tenant, request_id). A row without a tenant (refused before mask knew who
# sent it) belongs to nobody.
_SQL = {
    "request": "SELECT DISTINCT tenant_id FROM requests WHERE request_id = {id:String} AND replay_id = '' "
               "AND tenant_id != ''",
    "episode": "SELECT tenant_id FROM requests WHERE tenant_id = {tenant:String} AND episode_id = {id:String} "
               "AND replay_id = '' AND tenant_id != '' LIMIT 1",
}
ASK_AT = (0.0, 0.25, 1.0)  # when an unknown target is looked up, as fractions of the wait


def verdict(tenant: str, owners: set[str]) -> Verdict:
    """ok: the tenant made it (an episode id two tenants chose is each one's own); forbidden: only
    other tenants did; unknown: nobody, yet."""
    if tenant in owners:
        return "ok"
    return "forbidden" if owners else "unknown"


def owner_refusal(v: Verdict, kind: str) -> Refusal | None:
    if v == "forbidden":
        return Refusal("forbidden", 403, f"the {kind} belongs to another tenant")
    if v == "unknown":
        return Refusal("unknown_target", 404, f"no answered {kind} with this id")
    return None


class Owners:
    def __init__(self, query: Callable[[str, dict[str, Any]], QueryResult], wait_s: float = 5.0) -> None:
        self.query = query
        self.wait_s = wait_s

    def owners(self, kind: Literal["request", "episode"], target_id: str, tenant: str) -> set[str]:
        params = {"id": target_id, **({"tenant": tenant} if kind == "episode" else {})}
        return {str(r[0]) for r in self.query(_SQL[kind], params).rows}

    async def check(self, tenant: str, kind: Literal["request", "episode"], target_id: str) -> Verdict:
        """The verdict, asked again (ASK_AT) within `wait_s` while the target is unknown (an answer
        a moment old may still be on its way to the warehouse)."""
        start = time.monotonic()
        v: Verdict = "unknown"
        for at in ASK_AT if self.wait_s > 0 else (0.0,):
            await asyncio.sleep(max(0.0, start + at * self.wait_s - time.monotonic()))
            v = verdict(tenant, await asyncio.to_thread(self.owners, kind, target_id, tenant))
            if v != "unknown":
                return v
        return v
