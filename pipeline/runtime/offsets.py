"""Ordered commits: an offset becomes committable only when every record before it is done."""

from __future__ import annotations

from collections import deque

from aiokafka import TopicPartition


class PartitionTracker:
    def __init__(self) -> None:
        self._pending: deque[int] = deque()  # offsets in arrival (= offset) order
        self._done: set[int] = set()
        self._last: int | None = None  # highest offset tracked
        self.committable: int | None = None  # next offset to read; all before it are done

    def track(self, offset: int) -> None:
        self._pending.append(offset)
        self._last = offset

    def done(self, offset: int) -> None:
        self._done.add(offset)
        while self._pending and self._pending[0] in self._done:
            head = self._pending.popleft()
            self._done.discard(head)
            self.committable = head + 1

    @property
    def in_flight(self) -> int:
        return len(self._pending)


class OffsetTracker:
    """Per-partition trackers; `reset` on assignment, `forget` on revocation."""

    def __init__(self) -> None:
        self._parts: dict[TopicPartition, PartitionTracker] = {}
        self._committed: dict[TopicPartition, int] = {}

    def reset(self, tp: TopicPartition) -> None:
        self._parts[tp] = PartitionTracker()
        self._committed.pop(tp, None)

    def forget(self, tp: TopicPartition) -> None:
        self._parts.pop(tp, None)
        self._committed.pop(tp, None)

    def owned(self) -> list[TopicPartition]:
        return list(self._parts)

    def owns(self, tp: TopicPartition) -> bool:
        return tp in self._parts

    def track(self, tp: TopicPartition, offset: int) -> None:
        self._parts[tp].track(offset)

    def done(self, tp: TopicPartition, offset: int) -> None:
        part = self._parts.get(tp)
        if part is not None:  # revoked meanwhile: the new owner re-reads it
            part.done(offset)

    def to_commit(self, tps: set[TopicPartition] | None = None) -> dict[TopicPartition, int]:
        """Offsets that advanced since the last `mark_committed`."""
        out = {}
        for tp, part in self._parts.items():
            if tps is not None and tp not in tps:
                continue
            if part.committable is not None and part.committable != self._committed.get(tp):
                out[tp] = part.committable
        return out

    def mark_committed(self, offsets: dict[TopicPartition, int]) -> None:
        for tp, off in offsets.items():
            if tp in self._parts:
                self._committed[tp] = off

    def in_flight(self, tps: set[TopicPartition] | None = None) -> int:
        return sum(p.in_flight for tp, p in self._parts.items() if tps is None or tp in tps)
