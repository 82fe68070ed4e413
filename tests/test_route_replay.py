"""Replaying the route topic with a changed policy, in shadow, shows exactly the changed decisions."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from pipeline.contracts.request import DeviceState
from pipeline.engines.embedder import Embedder
from pipeline.ingress import Client
from pipeline.stages.route.config import RoutePolicy
from pipeline.stages.route.stage import Router, route_text
from tests.support.cli import last_json, llmpipe
from tests.support.waits import poll

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [
    "hi", "thanks!", "What are your opening hours?", "I want a refund for my order", "My package has not arrived",
    "How do I reset my password?", "Explain step by step why the sky is blue", "Compare Postgres and MySQL",
    "Write a detailed migration plan for our database with trade-offs", "환불 받고 싶어요", "영업시간 알려줘",
    "단계별로 이유를 설명해 주세요", "Translate 'good night' to Korean", "Can you analyze this log for errors?",
    "Where is the nearest store?", "Tell me a joke", "Why did my payment fail?", "주문 취소하고 싶어요",
    "What is 2+2?", "Design a caching layer for a busy API and explain the failure modes",
]


async def test_shadow_replay_of_route_reports_exactly_the_changed_decisions(tmp_path):
    up = llmpipe("up", "--detach", "--config", str(ROOT / "tests/fixtures/route_answer.yaml"), "--json",
                 data_dir=tmp_path)
    assert up.returncode == 0, up.stderr
    info = last_json(up)
    try:
        async with Client(info["bootstrap"], topic_prefix=info["topic_prefix"]) as client:
            docs = [client.build(p, device_id=f"dev-{i % 3}", device=DeviceState(temperature_c=30 + i))
                    for i, p in enumerate(PROMPTS)]
            answers = await asyncio.gather(*(client.request(d, 120) for d in docs))
        assert all(a.status == "ok" and a.route in RoutePolicy().routes for a in answers)
        for _ in range(120):
            r = llmpipe("sql", "SELECT count() AS n FROM decisions FINAL WHERE stage = 'route'", "--format", "json",
                        data_dir=tmp_path)
            if last_json(r)[0]["n"] >= len(PROMPTS):
                break
            await asyncio.sleep(0.5)
        rep = llmpipe("replay", "--topic", "requests", "--from-offset", ",".join(f"{p}:0" for p in range(6)),
                      "--stage", "route", "--policy", str(ROOT / "tests/fixtures/route_v2.yaml"), "--shadow",
                      "--config", str(ROOT / "tests/fixtures/route_answer.yaml"), "--json", data_dir=tmp_path)
        assert rep.returncode == 0, rep.stderr
        diff = last_json(rep)
    finally:
        assert llmpipe("down", data_dir=tmp_path).returncode == 0
    # the same decisions, computed offline from the two policies
    embedder = Embedder()
    old, new = Router(RoutePolicy(), embedder), Router(RoutePolicy.model_validate(yaml.safe_load(
        (ROOT / "tests/fixtures/route_v2.yaml").read_text())), embedder)
    expected = set()
    for d in docs:
        vec = embedder.embed([route_text(d)])[0]
        if old.decide(d, vec, d.created_ms).decision != new.decide(d, vec, d.created_ms).decision:
            expected.add(d.request_id)
    assert diff["records"] == len(PROMPTS) and diff["compared"] == 2 * len(PROMPTS)  # route + route.placement
    assert expected, "the changed policy must change something for this test to mean anything"
    assert len(expected) < len(PROMPTS), "and leave something unchanged"
    assert set(diff["changed_request_ids"]) == expected
    assert sum(diff["changes"]["route"].values()) == len(expected)
    assert "route.placement" not in diff["changes"], "placement does not depend on the changed fields"


GREETINGS = ["hi", "Say hello", "thanks!", "hello there", "good morning"]


async def test_an_experiment_is_sticky_per_episode_recorded_and_a_reweighting_replays(tmp_path):
    from pipeline.stages.route.experiments import assign
    from tests.support.stats import binomial_interval

    cfg = ROOT / "tests/fixtures/route_experiment.yaml"
    up = llmpipe("up", "--detach", "--config", str(cfg), "--json", data_dir=tmp_path)
    assert up.returncode == 0, up.stderr
    info = last_json(up)
    episodes = [f"ep-{i:02d}" for i in range(40)]
    try:
        async with Client(info["bootstrap"], topic_prefix=info["topic_prefix"]) as client:
            docs = [client.build(GREETINGS[i % len(GREETINGS)], episode_id=episodes[i % 40]) for i in range(200)]
            answers = await asyncio.gather(*(client.request(d, 120) for d in docs))
        assert all(a.status == "ok" and a.route == "simple" and a.experiment == "tone" for a in answers), \
            {(a.status, a.route, a.experiment) for a in answers}
        by_episode: dict[str, set[str]] = {}
        for d, a in zip(docs, answers):
            assert a.episode_id == d.episode_id
            by_episode.setdefault(d.episode_id, set()).add(a.variant)
        assert all(len(v) == 1 for v in by_episode.values()), by_episode
        terse = sum(1 for v in by_episode.values() if v == {"terse"})
        lo, hi = binomial_interval(40, 0.5)
        assert lo <= terse <= hi, (terse, lo, hi)

        q = ("SELECT episode_id, groupUniqArray(variant) AS v, count() AS n FROM requests FINAL "
             "WHERE experiment = 'tone' GROUP BY episode_id")
        for _ in range(120):
            rows = last_json(llmpipe("sql", q, "--format", "json", data_dir=tmp_path))
            if sum(r["n"] for r in rows) >= 200:
                break
            await asyncio.sleep(0.5)
        assert {r["episode_id"]: set(r["v"]) for r in rows} == by_episode  # the warehouse agrees
        ev = poll(lambda: last_json(llmpipe("sql", "SELECT count() AS n FROM decisions FINAL WHERE stage = 'route' AND "
                                                   "labels['experiment'] = 'tone' AND labels['assignment'] = 'episode' "
                                                   "AND episode_id != ''", "--format", "json", data_dir=tmp_path)),
                  lambda ev: ev[0]["n"] >= 200, 60, "every routed request's decision row")  # the sink's batches
        assert ev[0]["n"] == 200

        rep = llmpipe("replay", "--topic", "requests", "--from-offset", ",".join(f"{p}:0" for p in range(6)),
                      "--stage", "route", "--policy", str(ROOT / "tests/fixtures/route_experiment_v2.yaml"),
                      "--shadow", "--config", str(cfg), "--json", data_dir=tmp_path)
        assert rep.returncode == 0, rep.stderr
        diff = last_json(rep)
    finally:
        assert llmpipe("down", data_dir=tmp_path).returncode == 0
    new = RoutePolicy.model_validate(yaml.safe_load((ROOT / "tests/fixtures/route_experiment_v2.yaml").read_text()))
    moved = {d.request_id for d, a in zip(docs, answers)
             if assign(new.experiments[0], d.episode_id, d.request_id).variant.name != a.variant}
    assert moved, "the re-weighting must move some episodes for this test to mean anything"
    assert set(diff["changed_request_ids"]) == moved
    assert set(diff["changes"]["route"]) == {"simple@control -> simple@terse"}  # units only move toward the grown one
