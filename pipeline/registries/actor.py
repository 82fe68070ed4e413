"""The actor weight lifecycle as plain state over `control` records: which revisions were prepared,
what every replica reported, which one is active, and whether a revision may be activated (the
barrier: every replica validated it, none rejected it). generate workers and `llmpipe actor` both
replay `control` into an ActorBook."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pipeline.contracts.actor import (
    ActorActivated,
    ActorPrepared,
    ActorRejected,
    ActorReplicaReport,
    ActorSpec,
    ValidationPrompt,
)


@dataclass
class ActorBook:
    prepared: dict[str, ActorSpec] = field(default_factory=dict)
    reports: dict[str, dict[str, str]] = field(default_factory=dict)  # revision -> replica -> last state
    active: str | None = None
    activations: list[str | None] = field(default_factory=list)  # every activation, in order
    rejected: dict[str, str] = field(default_factory=dict)  # revision -> reason

    def apply(self, record: object) -> bool:
        if isinstance(record, ActorPrepared):
            self.prepared[record.spec.revision] = record.spec
        elif isinstance(record, ActorReplicaReport):
            self.reports.setdefault(record.revision, {})[record.replica] = record.state
        elif isinstance(record, ActorActivated):
            self.active = record.revision
            self.activations.append(record.revision)
        elif isinstance(record, ActorRejected):
            self.rejected[record.revision] = record.reason
        else:
            return False
        return True

    def barrier(self, revision: str, replicas: int) -> tuple[bool, str]:
        """(True, ...) once `replicas` replicas validated `revision`; (False, why) otherwise."""
        if revision not in self.prepared:
            return False, f"revision {revision} was never prepared"
        if revision in self.rejected:
            return False, f"revision {revision} was rejected: {self.rejected[revision]}"
        states = self.reports.get(revision, {})
        refused = sorted(r for r, st in states.items() if st == "rejected")
        if refused:
            return False, f"rejected by {', '.join(refused)}"
        validated = sum(1 for st in states.values() if st in ("validated", "active"))
        if validated < replicas:
            return False, f"{validated} of {replicas} replicas validated"
        return True, f"{validated} replicas validated"

    def switched(self, revision: str, replicas: int) -> tuple[bool, str]:
        """(True, ...) once `replicas` replicas report `revision` active: each applied the activation,
        so a request a replica takes from then on samples it."""
        active = sorted(r for r, st in self.reports.get(revision, {}).items() if st == "active")
        if len(active) < replicas:
            return False, f"{len(active)} of {replicas} replicas switched"
        return True, f"{len(active)} replicas switched"

    def rollback_target(self) -> str | None:
        """The revision active before the current one, skipping rejected ones (None: the base model)."""
        for rev in reversed(self.activations[:-1]):
            if rev != self.active and (rev is None or rev not in self.rejected):
                return rev
        return None


def validation_failure(check: ValidationPrompt, text: str) -> str | None:
    """Why `text` fails the check (None: it passes)."""
    got = text.strip()
    want = check.expected.strip()
    ok = got == want if check.match == "exact" else got.startswith(want) if check.match == "prefix" else \
        re.search(check.expected, got) is not None
    return None if ok else f"{check.prompt[:40]!r}: expected {check.match} {want[:60]!r}, got {got[:60]!r}"
