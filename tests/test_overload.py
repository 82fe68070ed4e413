"""Overload shedding at the front door (pipeline/ingress/shed.py): a request whose estimated time
to an answer (Little's law over the door's own answers) exceeds its deadline, or http.max_queue_s,
is refused at once with 503 `overloaded` and a Retry-After; nothing is shed while the door has too
little in flight or too few answers to trust a rate. The throughput it keeps under twice the load
is a benchmark (bench/peer_bench.py), not a test."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from pipeline.contracts import RequestDoc, Response, Status
from pipeline.ingress.client import PublishError
from pipeline.ingress.shed import Shedder
from tests.support.door import door_without_broker as _door
from tests.support.door import post as _post


def _loaded(shedder: Shedder, in_flight: int, answers_per_s: float, now: float = 100.0) -> Shedder:
    shedder.in_flight = in_flight
    n = int(answers_per_s * shedder.window_s)
    shedder._answered.extend(now - shedder.window_s + (i + 1) * shedder.window_s / n for i in range(n))
    return shedder


def test_the_estimate_is_the_backlog_over_the_answer_rate_bounded_by_the_deadline_or_max_queue():
    # 200 ahead at 20 answers/s: about 10 s to an answer
    assert _loaded(Shedder(), 200, 20).check(100.0, time_left_s=30) is None
    shed = _loaded(Shedder(), 200, 20).check(100.0, time_left_s=6)
    assert shed is not None and shed.retry_after_s == 5 and "its deadline" in shed.reason  # 10.05 - 6 s
    capped = _loaded(Shedder(max_queue_s=2), 200, 20).check(100.0, time_left_s=120)
    assert capped is not None and capped.retry_after_s == 9 and "http.max_queue_s = 2 s" in capped.reason
    assert _loaded(Shedder(max_queue_s=2), 30, 20).check(100.0, time_left_s=120) is None  # 1.55 s


def test_nothing_is_shed_without_a_backlog_or_a_rate_to_trust():
    assert _loaded(Shedder(max_queue_s=0.1), 15, 2).check(100.0, 1) is None, "below min_in_flight"
    cold = Shedder(max_queue_s=0.1)
    cold.in_flight = 500
    assert cold.check(100.0, 1) is None, "no answers yet: a cold stack"
    stale = _loaded(Shedder(max_queue_s=0.1), 500, 20)
    assert stale.check(100.0, 1) is not None
    assert stale.check(106.0, 1) is None, "answers older than the window are forgotten"
    timed_out = Shedder()
    timed_out.started()
    timed_out.finished(1.0, answered=False)
    assert timed_out.in_flight == 0 and len(timed_out._answered) == 0, "a timeout is no answer rate"


@pytest.mark.asyncio
async def test_the_door_refuses_at_once_what_would_wait_too_long_and_counts_what_it_publishes(tmp_path):
    door, keys, published = _door(tmp_path)
    chat = {"messages": [{"role": "user", "content": "hello"}]}
    gate = asyncio.Event()
    seen_in_flight: list[int] = []

    async def wait(doc: RequestDoc, timeout_s: float) -> Response:
        published.append(doc.request_id)
        seen_in_flight.append(door.shedder.in_flight)
        await gate.wait()
        return Response(request_id=doc.request_id, status=Status.ok, text="hi", answered_by="postprocess")

    door._wait = wait
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=door.app), base_url="http://door") as c:
        calls = [asyncio.create_task(c.post("/v1/chat/completions", json=chat,
                                            headers={"authorization": f"Bearer {keys['busy']}"})) for _ in range(3)]
        while len(published) < 3:
            await asyncio.sleep(0.01)
        assert door.shedder.in_flight == 3 and seen_in_flight[-1] == 3
        gate.set()
        assert [r.status_code for r in await asyncio.gather(*calls)] == [200] * 3
    assert door.shedder.in_flight == 0 and len(door.shedder._answered) == 3

    # a backlog of 400 answered at 10 a second: 40 s, beyond the 30 s this caller allows
    door.shedder._answered.clear()
    _loaded(door.shedder, 400, 10, now=time.monotonic())
    r = await _post(door, "/v1/chat/completions", keys["busy"], {**chat, "llmpipe": {"timeout_s": 30}})
    assert r.status_code == 503 and r.json()["error"]["code"] == "overloaded", r.text
    assert 10 <= int(r.headers["retry-after"]) <= 11 and r.headers["x-answered-by"] == "frontdoor"
    assert len(published) == 3 and door.shedder.in_flight == 400, "refused before anything was published"

    # a publish that fails leaves the count as it found it
    door.shedder = Shedder()

    async def broken(doc: RequestDoc, timeout_s: float) -> Response:
        raise PublishError("broker down")

    door._wait = broken
    r = await _post(door, "/v1/chat/completions", keys["busy"], chat)
    assert r.status_code == 503 and door.shedder.in_flight == 0 and len(door.shedder._answered) == 0
