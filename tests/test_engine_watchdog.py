"""In-process vLLM fails an attempt only when the whole engine stalls (VllmEngine._outputs): a request
queued behind busy work waits, a silent engine is a timeout and the request is aborted in the engine.
Fake output streams stand in for vLLM's, so this runs without a model."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pipeline.engines.chat_engine import EngineError
from pipeline.engines.vllm_engine import VllmEngine

pytestmark = pytest.mark.asyncio


def engine(stall_s: float) -> VllmEngine:
    return VllmEngine(Path("/nonexistent"), revision="r", cache_dir=Path("/nonexistent"), stall_timeout_s=stall_s)


async def stream(delays: list[float], closed: list[str], name: str):
    try:
        for d in delays:
            await asyncio.sleep(d)
            yield name
    finally:
        closed.append(name)  # vLLM's generate aborts the request here when it is cancelled or closed


async def collect(e: VllmEngine, s) -> list[str]:
    return [out async for out in e._outputs(s)]


async def test_a_queued_request_waits_while_others_make_progress():
    e, closed = engine(0.3), []
    busy = stream([0.05] * 20, closed, "busy")  # 1 s of steady output
    queued = stream([0.8, 0.05], closed, "queued")  # its first output comes after 0.8 s > the stall timeout
    got = await asyncio.gather(collect(e, busy), collect(e, queued))
    assert got == [["busy"] * 20, ["queued"] * 2]
    assert sorted(closed) == ["busy", "queued"]


async def test_a_silent_engine_is_a_timeout_and_the_request_is_aborted():
    e, closed = engine(0.2), []
    t0 = asyncio.get_running_loop().time()
    with pytest.raises(EngineError) as err:
        await collect(e, stream([5.0], closed, "stuck"))
    assert err.value.error_class == "timeout" and "no output for" in str(err.value)
    assert 0.15 < asyncio.get_running_loop().time() - t0 < 1.0
    assert closed == ["stuck"]


async def test_an_idle_engine_does_not_count_as_stalled():
    e, closed = engine(0.2), []
    e._last_output -= 60  # nothing ran for a minute: the first request still gets its stall timeout
    assert await collect(e, stream([0.1], closed, "first")) == ["first"]


async def test_a_cancelled_attempt_aborts_the_request():
    e, closed = engine(5.0), []
    task = asyncio.ensure_future(collect(e, stream([5.0], closed, "cut")))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert closed == ["cut"] and e._active == 0
