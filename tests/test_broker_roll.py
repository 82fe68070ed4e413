"""The embedded broker's planned roll (runtime/broker/roll.py, issue 38 item 9): its memory storage
never frees a record, so the stack restarts it quiet, with its compacted topics carried over."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from pipeline.contracts.admit import StateMarker
from pipeline.registries.tenants import new_api_key
from pipeline.runtime.broker.embedded import EmbeddedBroker
from pipeline.runtime.broker.roll import carry, compacted, lagging, write_back
from pipeline.runtime.codec import encode
from pipeline.runtime.follow.changelog import MARKER_KEY
from pipeline.runtime.topics import load_registry
from tests.support.callers import TIMEOUT_S, Load, chat, gateway_config
from tests.support.cli import last_json, llmpipe, running
from tests.support.kafka import read_topic
from tests.support.waits import poll

pytestmark = pytest.mark.integration


async def _records(bootstrap: str, topic: str, partitions: int) -> dict[int, list[tuple[bytes, bytes]]]:
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=50)
    await c.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        out: dict[int, list[tuple[bytes, bytes]]] = {p: [] for p in range(partitions)}
        for _ in range(4):
            for tp, recs in (await c.getmany(timeout_ms=300)).items():
                out[tp.partition] += [(r.key, r.value) for r in recs]
        return out
    finally:
        await c.stop()


def test_every_compacted_topic_of_the_registry_has_a_marker_a_roll_can_read_it_with():
    assert set(compacted(load_registry())) == {"admit.state", "control"}


async def test_lagging_names_a_group_behind_and_carry_keeps_the_latest_value_per_key_per_partition(tmp_path):
    async with EmbeddedBroker(tmp_path) as broker:
        bs = broker.bootstrap
        admin = AIOKafkaAdminClient(bootstrap_servers=bs)
        await admin.start()
        await admin.create_topics([NewTopic("log", 2, 1), NewTopic("work", 2, 1)])
        producer = AIOKafkaProducer(bootstrap_servers=bs)
        await producer.start()
        try:
            for p, key, value in [(0, b"k1", b"v1"), (0, b"k1", b"v2"), (1, b"k2", b"v1"), (1, b"k2", None),
                                  (1, b"k3", b"v3"), (0, MARKER_KEY, encode(StateMarker(marker_id="old")))]:
                await producer.send_and_wait("log", value, key=key, partition=p)
            for i in range(4):
                await producer.send_and_wait("work", b"w%d" % i, partition=i % 2)
            group = AIOKafkaConsumer("work", bootstrap_servers=bs, group_id="g", enable_auto_commit=False,
                                     auto_offset_reset="earliest", fetch_max_wait_ms=50)
            await group.start()
            try:
                await group.getmany(max_records=1, timeout_ms=3000)
                await group.commit()  # one record read: the group is behind
                assert await lagging(bs, {"g": ["work"], "idle": []}) != []
                got = 1
                while got < 4:
                    got += sum(len(r) for r in (await group.getmany(timeout_ms=500)).values())
                await group.commit()
                assert await lagging(bs, {"g": ["work"]}) == []
            finally:
                await group.stop()

            carried = await carry(bs, {"log": "admit_state"})
            assert carried == {"log": {0: {b"k1": b"v2"}, 1: {b"k3": b"v3"}}}  # the tombstone and markers dropped

            await producer.stop()
            await admin.close()
            broker.stop()  # a new, empty broker on the same port: the roll's restart
            await broker.start()
            admin = AIOKafkaAdminClient(bootstrap_servers=bs)
            await admin.start()
            await admin.create_topics([NewTopic("log", 2, 1)])
            assert await write_back(bs, carried) == 2
            assert await _records(bs, "log", 2) == {0: [(b"k1", b"v2")], 1: [(b"k3", b"v3")]}
        finally:
            await producer.stop()
            await admin.close()


def test_a_roll_under_load_holds_callers_instead_of_failing_them_and_keeps_keys_issued_at_run_time(tmp_path):
    key = new_api_key()
    config = {**gateway_config(key), "embedded_broker": {"roll_rss_mib": 0}}  # only when asked
    with running(config, tmp_path, "--processes") as info:
        url = info["http_url"]
        issued = last_json(llmpipe("tenants", "add", "beta", "--json", data_dir=tmp_path))["api_key"]
        poll(lambda: chat(url, issued)[0], lambda s: s == 200, 30, "the key issued at run time works", 0.5)
        broker_pid = json.loads((tmp_path / "stack.json").read_text())["pids"]["broker"]
        with Load(url, key, n=3) as load:
            poll(lambda: len(load.results), lambda n: n >= 5, 30, "answers before the roll", 0.1)
            t_roll = time.monotonic()
            rolled = llmpipe("roll-broker", "--json", data_dir=tmp_path, timeout=180)
            assert rolled.returncode == 0, rolled.stderr
            poll(lambda: [r for r in load.results if r[0] > time.monotonic() - 1 and r[0] > t_roll], bool, 30,
                 "answers after the roll", 0.1)
        broker = last_json(rolled)
        assert broker["rolls"] == 1 and broker["restarts"] == 0, broker
        assert "asked for" in broker["last_roll_why"]
        # held at the door, never refused: the same deadline as without a roll, and every answer a 200
        assert {(r[1], r[2]) for r in load.results} == {(200, "ok")}, sorted({(r[1], r[2]) for r in load.results})
        worst = max(r[3] for r in load.results)
        print(f"\n{len(load.results)} calls, the slowest {worst:.1f} s (held through the roll)")
        assert worst < TIMEOUT_S + 5  # the hold (drain ~2.5 s, restart ~0.7 s) and the groups' rejoin
        status = last_json(llmpipe("status", "--json", data_dir=tmp_path))
        assert status["pids"]["broker"] != broker_pid
        assert chat(url, issued)[0] == 200
        # `control` was carried over (the running processes keep their registries anyway; a process that
        # starts after the roll reads them from the new broker's log)
        control = asyncio.run(read_topic(info["bootstrap"], info["topic_prefix"] + "control", 10**6, timeout=5,
                                         quiet_s=1.0))
        keys = {r.key for r in control}
        assert b"tenant:beta" in keys and sum(k.startswith(b"key:") for k in keys if k) >= 2, keys
        events = poll(lambda: last_json(llmpipe("report", "--since", "1h", "--json", data_dir=tmp_path))
                      ["sections"]["stack_events"], bool, 60, "a stack event in the report", 1)
        (ev,) = events
        assert ev["decision"] == "broker_rolled" and "nothing in flight was lost" in ev["reason"]


def test_roll_broker_refuses_without_a_running_stack(tmp_path):
    r = llmpipe("roll-broker", data_dir=tmp_path)
    assert r.returncode != 0 and "no stack is running" in (r.stderr + r.stdout)
