"""Topic registry (topics/topics.yaml) and its idempotent application to a broker."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from pipeline.contracts.resources import topics_file


@dataclass(frozen=True)
class TopicSpec:
    name: str  # registry name, without prefix
    partitions: int
    key: str
    retention_ms: int
    cleanup_policy: str
    value_schema: str | None
    replication_factor: int = 1
    # a stage input only: why a chain must end before this stage (a key or scaling-unit change);
    # None: the stage joins the previous stage's chain by default (docs/design.md, "Stage chains")
    boundary: str | None = None

    def configs(self) -> dict[str, str]:
        return {"retention.ms": str(self.retention_ms), "cleanup.policy": self.cleanup_policy}


def load_registry(path: Path | None = None) -> dict[str, TopicSpec]:
    raw = yaml.safe_load((path or topics_file()).read_text())
    defaults = raw.get("defaults", {})
    specs: dict[str, TopicSpec] = {}
    for name, body in raw["topics"].items():
        specs[name] = TopicSpec(name=name, **{**defaults, **body})
    return specs


class TopicNames:
    """Maps registry names to the broker's topic names under one configurable prefix."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def registry_name(self, topic: str) -> str:
        """`llmpipe.admit.release` -> `admit.release`."""
        return topic[len(self.prefix):] if topic.startswith(self.prefix) else topic

    def __call__(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def stage_input(self, stage: str) -> str:
        return self(f"stage.{stage}")

    @property
    def requests(self) -> str:
        return self("requests")

    @property
    def responses(self) -> str:
        return self("responses")

    @property
    def evidence(self) -> str:
        return self("evidence")

    @property
    def rollouts(self) -> str:
        return self("rollouts")

    @property
    def dlq(self) -> str:
        return self("dlq")

    @property
    def deltas(self) -> str:
        return self("deltas")

    @property
    def cancel(self) -> str:
        return self("cancel")

    @property
    def admit_release(self) -> str:
        return self("admit.release")

    @property
    def feedback(self) -> str:
        return self("feedback")

    @property
    def feedback_accepted(self) -> str:
        return self("feedback.accepted")


@dataclass
class ApplyResult:
    created: list[str]
    existing: list[str]


async def apply_topics(
    bootstrap: str, prefix: str, registry: dict[str, TopicSpec] | None = None, client_kwargs: dict | None = None
) -> ApplyResult:
    """Create every registry topic that is missing. Existing topics are left as they are.
    `client_kwargs`: the brokers' security options (KafkaSecurity.client_kwargs())."""
    registry = registry if registry is not None else load_registry()
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15000, **(client_kwargs or {}))
    await admin.start()
    try:
        present = set(await admin.list_topics())
        result = ApplyResult(created=[], existing=[])
        missing = []
        for spec in registry.values():
            full = prefix + spec.name
            if full in present:
                result.existing.append(full)
            else:
                missing.append(
                    NewTopic(
                        full, spec.partitions, spec.replication_factor, topic_configs=spec.configs()
                    )
                )
        for topic in missing:  # one by one: a concurrent creator must not fail the whole batch
            try:
                await admin.create_topics([topic], timeout_ms=15000)
                result.created.append(topic.name)
            except TopicAlreadyExistsError:
                result.existing.append(topic.name)
        return result
    finally:
        await admin.close()


async def repair_topics(
    bootstrap: str, prefix: str, registry: dict[str, TopicSpec] | None = None, client_kwargs: dict | None = None,
    tries: int = 5,
) -> list[str]:
    """Registry topics whose partition count is wrong, deleted and created again; returns their names.

    Only for a broker that just lost its storage (the embedded one, restarted): it creates a topic
    with 4 partitions when any client asks for one it lacks, and every client of the stack asks as it
    reconnects, often before `apply_topics` ran. Their records are gone with the old broker anyway.
    A client may auto-create a topic again between the delete and the create: then it is tried again."""
    registry = registry if registry is not None else load_registry()
    want = {prefix + spec.name: spec for spec in registry.values()}
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15000, **(client_kwargs or {}))
    await admin.start()
    repaired: list[str] = []
    try:
        for _ in range(tries):
            described = await admin.describe_topics(list(want))
            wrong = [t["topic"] for t in described
                     if t["topic"] in want and len(t["partitions"]) != want[t["topic"]].partitions]
            if not wrong:
                return repaired
            await admin.delete_topics(wrong)
            for name in wrong:
                spec = want[name]
                try:
                    await admin.create_topics([NewTopic(name, spec.partitions, spec.replication_factor,
                                                        topic_configs=spec.configs())], timeout_ms=15000)
                except TopicAlreadyExistsError:
                    pass  # auto-created again in between: the next round checks it
                if name not in repaired:
                    repaired.append(name)
        raise RuntimeError(f"topics still have the wrong partition count after {tries} repairs")
    finally:
        await admin.close()
