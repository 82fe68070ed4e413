"""After the embedded broker restarted, every consumer that keeps its own position reads from 0.

A restarted embedded broker's logs start again at offset 0. A consumer with assigned partitions
(no group: the front door's replies and deltas, the control and cancel followers) keeps its old
position and would skip the new log's first records: Tansu answers a fetch past the end with
nothing, not OffsetOutOfRange, and reports its high watermark short after multi-record batches,
so a consumer cannot tell by itself (both measured). Group consumers need nothing: the new broker
knows no group, so they rejoin and start from the earliest offset.

Protocol:

1. The supervisor's BrokerKeeper, once the new broker answers and before it applies the topics,
   calls `bump(path)`: the epoch file (DATA_DIR/run/broker.epoch) gets the next number, and this
   process's consumers are rewound at once.
2. Every other process of the stack runs an `EpochWatch` on that file; a new number rewinds its
   consumers (within `check_s`). The same watch keeps the process's produce gate as the gate file
   says (runtime/broker/gate.py).
3. Consumers take part with `rewind_on_restart(consumer)`: each of their assigned partitions is
   sought to offset 0. Group members take part with `tell_on_restart(member)`: its
   `broker_restarted()` is called, and it reads every partition of its next assignment from 0 (a
   commit of the old generation can reach the new broker after its topics exist, and would make the
   rejoined member skip the new log's first records: seen once in six restarts). Both are held
   weakly: a stopped one drops out.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from pathlib import Path
from typing import Protocol

from aiokafka import AIOKafkaConsumer

from pipeline.runtime.broker import gate
from pipeline.runtime.broker.gate import GATE_FILE
from pipeline.runtime.service import BackgroundTask

log = logging.getLogger(__name__)

EPOCH_FILE = "run/broker.epoch"
_CONSUMERS: weakref.WeakSet[AIOKafkaConsumer] = weakref.WeakSet()
class GroupMember(Protocol):
    def broker_restarted(self) -> None: ...


_MEMBERS: weakref.WeakSet[GroupMember] = weakref.WeakSet()


def rewind_on_restart(consumer: AIOKafkaConsumer) -> None:
    """Step 3."""
    _CONSUMERS.add(consumer)


def tell_on_restart(member: GroupMember) -> None:
    """Step 3, for an object with a `broker_restarted()` method (a group member)."""
    _MEMBERS.add(member)


def rewind_all() -> int:
    """Seek every registered consumer's assigned partitions to 0 and tell every registered group
    member; returns how many partitions were sought."""
    for member in list(_MEMBERS):
        member.broker_restarted()
    n = 0
    for consumer in list(_CONSUMERS):
        try:
            for tp in consumer.assignment():
                consumer.seek(tp, 0)
                n += 1
        except Exception:  # noqa: BLE001 - a consumer stopping meanwhile has nothing to rewind
            continue
    return n


def read_epoch(path: Path) -> int:
    try:
        return int(path.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def bump(path: Path) -> int:
    """Step 1: the next epoch, written atomically; this process's consumers rewound."""
    epoch = read_epoch(path) + 1
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(str(epoch))
    tmp.replace(path)
    rewind_all()
    return epoch


class EpochWatch:
    """Step 2: `start()`/`stop()`, like every part of a stack. `path`: DATA_DIR/EPOCH_FILE; the gate
    file is beside it (DATA_DIR/GATE_FILE)."""

    def __init__(self, path: Path, check_s: float = gate.WATCH_CHECK_S) -> None:
        self.path, self.check_s = path, check_s
        self.gate_path = path.parent.parent / GATE_FILE
        self.epoch = 0
        self.rewinds = 0
        self._task = BackgroundTask("broker-epoch")

    async def start(self) -> EpochWatch:
        self.epoch = read_epoch(self.path)
        gate.follow(self.gate_path)  # a worker restarted while the broker restarts starts closed
        self._task.launch(self._loop)
        return self

    async def stop(self) -> None:
        await self._task.cancel()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.check_s)
            if gate.follow(self.gate_path):
                log.warning("the embedded broker is %s: this process's producers %s", *(
                    ("restarting", "wait") if gate.is_closed() else ("back with its topics", "go on")))
            epoch = read_epoch(self.path)
            if epoch > self.epoch:
                self.epoch = epoch
                self.rewinds += 1
                log.warning("the embedded broker restarted (epoch %d): %d partition(s) of this process's "
                            "consumers read again from offset 0", epoch, rewind_all())
