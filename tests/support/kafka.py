"""Settings for a test's own topics on the session broker, and reading topics back."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from pipeline.app.assemble import topology_for
from pipeline.config.settings import Settings, StageSpec
from pipeline.runtime.codec import encode, request_headers
from pipeline.runtime.topics import apply_topics


def settings_for(tmp_path: Path, prefix: str, bootstrap: str, stages: list[dict[str, Any]], **extra: Any) -> Settings:
    return Settings(data_dir=tmp_path, topic_prefix=prefix, bootstrap=bootstrap,
                    stages=[StageSpec.model_validate(s) for s in stages], **extra)


async def create_topics(settings: Settings) -> None:
    assert settings.bootstrap
    await apply_topics(settings.bootstrap, settings.topic_prefix, topology_for(settings).topic_registry())


async def read_topic(bootstrap: str, topic: str, count: int, timeout: float = 60,
                     quiet_s: float | None = None) -> list:
    """Read `topic` from the beginning (all partitions) until `count` records arrived, or with
    `quiet_s`, until none arrived for that long after the first."""
    from aiokafka import AIOKafkaConsumer

    # a fetch returns as soon as it has records; a short wait lets the embedded broker answer a
    # slow read (a loaded host, a long partition) with none (runtime/wakeup/bellpoll.py, step 2a)
    c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False,
                         fetch_max_wait_ms=100, group_id=None)
    await c.start()
    got: list = []
    try:
        deadline = last = time.monotonic()
        deadline += timeout
        while len(got) < count and time.monotonic() < deadline:
            if quiet_s is not None and got and time.monotonic() - last >= quiet_s:
                break
            batches = await asyncio.wait_for(c.getmany(timeout_ms=200), 10)
            for recs in batches.values():
                got.extend(recs)
                last = time.monotonic()
    finally:
        await c.stop()
    return got


async def read_until_quiet(bootstrap: str, topic: str, quiet_s: float = 2.0, timeout: float = 120) -> list:
    """Every record of `topic`, duplicates included (what a table read with FINAL would hide), until
    none arrives for `quiet_s`. Not up to `end_offsets()`: the embedded broker under-reports them
    after a multi-record batch (docs/decisions/0001-embedded-broker-tansu.md)."""
    return await read_topic(bootstrap, topic, 10**9, timeout, quiet_s=quiet_s)


async def publish(bootstrap: str, topic: str, docs) -> None:
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await p.start()
    try:
        futs = [await p.send(topic, encode(d), key=d.request_id.encode(),
                             headers=request_headers(d.request_id, d.tenant_id, d.deadline_ms, d.attempt, None))
                for d in docs]
        await asyncio.gather(*futs)
    finally:
        await p.stop()
