"""The demo's pace (pipeline/demo/pace.py): measured through the front door, a share of what the host
answers, bounded; a refusal while measuring is an error that says so. The door here is a stand-in that
answers after a fixed time with a fixed parallelism (what is measured is the arithmetic, not a stack:
`make demo` runs the real one)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from pipeline.demo.pace import Capacity, PaceError, measure_capacity, pick_rate


def _door(service_s: float, parallel: int, status: int = 200) -> tuple[Starlette, list[dict]]:
    slots = asyncio.Semaphore(parallel)
    bodies: list[dict] = []

    async def chat(request):
        bodies.append(await request.json())
        async with slots:
            await asyncio.sleep(service_s)
        return JSONResponse({"ok": True} if status == 200 else {"error": {"code": "rate_limited"}}, status)

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])]), bodies


@pytest.mark.asyncio
async def test_the_pace_is_what_the_host_answers_at_once_after_a_warm_round():
    app, bodies = _door(0.2, parallel=2)  # 4 at once, 2 at a time: 0.4 s a round, 10 answers/s
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://door") as c:
        cap = await measure_capacity(c, "k", probes=4, rounds=2)
    assert 7 <= cap.answers_per_s <= 10.5 and 0.15 <= cap.latency_p50_s <= 0.45, cap
    prompts = [b["messages"][0]["content"] for b in bodies]
    assert len(prompts) == 8 and len(set(prompts)) == 8, "distinct prompts: none is a cache hit"


@pytest.mark.asyncio
async def test_a_refusal_while_measuring_says_so():
    app, _ = _door(0.0, parallel=1, status=429)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://door") as c:
        with pytest.raises(PaceError, match="answered 429"):
            await measure_capacity(c, "k")


def test_the_offered_rate_is_a_share_of_capacity_within_bounds():
    assert pick_rate(Capacity(1.14, 20.0, 4)) == 0.8  # the AVX2 host: 2.5 offered before, 1.14 carried
    assert pick_rate(Capacity(40.0, 0.5, 4)) == 2.5, "never faster than the traffic's own pace"
    assert pick_rate(Capacity(0.01, 300.0, 4)) == 0.2, "never so slow the demo does not end"


def test_the_probes_go_as_a_tenant_without_limits():
    from pathlib import Path

    from pipeline.demo.run import demo_tenants

    demo = Path(__file__).resolve().parents[1] / "examples" / "demo.yaml"
    unlimited = demo_tenants(demo, unlimited=True)
    assert unlimited and set(unlimited) < set(demo_tenants(demo)), "the limited tenants would refuse the probes"
    assert not {"tight-rpm", "tight-conc", "broke"} & set(unlimited)
