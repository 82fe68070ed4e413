"""While the embedded broker is down and until its topics exist again, nothing of the stack produces.

Why (measured on Tansu 0.6, memory storage; tests/test_broker_gate.py shows it on the broker): a
produce to a topic the broker lacks is acknowledged, and creating that topic afterwards resets the
partition's high watermark over the batches already written. The next produce then fails
(AlreadyExists in the broker, UnknownError at the client) and the ones after it are written at
offsets those batches already cover: consumers skip them. An acknowledged record is lost, silently.
After a broker restart every producer of the stack retries what it held while the broker was down,
often before the keeper has created the topics: a chaos run lost a request admitted after the
restart (its caller got 504, its admission hold leaked until deadline + grace).

Protocol (the keeper is runtime/broker/keeper.py; every other process runs an EpochWatch):

1. The keeper notices the broker died and calls `close(path)`: the gate file (DATA_DIR/run/
   broker.gate) is written and this process's gate closes at once.
2. Every other process of the stack sees the file within its watch's `check_s` and closes its gate.
   A `GatedProducer.send()` waits while its process's gate is closed: a stage's send waits, the front
   door's publish runs into its own timeout (503), nothing reaches the broker.
3. The keeper waits `settle_s()`: a GatedProducer's requests time out after at most
   `PRODUCE_TIMEOUT_MAX_MS`, and aiokafka gives up a batch at its first failure past that age, so
   by then every record a producer took before its gate closed was delivered to the old broker or
   failed (a failed one is retried by its caller's loop, which waits at the gate).
4. The keeper starts the broker, bumps the epoch, creates and repairs the topics, then calls
   `open_(path)`: the file is removed and every gate opens within `check_s`.

Left open: a send that passed the gate just before it closed and then waits for topic metadata
(the first send to a topic) can enqueue its batch up to one request timeout later; the keeper's
margin covers the watch's delay, not that. A process outside the stack (a CLI command) has no gate.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from pipeline.config.settings import PRODUCE_TIMEOUT_MAX_MS

GATE_FILE = "run/broker.gate"
WATCH_CHECK_S = 0.25  # step 2: how often every process's EpochWatch reads the file
WAIT_S = 0.05  # a closed gate is checked this often: a flag, not an asyncio.Event (no loop is bound)

_closed = False


def is_closed() -> bool:
    return _closed


def close_here() -> None:
    global _closed
    _closed = True


def open_here() -> None:
    global _closed
    _closed = False


def close(path: Path) -> None:
    """Step 1 (the keeper)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("closed: the embedded broker is restarting\n")
    close_here()


def open_(path: Path) -> None:
    """Step 4 (the keeper)."""
    path.unlink(missing_ok=True)
    open_here()


def follow(path: Path) -> bool:
    """Step 2 (a watch): this process's gate as the file says; True when it changed."""
    closed = path.exists()
    if closed == _closed:
        return False
    close_here() if closed else open_here()
    return True


def settle_s() -> float:
    """Step 3: from closing the gate to starting the new broker."""
    return PRODUCE_TIMEOUT_MAX_MS / 1000 + 2 * WATCH_CHECK_S + 1.0


async def passage() -> None:
    while _closed:  # noqa: ASYNC110 - an Event binds one loop; this flag serves every loop of the process
        await asyncio.sleep(WAIT_S)


class GatedProducer(AIOKafkaProducer):
    """Every producer of the stack (step 2). Its request timeout, the lifetime of a batch it holds,
    is at most PRODUCE_TIMEOUT_MAX_MS (step 3)."""

    def __init__(self, *args: Any, request_timeout_ms: int = PRODUCE_TIMEOUT_MAX_MS, **kwargs: Any) -> None:
        if request_timeout_ms > PRODUCE_TIMEOUT_MAX_MS:
            raise ValueError(f"request_timeout_ms {request_timeout_ms} > {PRODUCE_TIMEOUT_MAX_MS}: a restarted "
                             "embedded broker would wait that long (runtime/broker/gate.py)")
        super().__init__(*args, request_timeout_ms=request_timeout_ms, **kwargs)

    async def send(self, topic, value=None, key=None, partition=None, timestamp_ms=None, headers=None):
        if _closed:
            await passage()
        return await super().send(topic, value, key=key, partition=partition, timestamp_ms=timestamp_ms,
                                  headers=headers)
