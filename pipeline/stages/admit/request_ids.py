"""Request ids a tenant has used: a second record with an id admit already took is a replay.

admit's input is keyed by tenant, so one worker sees every request of a tenant. For each
(request_id, attempt) it remembers the record the request entered by (`origin`: the `requests`
partition and offset, stamped by the runtime), for `remember_request_ids_ms`:

- the same record again (a redelivery after a crash or a rebalance, or a copy mask forwarded
  twice) goes on as before: admit's holds and settled requests make it run and count once;
- another record with the same id is a replay (a captured request published again). Until the
  first one is answered its answer is still to come on the reply_to it was signed with, so the
  copy is dropped (evidence only: a second answer to the same id could reach the caller first);
  after that it is answered `duplicate_request`, with no tenant (its `requests` row must not
  replace the original's), and its evidence is filed under `admit.replay`.

The window must outlast the door's assertion age (mask refuses older ones), so a replay is
refused here or there. Memory is bounded per tenant (`max_request_ids`, oldest forgotten first).
Ids are per tenant: another tenant's id never collides here. A record without `origin` (published
past the entry topic) has nothing to tell by and is not checked.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.config.tenants import TenantLimits
from pipeline.contracts import Evidence, RequestDoc, Response, Status
from pipeline.runtime.stage import Outcome
from pipeline.stages.admit.config import AdmitPolicy
from pipeline.stages.admit.policy import decided_key


@dataclass
class Seen:
    origin: str  # `<partition>:<offset>` of the `requests` record
    until_ms: int


class RequestIds:
    """Per tenant, (request_id, attempt) -> the record that used it first, oldest first."""

    def __init__(self) -> None:
        self.by_tenant: dict[str, OrderedDict[str, Seen]] = defaultdict(OrderedDict)

    def take(self, tenant: str, key: str, origin: str, now_ms: int, until_ms: int, cap: int) -> Seen | None:
        """The record that took `key` before, when `origin` is another record (a replay); else None,
        and `key` is remembered as taken by `origin`."""
        ids = self.by_tenant[tenant]
        while ids:  # entries come in time order: the expired ones are at the front
            first = next(iter(ids.values()))
            if first.until_ms > now_ms:
                break
            ids.popitem(last=False)
        got = ids.get(key)
        if got is not None:
            return got if got.origin != origin else None
        ids[key] = Seen(origin, until_ms)
        while len(ids) > cap:
            ids.popitem(last=False)
        return None

    def origin_of(self, tenant: str, key: str) -> str | None:
        got = self.by_tenant.get(tenant, {}).get(key)
        return got.origin if got is not None else None

    def restore(self, tenant: str, key: str, origin: str, until_ms: int) -> None:
        ids = self.by_tenant[tenant]
        if key not in ids:
            ids[key] = Seen(origin, until_ms)

    def forget(self, tenants: list[str]) -> None:
        for t in tenants:
            self.by_tenant.pop(t, None)


class Replays:
    """Replayed request ids, for the tenants this worker owns (the rules above). `answered(tenant, key)`
    says whether admit has answered that (request_id, attempt); `evidence` and `name` are the stage's."""

    def __init__(self, limits_for: Callable[[str], TenantLimits], policy: AdmitPolicy, name: str,
                 evidence: Callable[..., Evidence], answered: Callable[[str, str], bool]) -> None:
        self.limits_for, self.policy, self.name = limits_for, policy, name
        self.evidence, self.answered = evidence, answered
        self.ids = RequestIds()

    def check(self, doc: RequestDoc, tenant: str, now_ms: int) -> Outcome | None:
        """None: a request seen for the first time (or its own record again); else the replay's end."""
        if doc.origin is None:
            return None
        key = decided_key(doc.request_id, doc.attempt)
        first = self.ids.take(tenant, key, doc.origin, now_ms, now_ms + self.policy.remember_request_ids_ms,
                              self.limits_for(tenant).max_request_ids)
        if first is None:
            return None
        if not self.answered(tenant, key):  # its one answer is still to come: no second one
            return Outcome.park(doc, [], self._evidence(doc, "duplicate_dropped",
                                                        f"id taken by record {first.origin}, still running"))
        # answered with no tenant, like any record nobody vouches for: its row in `requests` never
        # replaces the tenant's own answer's, and there is nothing for admit to settle
        resp = Response(request_id=doc.request_id, status=Status.rejected, error_class="duplicate_request",
                        answered_by=self.name,
                        reason="this request_id was already used and answered; a new request needs a new id")
        return Outcome.answer(doc.model_copy(update={"tenant_id": None}), resp,
                              self._evidence(doc, "rejected", f"duplicate_request: id taken by record {first.origin}"))

    def _evidence(self, doc: RequestDoc, decision: str, reason: str) -> Evidence:
        """Filed under `admit.replay`: the original's own admit row (same id and attempt) stays as it was."""
        return self.evidence(doc, decision, reason).model_copy(update={"stage": f"{self.name}.replay"})
