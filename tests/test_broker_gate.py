"""The produce gate around an embedded broker restart (runtime/broker/gate.py).

The first test is the broker's behaviour that makes the gate necessary; if a Tansu upgrade changes
it, it fails and the gate's reason should be read again."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from pipeline.runtime.broker import gate
from pipeline.runtime.broker.embedded import EmbeddedBroker
from pipeline.runtime.broker.epoch import EPOCH_FILE, EpochWatch
from pipeline.runtime.broker.gate import GATE_FILE, GatedProducer
from pipeline.runtime.broker.keeper import BrokerKeeper


async def _read_all(bootstrap: str, topic: str, want: int) -> list[tuple[int, bytes]]:
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await c.start()
    try:
        tp = TopicPartition(topic, 0)
        c.assign([tp])
        c.seek(tp, 0)
        got: list[tuple[int, bytes]] = []
        for _ in range(10):
            for recs in (await c.getmany(timeout_ms=300)).values():
                got += [(r.offset, r.value) for r in recs]
            if len(got) >= want:
                break
        return got
    finally:
        await c.stop()


async def test_tansu_loses_an_acknowledged_record_produced_before_its_topic_exists(tmp_path: Path) -> None:
    async with EmbeddedBroker(tmp_path) as b:
        admin = AIOKafkaAdminClient(bootstrap_servers=b.bootstrap)
        await admin.start()
        p = AIOKafkaProducer(bootstrap_servers=b.bootstrap, linger_ms=50)
        try:
            await admin.create_topics([NewTopic("t", 1, 1)])
            await p.start()
            await p.send_and_wait("t", b"warm", partition=0)  # the producer knows the topic
            await admin.delete_topics(["t"])  # as a restarted memory broker has lost it
            early = [await p.send("t", f"early{i}".encode(), partition=0) for i in range(3)]
            assert [(await f).offset for f in early] == [0, 1, 2]  # acknowledged, with no topic
            await admin.create_topics([NewTopic("t", 1, 1)])
            acked: list[bytes] = []
            for i in range(4):
                try:
                    await p.send_and_wait("t", f"late{i}".encode(), partition=0)
                    acked.append(f"late{i}".encode())
                except Exception:  # the first one fails: its offset is taken
                    continue
            read = [v for _, v in await _read_all(b.bootstrap, "t", 6)]
            assert len(acked) == 3
            lost = [v for v in acked if v not in read]
            assert lost, f"every acknowledged record was read: {read}"
        finally:
            await p.stop()
            await admin.close()


async def test_a_gated_send_waits_while_the_gate_is_closed_and_goes_once_it_opens(
        broker: EmbeddedBroker, tmp_path: Path) -> None:
    topic = f"gate-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(topic, 1, 1)])
    await admin.close()
    p = GatedProducer(bootstrap_servers=broker.bootstrap, acks="all")
    await p.start()
    path = tmp_path / GATE_FILE
    try:
        gate.close(path)
        send = asyncio.ensure_future(p.send_and_wait(topic, b"held", partition=0))
        await asyncio.sleep(0.5)
        assert not send.done(), "a send went through a closed gate"
        assert await _read_all(broker.bootstrap, topic, 1) == []
        gate.open_(path)
        md = await asyncio.wait_for(send, 5)
        assert md.offset == 0 and not path.exists()
        assert [v for _, v in await _read_all(broker.bootstrap, topic, 1)] == [b"held"]
    finally:
        gate.open_here()
        await p.stop()


def test_a_producer_of_the_stack_may_not_hold_records_longer_than_the_keeper_waits() -> None:
    with pytest.raises(ValueError, match="restarted embedded broker would wait"):
        GatedProducer(bootstrap_servers="127.0.0.1:1", request_timeout_ms=30_000)


async def test_a_watch_keeps_its_process_gate_as_the_file_says(tmp_path: Path) -> None:
    path = tmp_path / GATE_FILE
    watch = await EpochWatch(tmp_path / EPOCH_FILE, check_s=0.05).start()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("closed")
        await asyncio.sleep(0.3)
        assert gate.is_closed()
        path.unlink()
        await asyncio.sleep(0.3)
        assert not gate.is_closed()
    finally:
        await watch.stop()
        gate.open_here()


async def test_the_keeper_restarts_the_broker_behind_a_closed_gate_and_opens_it_once_the_topics_exist(
        tmp_path: Path) -> None:
    """Protocol steps 2-5: the gate closes before the new broker starts and opens only after
    `restore`; the event comes after that."""
    seen: list[tuple[str, bool, bool]] = []  # (step, gate closed, broker answering)
    path = tmp_path / GATE_FILE

    async def restore() -> list[str]:
        seen.append(("restore", gate.is_closed(), b.proc is not None and b.proc.poll() is None))
        return []

    async def announce(ev) -> None:  # type: ignore[no-untyped-def]
        seen.append(("announce", gate.is_closed(), True))

    async with EmbeddedBroker(tmp_path) as b:
        keeper = await BrokerKeeper(b, restore, announce, tmp_path / EPOCH_FILE, path, check_s=0.1,
                                    settle_s=1.0).start()
        try:
            assert b.proc is not None
            os.kill(b.proc.pid, signal.SIGKILL)
            closed_at = None
            for _ in range(100):
                await asyncio.sleep(0.05)
                if path.exists():
                    closed_at = asyncio.get_running_loop().time()
                    break
            assert closed_at is not None and gate.is_closed(), "the gate never closed"
            for _ in range(200):
                if seen and seen[-1][0] == "announce":
                    break
                await asyncio.sleep(0.05)
            assert seen == [("restore", True, True), ("announce", False, True)], seen
            assert not path.exists() and keeper.restarts == 1
            assert keeper.last is not None and keeper.last.down_s >= 1.0  # it waited the settle time
        finally:
            await keeper.stop()
            gate.open_here()
