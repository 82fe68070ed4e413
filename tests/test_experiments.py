"""Experiment assignment (route/experiments.py): deterministic, sticky per episode, split by weight.
Pure policy: no infrastructure."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from pipeline.contracts import ChatMessage
from pipeline.engines.chat_engine import as_chat
from pipeline.stages.route.config import Route, RoutePolicy
from pipeline.stages.route.experiments import (
    Experiment,
    assign,
    experiment_fields,
    experiment_for,
    with_variant,
)
from tests.support.stats import binomial_interval

AB = Experiment(name="tone", route="simple", variants=[
    {"name": "control", "weight": 0.7},
    {"name": "terse", "weight": 0.3, "adapter": "support-lora", "prompt_revision": "terse@1"},
])


def test_every_request_of_an_episode_sees_one_variant_and_the_split_follows_the_weights():
    # fixed ids: the draw is a hash, so random ids made this 99 % interval fail one run in a hundred
    episodes = [f"ep-{i:04d}" for i in range(40)]
    seen: dict[str, set[str]] = {}
    for i in range(200):
        ep = episodes[i % 40]
        a = assign(AB, ep, f"req-{i:04d}")
        assert a.reason == "episode" and a.unit == ep
        seen.setdefault(ep, set()).add(a.variant.name)
    assert all(len(v) == 1 for v in seen.values())
    terse = sum(1 for v in seen.values() if v == {"terse"})
    lo, hi = binomial_interval(40, 0.3)
    assert lo <= terse <= hi, (terse, (lo, hi))


def test_without_an_episode_each_request_is_its_own_unit_and_a_large_split_is_close():
    n = 20_000
    terse = sum(assign(AB, None, f"req-{i}").variant.name == "terse" for i in range(n))
    lo, hi = binomial_interval(n, 0.3)
    assert lo <= terse <= hi, (terse, (lo, hi))
    a = assign(AB, None, "req-1")
    assert a.reason == "request" and a.unit == "req-1"
    assert assign(AB, None, "req-1") == a  # deterministic: the same unit, the same draw


def test_experiments_are_independent_and_a_new_salt_redraws():
    other = AB.model_copy(update={"name": "length"})
    salted = AB.model_copy(update={"salt": "2"})
    units = [f"u{i}" for i in range(2_000)]
    same_other = sum(assign(AB, u, "r").variant.name == assign(other, u, "r").variant.name for u in units)
    same_salt = sum(assign(AB, u, "r").variant.name == assign(salted, u, "r").variant.name for u in units)
    # independent draws agree with probability 0.7² + 0.3² = 0.58, not 1
    for same in (same_other, same_salt):
        lo, hi = binomial_interval(len(units), 0.58)
        assert lo <= same <= hi


def test_a_reweighting_moves_only_units_toward_the_grown_variant():
    grown = AB.model_copy(update={"variants": [AB.variants[0].model_copy(update={"weight": 0.5}),
                                               AB.variants[1].model_copy(update={"weight": 0.5})]})
    moved = {"control->terse": 0, "terse->control": 0}
    for i in range(5_000):
        before, after = assign(AB, f"e{i}", "r").variant.name, assign(grown, f"e{i}", "r").variant.name
        if before != after:
            moved[f"{before}->{after}"] += 1
    assert moved["terse->control"] == 0 and moved["control->terse"] > 0


def test_a_variant_overrides_the_route_and_names_its_prompt():
    route = Route(model="small", adapter=None, deployments=["local-vllm"])
    a = assign(AB, None, next(f"r{i}" for i in range(100) if assign(AB, None, f"r{i}").variant.name == "terse"))
    ran = with_variant(route, a.variant)
    assert ran.adapter == "support-lora" and ran.model == "small" and ran.deployments == ["local-vllm"]
    fields = experiment_fields(a, {"terse@1": "Answer in one sentence."})
    assert fields == {"experiment": "tone", "variant": "terse", "assignment": "request",
                      "prompt_revision": "terse@1", "system_prompt": "Answer in one sentence."}


def test_the_variant_prompt_comes_first_and_joins_the_callers_system_message():
    user = [ChatMessage(role="user", content="hi")]
    assert as_chat(user, "Be brief.") == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    both = as_chat([ChatMessage(role="system", content="You are Ada."), *user], "Be brief.")
    assert both[0] == {"role": "system", "content": "Be brief.\n\nYou are Ada."} and len(both) == 2
    assert as_chat(user, None) == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("bad, why", [
    ({"experiments": [{"name": "x", "route": "nope", "variants": [{"name": "a", "weight": 1}, {"name": "b", "weight": 1}]}]},
     "no route 'nope'"),
    ({"experiments": [{"name": "x", "route": "simple", "variants": [{"name": "a", "weight": 1}, {"name": "a", "weight": 1}]}]},
     "variant names repeat"),
    ({"experiments": [{"name": "x", "route": "simple", "variants": [{"name": "a", "weight": 1}]}]},
     "at least 2"),
    ({"experiments": [{"name": "x", "route": "simple", "variants": [{"name": "a", "weight": 0}, {"name": "b", "weight": 1}]}]},
     "greater than 0"),
    ({"experiments": [{"name": n, "route": "simple", "variants": [{"name": "a", "weight": 1}, {"name": "b", "weight": 1}]}
                      for n in ("x", "y")]},
     "both split route 'simple'"),
    ({"experiments": [{"name": "x", "route": "simple",
                       "variants": [{"name": "a", "weight": 1}, {"name": "b", "weight": 1, "prompt_revision": "p@9"}]}]},
     "prompt revision 'p@9' is not among"),
])
def test_a_policy_with_a_broken_experiment_is_refused_with_the_reason(bad, why):
    with pytest.raises(ValidationError, match=why):
        RoutePolicy.model_validate(bad)


def test_only_an_enabled_experiment_on_the_route_applies():
    off = AB.model_copy(update={"enabled": False})
    assert experiment_for([off], "simple") is None
    assert experiment_for([AB], "support") is None
    assert experiment_for([off, AB], "simple") is AB
