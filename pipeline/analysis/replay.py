"""Replay: re-feed a topic range through a stage's policy and diff its decisions.

Protocol:
1. Resolve the range per partition: explicit start offsets, or a start time checked against each
   record's own timestamp (the embedded broker's offsets_for_times is unreliable, so we read from
   the partition start and skip earlier records); the end is an explicit offset/time, or the
   point where the partition stays idle for `idle_ms` (end_offsets() under-reports on Tansu).
2. Find the path from the topic to the stage (`replay_path`): the stage whose input the topic is
   (`requests`: the first stage), then the stages chained after it up to the one replayed. A chained
   stage's forwards never reached its own topic (docs/design.md, "Stage chains"), so its history is
   read from its chain's first topic and the stages before it re-decide with their live policies.
   A stage before it that `replay_reruns` something (generate calls the model again) is re-run only
   when the caller says so (`rerun=True`); otherwise the replay is refused, naming the split that
   keeps the stage's input in Kafka (`chain: false`).
3. Run the records through the path's handlers (StageHandler, chained as in a worker) with a
   replay_id; the replayed stage gets the new policy. Shadow: only evidence is produced (shadow=1);
   a forward inside the path is handed over in memory, nothing reaches callers or another topic.
4. Diff every replayed decision against the original evidence of the same stage and request.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from pipeline.app.assemble import topology_for
from pipeline.config.settings import Settings, kafka_kwargs
from pipeline.contracts import Evidence
from pipeline.runtime.handler import Item
from pipeline.runtime.outputs import make_producer
from pipeline.runtime.stage_handler import ReplayMode, StageHandler
from pipeline.runtime.topics import TopicNames
from pipeline.runtime.topology import Topology
from pipeline.stores.warehouse import QueryResult


class ReplayError(ValueError):
    pass


@dataclass
class RangeSpec:
    start_offsets: dict[int, int] | None = None
    start_ms: int | None = None
    end_offsets: dict[int, int] | None = None  # exclusive
    end_ms: int | None = None  # exclusive


def parse_offsets(text: str) -> dict[int, int]:
    out = {}
    for part in text.split(","):
        p, sep, o = part.strip().partition(":")
        if not sep or not p.isdigit() or not o.lstrip("-").isdigit():
            raise ReplayError(f"expected PARTITION:OFFSET[,PARTITION:OFFSET...], got {text!r}")
        out[int(p)] = int(o)
    return out


def parse_time_ms(text: str) -> int:
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        raise ReplayError(f"expected an ISO-8601 time, got {text!r}") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() * 1000)


def parse_bound(text: str | None) -> tuple[dict[int, int] | None, int | None]:
    """`P:O[,P:O...]` (offsets) or an ISO-8601 time."""
    if text is None:
        return None, None
    try:
        return parse_offsets(text), None
    except ReplayError:
        return None, parse_time_ms(text)


def replay_path(topology: Topology, names: TopicNames, full_topic: str, stage: str, *, rerun: bool = False) -> list[str]:
    """Step 2: the stages a record of `full_topic` passes to reach `stage` inside one chain."""
    topology.spec(stage)  # an unknown stage: the topology's error
    entry = next((n for n in topology.order if names.stage_input(n) == full_topic), None)
    if full_topic == names.requests:
        entry = topology.first
    if entry is None or entry == stage:
        return [stage]  # a stage's own topic, or one no stage reads: the stage alone, as before chains
    order = topology.order
    if order.index(entry) > order.index(stage):
        raise ReplayError(f"{full_topic} is read by {entry!r}, after {stage!r}: replay {stage!r} from its own topic")
    path = order[order.index(entry):order.index(stage) + 1]
    apart = [n for n in path[1:] if topology.head_of(n) != topology.head_of(entry)]
    if apart:
        raise ReplayError(f"stage {apart[0]!r} is not chained to {entry!r} in this topology: its records are on its "
                          f"own topic, {names.stage_input(apart[0])}; replay {stage!r} from there")
    for name in path[:-1]:
        reruns = topology.stage_class(name).replay_reruns
        if reruns and not rerun:
            raise ReplayError(f"{stage!r} runs behind {name!r} in a chain, so its input was never in Kafka: replaying "
                              f"it re-runs {name!r}, which {reruns}. Pass --rerun to do that (the diff is then "
                              f"{stage!r}'s decisions on new {name!r} outputs), or set `chain: false` on "
                              f"{order[order.index(name) + 1]!r} to keep its input on a topic")
    return path


@dataclass
class ReplayReport:
    replay_id: str
    stage: str
    topic: str
    shadow: bool
    through: list[str] = field(default_factory=list)  # the path's stages, the replayed one last
    records: int = 0
    decisions: int = 0
    compared: int = 0
    changed: int = 0
    without_original: int = 0
    transitions: Counter = field(default_factory=Counter)  # (stage, "old -> new")
    by_reason: Counter = field(default_factory=Counter)  # (stage, new reason) of changed decisions
    examples: list[dict[str, str]] = field(default_factory=list)
    changed_ids: list[str] = field(default_factory=list)  # request ids whose main-stage decision changed

    def as_json(self) -> dict[str, Any]:
        return {
            "replay_id": self.replay_id, "stage": self.stage, "topic": self.topic, "shadow": self.shadow,
            "through": self.through, "records": self.records, "decisions": self.decisions, "compared": self.compared,
            "changed": self.changed, "unchanged": self.compared - self.changed,
            "without_original": self.without_original,
            "changes": _nest(self.transitions), "changed_by_reason": _nest(self.by_reason),
            "examples": self.examples, "changed_request_ids": sorted(self.changed_ids),
        }


def _nest(counts: Counter) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (stage, what), n in sorted(counts.items()):
        out.setdefault(stage, {})[what] = n
    return out


async def _read_range(consumer: AIOKafkaConsumer, tps: list[TopicPartition], rng: RangeSpec, idle_ms: int):
    """Yield batches of records within the range, partition by partition bounds checked per record."""
    for tp in tps:
        start = (rng.start_offsets or {}).get(tp.partition)
        if start is None:
            await consumer.seek_to_beginning(tp)
        else:
            consumer.seek(tp, start)
    open_tps = set(tps)
    idle = 0.0
    while open_tps:
        async with asyncio.timeout(30):
            batches = await consumer.getmany(*open_tps, timeout_ms=200, max_records=500)
        got = [r for recs in batches.values() for r in recs]
        if not got:
            idle += 200
            if idle >= idle_ms:
                return
            continue
        idle = 0.0
        out = []
        for tp, recs in batches.items():
            for r in recs:
                end = (rng.end_offsets or {}).get(tp.partition)
                if (end is not None and r.offset >= end) or (rng.end_ms is not None and r.timestamp >= rng.end_ms):
                    open_tps.discard(tp)
                    consumer.pause(tp)
                    break
                if rng.start_ms is not None and r.timestamp < rng.start_ms:
                    continue
                out.append(Item(tp, r, 0))
        if out:
            yield out


async def replay(
    settings: Settings,
    bootstrap: str,
    *,
    topic: str,
    stage: str,
    rng: RangeSpec,
    policy: dict[str, Any] | None,
    shadow: bool,
    replay_id: str | None,
    query: Callable[[str, dict[str, Any]], QueryResult],
    idle_ms: int = 1500,
    partitions: list[int] | None = None,
    rerun: bool = False,
) -> ReplayReport:
    names = TopicNames(settings.topic_prefix)
    full_topic = topic if topic.startswith(settings.topic_prefix) else names(topic)
    replay_id = replay_id or f"replay-{uuid.uuid4().hex[:12]}"
    topology = topology_for(settings)
    path = replay_path(topology, names, full_topic, stage, rerun=rerun)
    decisions: list[Evidence] = []
    mode = ReplayMode(replay_id, shadow)
    handlers = [StageHandler(topology.build(name, policy if name == stage else None, bootstrap), topology, names,
                             f"replay:{replay_id}", replay=mode, on_evidence=decisions.extend) for name in path]
    handler = handlers[0]
    for prev, nxt in zip(handlers, handlers[1:]):
        prev.chain(nxt)
    report = ReplayReport(replay_id, stage, full_topic, shadow, path)
    producer: AIOKafkaProducer = make_producer(settings, bootstrap)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=5,
                                **kafka_kwargs(settings.kafka))
    await producer.start()
    await consumer.start()
    await asyncio.sleep(0)  # aiokafka: a consumer stopped before its first tick raises CancelledError
    try:
        available = consumer.partitions_for_topic(full_topic) or await _partitions(consumer, full_topic)
        chosen = sorted(rng.start_offsets) if rng.start_offsets else (partitions or sorted(available))
        unknown = set(chosen) - set(available)
        if unknown:
            raise ReplayError(f"{full_topic} has no partition(s) {sorted(unknown)}")
        tps = [TopicPartition(full_topic, p) for p in chosen]
        consumer.assign(tps)
        await handler.start(producer)
        try:
            async for items in _read_range(consumer, tps, rng, idle_ms):
                report.records += len(items)
                await handler.handle(items)
        finally:
            await handler.stop()
    finally:
        await consumer.stop()
        await producer.stop()
    report.decisions = len(decisions)
    _diff(report, decisions, query)
    return report


async def _partitions(consumer: AIOKafkaConsumer, topic: str) -> set[int]:
    await consumer.topics()  # refresh metadata
    parts = consumer.partitions_for_topic(topic)
    if not parts:
        raise ReplayError(f"topic {topic} does not exist")
    return parts


def _outcome(decision: str, variant: str) -> str:
    """What a diff compares: the decision, and the experiment variant when there is one (a replay
    with other weights changes the variant, not the route)."""
    return f"{decision}@{variant}" if variant else decision


def _diff(report: ReplayReport, decisions: list[Evidence], query: Callable[[str, dict[str, Any]], QueryResult]) -> None:
    """Compare every replayed row with the original row of the same (request_id, attempt, stage);
    a stage may write several rows (route writes `route` and `route.placement`)."""
    replayed = {(e.request_id, e.attempt, e.stage): e for e in decisions if e.step == 0}
    after = {key: _outcome(e.decision, e.labels.get("variant", "")) for key, e in replayed.items()}
    if not replayed:
        return
    ids = sorted({rid for rid, _, _ in replayed})
    stages = sorted({st for _, _, st in replayed})
    original: dict[tuple[str, int, str], tuple[str, str]] = {}
    for chunk in range(0, len(ids), 1000):
        res = query(
            "SELECT request_id, attempt, stage, decision, reason, labels['variant'] FROM decisions FINAL "
            "WHERE stage IN {stages:Array(String)} AND replay_id = '' AND step = 0 AND request_id IN {ids:Array(String)}",
            {"stages": stages, "ids": ids[chunk:chunk + 1000]},
        )
        for rid, attempt, stage, decision, reason, variant in res.rows:
            original[(rid, int(attempt), stage)] = (_outcome(decision, variant), reason)
    for key, ev in sorted(replayed.items()):
        before = original.get(key)
        if before is None:
            report.without_original += 1
            continue
        report.compared += 1
        if before[0] != after[key]:
            report.changed += 1
            report.transitions[(ev.stage, f"{before[0]} -> {after[key]}")] += 1
            report.by_reason[(ev.stage, ev.reason)] += 1
            if ev.stage == report.stage:
                report.changed_ids.append(key[0])
            if len(report.examples) < 10:
                report.examples.append({"request_id": key[0], "stage": ev.stage, "before": before[0],
                                        "after": after[key], "reason_before": before[1], "reason_after": ev.reason})
