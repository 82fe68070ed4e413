"""Pure policy of multi-LoRA serving: the residency mirror (hot/warm/cold moves) and the fair gate
that keeps one adapter's burst from starving another adapter's short requests."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.stages.generate.fair_gate import FairGate
from pipeline.stages.generate.lora.residency import AdapterResidency


def labels(moves):
    return [(t.key, t.label) for t in moves]


def test_residency_moves_adapters_through_cold_warm_hot_by_recency():
    r = AdapterResidency(max_hot=1, max_warm=2)
    assert r.state("a@1") == "cold"
    assert labels(r.loaded("a@1")) == [("a@1", "cold->warm")]
    assert labels(r.used("a@1")) == [("a@1", "warm->hot")]
    assert labels(r.used("a@1")) == []  # already hot: nothing moves
    assert labels(r.loaded("b@1")) == [("b@1", "cold->warm")]
    assert labels(r.used("b@1")) == [("b@1", "warm->hot"), ("a@1", "hot->warm")]  # one slot: a steps back
    assert (r.state("a@1"), r.state("b@1")) == ("warm", "hot")
    # a third adapter overflows the CPU cache: the least recently used one (a) goes back to disk
    assert labels(r.loaded("c@1")) == [("c@1", "cold->warm"), ("a@1", "warm->cold")]
    assert labels(r.used("c@1")) == [("c@1", "warm->hot"), ("b@1", "hot->warm")]
    assert [r.state(k) for k in ("a@1", "b@1", "c@1")] == ["cold", "warm", "hot"]
    with pytest.raises(ValueError):
        AdapterResidency(max_hot=3, max_warm=2)


def test_forgetting_an_adapter_sends_it_back_to_disk():
    r = AdapterResidency(max_hot=1, max_warm=2)
    r.used("a@1")
    assert labels(r.forget("a@1")) == [("a@1", "hot->cold")] and r.state("a@1") == "cold"
    assert r.forget("a@1") == []
    assert labels(r.used("a@1")) == [("a@1", "cold->warm"), ("a@1", "warm->hot")]


def test_a_new_revision_is_another_adapter():
    r = AdapterResidency(max_hot=2, max_warm=2)
    r.used("a@1")
    assert r.state("a@2") == "cold"


async def test_fair_gate_serves_a_short_request_of_another_adapter_before_a_burst():
    gate = FairGate(capacity=2, lane_token_budget=1000)
    order: list[str] = []
    release = asyncio.Event()

    async def run(lane: str, tag: str, tokens: int) -> float:
        async with gate.slot(lane, tokens) as waited:
            order.append(tag)
            await release.wait()
        return waited

    burst = [asyncio.create_task(run("tenant-a", f"a{i}", 300)) for i in range(6)]
    await asyncio.sleep(0)
    short = asyncio.create_task(run("tenant-b", "b0", 40))  # arrives after the whole burst
    await asyncio.sleep(0.01)
    assert order == ["a0", "a1"] and gate.in_flight == 2
    release.set()
    await asyncio.gather(*burst, short)
    # b0 takes the first freed slot, ahead of the four a-requests that arrived before it
    assert order.index("b0") == 2, order
    assert gate.in_flight == 0 and gate.lane_tokens == {"tenant-a": 0, "tenant-b": 0}


async def test_fair_gate_caps_a_lane_at_its_token_budget_while_others_wait():
    gate = FairGate(capacity=2, lane_token_budget=500)
    order: list[str] = []
    done = {}

    async def run(lane, tag, tokens):
        done[tag] = asyncio.Event()
        async with gate.slot(lane, tokens):
            order.append(tag)
            await done[tag].wait()

    tasks = [asyncio.create_task(run("a", "a0", 500)), asyncio.create_task(run("", "base-first", 10))]
    await asyncio.sleep(0)
    tasks += [asyncio.create_task(run("a", f"a{i}", 100)) for i in (1, 2)]  # queued before base's next ones
    await asyncio.sleep(0)
    tasks += [asyncio.create_task(run("", f"base{i}", 10)) for i in (1, 2)]
    await asyncio.sleep(0.01)
    assert order == ["a0", "base-first"]
    for tag in ("base-first", "base1"):  # each freed slot goes to base: a holds its whole budget
        done[tag].set()
        await asyncio.sleep(0.01)
    assert order == ["a0", "base-first", "base1", "base2"], order
    done["a0"].set()  # a is under budget again
    await asyncio.sleep(0.01)
    assert order[4] == "a1"
    for e in list(done.values()):
        e.set()
    await asyncio.sleep(0.01)
    for e in list(done.values()):
        e.set()
    await asyncio.gather(*tasks)
    assert order[-1] == "a2" and gate.in_flight == 0


async def test_fair_gate_gives_back_a_slot_when_a_waiter_is_cancelled():
    gate = FairGate(capacity=1, lane_token_budget=10)
    await gate.acquire("x", 5)
    waiter = asyncio.create_task(gate.acquire("y", 5))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    gate.release("x", 5)
    assert gate.in_flight == 0
    assert await gate.acquire("z", 1) == 0.0


async def test_reserved_slots_start_a_newcomer_lane_at_once_during_a_burst():
    gate = FairGate(capacity=4, lane_token_budget=10_000, reserve=1)
    hold = asyncio.Event()
    started: list[str] = []

    async def run(lane, tag):
        async with gate.slot(lane, 10):
            started.append(tag)
            await hold.wait()

    burst = [asyncio.create_task(run("a", f"a{i}")) for i in range(8)]
    await asyncio.sleep(0.01)
    assert started == ["a0", "a1", "a2"]  # the last slot stays free for another lane
    newcomer = [asyncio.create_task(run("b", f"b{i}")) for i in range(2)]
    await asyncio.sleep(0.01)
    assert started[-1] == "b0" and "b1" not in started  # b's first starts at once; b now has one running
    hold.set()
    await asyncio.gather(*burst, *newcomer)
    assert len(started) == 10 and gate.in_flight == 0 and gate.lane_count == {"a": 0, "b": 0}
