"""Pure runtime logic: ordered commits, watermark hysteresis, settings, topology keys."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import TopicPartition
from prometheus_client import CollectorRegistry

from pipeline.app.assemble import topology_for
from pipeline.config.settings import RuntimeSettings, Settings, StageSpec
from pipeline.contracts import RequestDoc
from pipeline.runtime.flow import BoundedQueue
from pipeline.runtime.offsets import OffsetTracker
from pipeline.runtime.serve.metrics import StageMetrics

TP = TopicPartition("t", 0)


def test_commit_waits_for_the_slowest_earlier_record():
    t = OffsetTracker()
    t.reset(TP)
    for off in (10, 11, 12, 13):
        t.track(TP, off)
    t.done(TP, 12)
    t.done(TP, 13)
    assert t.to_commit() == {}  # 10 and 11 still in flight
    t.done(TP, 10)
    assert t.to_commit() == {TP: 11}
    t.mark_committed({TP: 11})
    assert t.to_commit() == {}
    t.done(TP, 11)
    assert t.to_commit() == {TP: 14}


def test_revoked_partition_forgets_its_offsets():
    t = OffsetTracker()
    t.reset(TP)
    t.track(TP, 0)
    t.forget(TP)
    t.done(TP, 0)  # a late completion after revocation is ignored
    assert t.to_commit() == {}


@pytest.mark.asyncio
async def test_queue_pauses_at_high_and_resumes_at_low_watermark():
    m = StageMetrics("q", registry=CollectorRegistry())
    q: BoundedQueue[int] = BoundedQueue(10, 0.8, 0.3, m)
    for i in range(8):
        q.put(i)
    assert q.should_pause() and q.room() == 2
    q.set_paused(True)
    assert not await q.wait_below_low(0.01)
    for _ in range(5):
        await q.get()
    assert await q.wait_below_low(0.01)  # 3 left = low watermark
    assert m.queue_depth_peak._value.get() == 8


@pytest.mark.asyncio
async def test_a_poll_loop_always_stops_when_cancelled():
    """A loop over guarded_getmany stops on cancel, even when the cancel lands as a poll completes
    (asyncio.wait_for on 3.11 swallowed about half of these cancels in the same loop)."""
    import asyncio
    import random

    from pipeline.runtime.wakeup.polling import guarded_getmany

    class Instant:
        async def getmany(self, **_: object) -> dict:
            await asyncio.sleep(0.001)
            return {}

    async def loop() -> None:
        while True:
            await guarded_getmany(Instant(), "test")  # type: ignore[arg-type]

    rng = random.Random(7)
    hung = 0
    for _ in range(200):
        task = asyncio.create_task(loop())
        await asyncio.sleep(rng.random() * 0.005)
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=0.5)
        if not done:
            hung += 1
            task.cancel()
            await asyncio.wait([task], timeout=0.5)
    assert hung == 0, f"{hung} of 200 poll loops ignored their cancel"


def test_watermarks_must_be_ordered():
    with pytest.raises(ValueError):
        RuntimeSettings(high_watermark=0.3, low_watermark=0.5)


def test_stage_runtime_overrides_are_validated():
    s = Settings(stages=[StageSpec(name="a", runtime={"concurrency": 4})])
    assert s.runtime_for(s.stage("a")).concurrency == 4
    bad = Settings(stages=[StageSpec(name="a", runtime={"concurrency": 0})])
    with pytest.raises(ValueError):
        bad.runtime_for(bad.stage("a"))


def test_stage_consumer_overrides_change_only_that_stage():
    s = Settings(stages=[StageSpec(name="a", consumer={"fetch_max_wait_ms": 50}), StageSpec(name="b")])
    assert s.consumer_for(s.stage("a")).fetch_max_wait_ms == 50
    assert s.consumer_for(s.stage("a")).session_timeout_ms == s.consumer.session_timeout_ms
    assert s.consumer_for(s.stage("b")).fetch_max_wait_ms == s.consumer.fetch_max_wait_ms == 5


def test_keys_follow_the_registry_rule():
    s = Settings(stages=[StageSpec(name=n) for n in ("route", "admit", "custom")])
    topo = topology_for(s)
    doc = RequestDoc(request_id="r", tenant_id="t", device_id="d", body={"messages": [{"role": "user", "content": "x"}]})
    assert topo.key_for("route", doc) == b"d"
    assert topo.key_for("admit", doc) == b"t"
    assert topo.key_for("route", doc.model_copy(update={"device_id": None})) == b"r"
    assert "stage.custom" in topo.topic_registry()
    assert topo.next_after("route") == "admit" and topo.next_after("custom") is None


def test_fetch_pacer_slows_idle_consumers_and_speeds_up_on_the_next_record():
    from types import SimpleNamespace

    from pipeline.runtime.wakeup.polling import FetchPacer

    fetcher = SimpleNamespace(_fetch_max_wait_ms=5)
    p = FetchPacer(SimpleNamespace(_fetcher=fetcher), fast_ms=5, idle_wait_ms=50, idle_after_ms=1000)
    t = p._last
    p.saw(0, t + 0.5)
    assert fetcher._fetch_max_wait_ms == 5 and not p.idle, "not idle before idle_after_ms"
    p.saw(0, t + 1.0)
    assert fetcher._fetch_max_wait_ms == 50 and p.idle
    p.saw(3, t + 1.2)
    assert fetcher._fetch_max_wait_ms == 5 and not p.idle
    p.saw(0, t + 2.1)
    assert fetcher._fetch_max_wait_ms == 5, "the idle clock restarts at the last record"
    off = FetchPacer(SimpleNamespace(_fetcher=SimpleNamespace(_fetch_max_wait_ms=5)), 5, 5, 0)
    off.saw(0, t + 100)
    assert not off.idle, "idle wait = fast wait: pacing is off"
    with pytest.raises(RuntimeError):
        FetchPacer(SimpleNamespace(), 5, 50, 1000)  # not started: no fetcher


def test_an_explicit_config_file_does_not_leak_into_later_settings(tmp_path, monkeypatch):
    """`--config` once (e.g. an in-process CLI call) must not become every later process's config:
    it used to be written into os.environ, and child processes inherited it."""
    import os

    from pipeline.config.settings import CONFIG_ENV, load_settings

    monkeypatch.delenv(CONFIG_ENV, raising=False)
    cfg = tmp_path / "one.yaml"
    cfg.write_text("stages:\n  - name: only\n    class: tests.stages:Answer\n")
    s = load_settings(cfg)
    assert [x.name for x in s.stages] == ["only"] and s._config_file == str(cfg.resolve())
    assert CONFIG_ENV not in os.environ
    assert load_settings().stages == [], "the next settings are built without it"


def test_the_http_server_turns_nagle_off_for_every_connection():
    """A response written in two parts waited for the caller's delayed ACK: 40 ms per request on a
    kept-alive connection (bench/stream_bench.py found it as 50 ms between the door's first chunk
    and the caller). Accepted sockets inherit TCP_NODELAY from the listening one on Linux."""
    import socket

    from pipeline.runtime.serve.asgi import AsgiServer

    srv = AsgiServer(lambda scope, receive, send: None)
    try:
        assert srv.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        srv.sock.listen()
        with socket.create_connection(("127.0.0.1", srv.port)):
            conn, _ = srv.sock.accept()
            with conn:
                assert conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        srv.sock.close()


async def test_an_idle_kept_alive_connection_outlives_a_callers_idle_expiry():
    """httpx (and the OpenAI SDK on it) drops an idle connection after 5 s, uvicorn's default too: a
    caller reusing one the server closed at that moment got a ReadError. The server keeps it longer,
    so the caller is always the one to close it."""
    import httpx

    from pipeline.runtime.serve.asgi import AsgiServer

    peers: list[tuple] = []

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        peers.append(scope["client"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    srv = await AsgiServer(app).start()
    try:
        async with httpx.AsyncClient(limits=httpx.Limits(keepalive_expiry=7.0)) as http:
            assert (await http.get(srv.url)).status_code == 200
            await asyncio.sleep(6.0)  # past 5 s idle
            assert (await http.get(srv.url)).status_code == 200
        assert peers[0] == peers[1], "the server closed the idle connection: the caller had to open another"
    finally:
        await srv.stop()


async def test_a_background_task_launches_once_and_cancel_is_idempotent():
    """The one start/stop block the broker watch, keeper, epoch watch, cancel watch and control
    follower share: a second launch does not start a second loop; cancel waits until the loop ended,
    a second cancel (or one before any launch) is a no-op."""
    from pipeline.runtime.service import BackgroundTask

    started, ended = [], []

    async def loop() -> None:
        started.append(1)
        try:
            await asyncio.sleep(3600)
        finally:
            ended.append(1)

    task = BackgroundTask("t")
    await task.cancel()  # before any launch
    task.launch(loop)
    task.launch(loop)
    await asyncio.sleep(0)
    assert started == [1]
    await task.cancel()
    assert ended == [1]  # ended before cancel() returned
    await task.cancel()
    task.launch(loop)  # a stopped part may start again
    await asyncio.sleep(0)
    assert started == [1, 1]
    await task.cancel()


def test_every_stage_policy_is_checked_before_anything_starts():
    """A wrong value or a misspelt key in any stage's policy fails at assembly, all of them at once,
    naming the stage and the field; before, the stage's own constructor found it, after the broker
    and the other workers were up. The product defaults and a custom stage's policy pass."""
    from pipeline.app.assemble import check_policies, topology_for
    from pipeline.runtime.errors import TopologyError

    s = Settings(stages=[StageSpec(name="mask", policy={"score_threshold": 7}),
                         StageSpec(name="cache", policy={"treshold": 0.5}),
                         StageSpec(name="route", policy={"routes": {"x": {"model": "m", "deployments": "nope"}}}),
                         StageSpec(name="answer", cls="tests.stages:Answer", policy={"anything": 1})])
    with pytest.raises(TopologyError) as err:
        check_policies(topology_for(s))
    text = str(err.value)
    assert "stage 'mask' policy: score_threshold" in text
    assert "stage 'cache' policy: treshold: Extra inputs are not permitted" in text
    assert "stage 'route' policy: routes.x.deployments" in text
    assert "answer" not in text
    check_policies(topology_for(Settings()))
