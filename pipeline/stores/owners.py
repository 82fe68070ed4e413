"""Whose request (or episode) is it: the tenants the warehouse's `requests` table names for it.

Feedback may only be given by the tenant that made the request. `requests` is the durable record
of every answer, kept longer than any topic, so feedback days later is checked the same way as
feedback a second later; the one cost is the sink's lag, which the check waits out briefly.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Literal

from pipeline.contracts.feedback import Refusal
from pipeline.stores.warehouse import QueryResult

Verdict = Literal["ok", "forbidden", "unknown"]
_SQL = {
    "request": "SELECT DISTINCT tenant_id FROM requests WHERE request_id = {id:String} AND replay_id = ''",
    "episode": "SELECT DISTINCT tenant_id FROM requests WHERE episode_id = {id:String} AND replay_id = ''",
}


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
    def __init__(self, query: Callable[[str, dict[str, Any]], QueryResult], wait_s: float = 5.0,
                 poll_s: float = 0.25) -> None:
        self.query = query
        self.wait_s = wait_s
        self.poll_s = poll_s

    def owners(self, kind: Literal["request", "episode"], target_id: str) -> set[str]:
        return {str(r[0]) for r in self.query(_SQL[kind], {"id": target_id}).rows}

    async def check(self, tenant: str, kind: Literal["request", "episode"], target_id: str) -> Verdict:
        """The verdict, asking again for up to `wait_s` while the target is unknown (an answer a
        moment old may still be on its way to the warehouse)."""
        deadline = time.monotonic() + self.wait_s
        while True:
            v = verdict(tenant, await asyncio.to_thread(self.owners, kind, target_id))
            if v != "unknown" or time.monotonic() >= deadline:
                return v
            await asyncio.sleep(self.poll_s)
