"""Tools through the whole product stack with the official `openai` client and the real small model
(issue 39): a forced call is a schema-valid call, streamed in pieces too, and a round trip (call, the
caller's tool result, the final answer) works."""

from __future__ import annotations

import json

import jsonschema
import pytest
from openai import OpenAI

from tests.support.tools import EMAIL, WEATHER

pytestmark = pytest.mark.integration

MAX_TOKENS = 384  # a small model writes long email bodies: a cut-off call is an error, not a call
ASK = [{"role": "user", "content": "What is the weather in Oslo right now?"}]


@pytest.fixture(scope="module")
def client(product_stack) -> OpenAI:
    return OpenAI(base_url=product_stack.http_url + "/v1", api_key=product_stack.keys["acme"], max_retries=0,
                  timeout=120)


def valid_call(call, tool) -> dict:
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, tool["function"]["parameters"])
    return args


def test_a_required_call_from_the_small_model_satisfies_its_tool_schema(client):
    r = client.chat.completions.create(model="small", messages=ASK, tools=[WEATHER, EMAIL], tool_choice="required",
                                       parallel_tool_calls=False, max_tokens=MAX_TOKENS)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    valid_call(call, {"get_weather": WEATHER, "send_email": EMAIL}[call.function.name])


def test_a_named_tool_choice_calls_that_tool_and_streams_it_in_pieces(client):
    named = {"type": "function", "function": {"name": "send_email"}}
    r = client.chat.completions.create(model="small", messages=ASK, tools=[WEATHER, EMAIL], tool_choice=named,
                                       max_tokens=MAX_TOKENS)
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "send_email"
    valid_call(call, EMAIL)
    stream = client.chat.completions.create(model="small", messages=ASK, tools=[WEATHER, EMAIL], tool_choice=named,
                                            max_tokens=MAX_TOKENS, stream=True)
    name, pieces, finish = "", [], None
    for chunk in stream:
        for c in chunk.choices:
            for t in c.delta.tool_calls or ():
                assert t.index == 0
                name += (t.function.name or "") if t.function else ""
                pieces.append((t.function.arguments or "") if t.function else "")
            finish = c.finish_reason or finish
    assert name == "send_email" and finish == "tool_calls"
    assert "".join(pieces) == call.function.arguments  # the same call (temperature 0), whole again


def test_a_round_trip_returns_the_callers_tool_result_to_the_model(client):
    first = client.chat.completions.create(model="small", messages=ASK, tools=[WEATHER],
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                           max_tokens=MAX_TOKENS)
    call = first.choices[0].message.tool_calls[0]
    history = [*ASK, first.choices[0].message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp_c": -3, "sky": "snow"})}]
    final = client.chat.completions.create(model="small", messages=history, tools=[WEATHER], tool_choice="none",
                                           max_tokens=48)
    assert final.choices[0].finish_reason in ("stop", "length")
    assert final.choices[0].message.content and not final.choices[0].message.tool_calls


def test_stop_cuts_the_same_answer_where_the_sequence_begins(client):
    ask = [{"role": "user", "content": "Name three colours of the rainbow."}]
    whole = client.chat.completions.create(model="small", messages=ask, max_tokens=40, temperature=0).choices[0]
    words = whole.message.content.split()
    assert len(words) >= 4, whole.message.content
    cut_at = " " + words[3]
    cut = client.chat.completions.create(model="small", messages=ask, max_tokens=40, temperature=0, stop=[cut_at])
    choice = cut.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.content == whole.message.content[:whole.message.content.index(cut_at)]


def test_n_choices_come_back_each_indexed_and_counted(client):
    r = client.chat.completions.create(model="small", messages=[{"role": "user", "content": "Say a fruit."}], n=3,
                                       max_tokens=12, temperature=1.0)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(c.message.content and c.finish_reason in ("stop", "length") for c in r.choices)
    assert r.usage.completion_tokens >= 3  # all three are billed


def test_top_logprobs_rank_the_alternatives_and_greedy_takes_the_first(client):
    r = client.chat.completions.create(model="small", messages=[{"role": "user", "content": "Say a fruit."}],
                                       max_tokens=8, temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for pos in content:
        alts = pos.top_logprobs
        assert len(alts) == 3 and [a.logprob for a in alts] == sorted((a.logprob for a in alts), reverse=True)
        assert alts[0].token == pos.token and abs(alts[0].logprob - pos.logprob) < 1e-4  # greedy: the likeliest


def test_parallel_tool_calls_give_one_call_per_city(client):
    two = [{"role": "user", "content": "What is the weather in Oslo and in Paris? Check both cities."}]
    r = client.chat.completions.create(model="small", messages=two, tools=[WEATHER], tool_choice="required",
                                       parallel_tool_calls=True, max_tokens=MAX_TOKENS, temperature=0)
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and len(calls) >= 2, calls
    assert len({c.id for c in calls}) == len(calls)  # each call answerable by its own id
    cities = {valid_call(c, WEATHER)["city"].lower() for c in calls}
    assert {"oslo", "paris"} <= cities, cities


def test_a_streamed_round_trip_call_then_the_answer(client):
    named = {"type": "function", "function": {"name": "get_weather"}}
    call: dict = {"id": "", "name": "", "arguments": ""}
    for chunk in client.chat.completions.create(model="small", messages=ASK, tools=[WEATHER], tool_choice=named,
                                                max_tokens=MAX_TOKENS, stream=True):
        for c in chunk.choices:
            for t in c.delta.tool_calls or ():
                call["id"] += t.id or ""
                call["name"] += (t.function.name or "") if t.function else ""
                call["arguments"] += (t.function.arguments or "") if t.function else ""
    jsonschema.validate(json.loads(call["arguments"]), WEATHER["function"]["parameters"])
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}]},
        {"role": "tool", "tool_call_id": call["id"], "content": json.dumps({"temp_c": -3, "sky": "snow"})}]
    text, finish = "", None
    for chunk in client.chat.completions.create(model="small", messages=history, tools=[WEATHER], tool_choice="none",
                                                max_tokens=48, stream=True):
        for c in chunk.choices:
            assert not c.delta.tool_calls
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    assert text.strip() and finish in ("stop", "length")
