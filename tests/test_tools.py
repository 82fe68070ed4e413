"""Tools (issue 39): the door's parsing and bounds, the constrained answer of a model without tool
support (engines/tool_prompt.py), and tool-candidate narrowing on the labelled sets."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import orjson
import pytest

from pipeline.engines.tool_prompt import ToolCallInvalid, ToolSpec, output_schema, parse, render
from pipeline.ingress.openai_body import BodyError, chat_request
from tests.support.tools import EMAIL, WEATHER

DATA = Path(__file__).parent / "data"

def body(**extra) -> dict:
    return {"messages": [{"role": "user", "content": "weather in Oslo?"}], "tools": [WEATHER, EMAIL], **extra}


# ---- the door ---------------------------------------------------------------------------------

def test_the_door_takes_tools_a_choice_and_a_full_round_trip_of_messages():
    req = chat_request(body(tool_choice={"type": "function", "function": {"name": "get_weather"}},
                            parallel_tool_calls=False))
    assert [t.function.name for t in req.body.tools] == ["get_weather", "send_email"]
    assert req.body.tool_choice.name == "get_weather" and req.body.parallel_tool_calls is False
    history = [{"role": "user", "content": "weather in Oslo?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                                     "arguments": '{"city": "Oslo"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 3}'},
               {"role": "user", "content": "and should I bring a coat?"}]
    req = chat_request({"messages": history, "tools": [WEATHER]})
    assert req.body.messages[1].tool_calls[0].function.name == "get_weather"
    assert req.body.messages[2].tool_call_id == "call_1"


@pytest.mark.parametrize(("change", "says"), [
    ({"tools": [WEATHER, WEATHER]}, "unique"),
    ({"tool_choice": {"type": "function", "function": {"name": "delete_all"}}}, "not among the tools"),
    ({"tools": [], "tool_choice": "required"}, "needs tools"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [{"type": "retrieval"}]}, "type `function`"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"$ref": "https://x/s.json"}}}]},
     "ref"),
    ({"functions": [{"name": "f"}]}, "use `tools`"),
    ({"messages": [{"role": "tool", "tool_call_id": "nope", "content": "x"}]}, "earlier assistant tool call"),
])
def test_the_door_refuses_tools_it_cannot_honour_and_says_why(change, says):
    with pytest.raises((BodyError, ValueError)) as err:
        chat_request(body(**change))
    assert says in str(err.value)


# ---- a model without tool support: the constrained answer -----------------------------------------

def spec(choice="auto", parallel=True) -> ToolSpec:
    return ToolSpec((WEATHER, EMAIL), choice, parallel)


def valid(schema: dict, doc) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(doc)


def test_the_answer_schema_follows_tool_choice():
    call = {"name": "get_weather", "arguments": {"city": "Oslo"}}
    auto, required, named = output_schema(spec()), output_schema(spec("required")), output_schema(spec("send_email"))
    assert output_schema(spec("none")) is None
    assert valid(auto, {"answer": "hi"}) and valid(auto, {"tool_calls": [call]})
    assert not valid(required, {"answer": "hi"}) and valid(required, {"tool_calls": [call, call]})
    assert not valid(named, {"tool_calls": [call]})  # only send_email may be called
    assert valid(named, {"tool_calls": [{"name": "send_email", "arguments": {"to": "a", "body": "b"}}]})
    assert not valid(auto, {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo", "x": 1}}]})
    assert not valid(auto, {"tool_calls": [{"name": "get_weather", "arguments": {"to": "a", "body": "b"}}]})
    assert not valid(output_schema(spec(parallel=False)), {"tool_calls": [call, call]})


def test_parse_returns_calls_with_stable_ids_or_says_what_is_wrong():
    text = orjson.dumps({"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]}).decode()
    content, calls = parse(text, spec(), "req-1")
    assert content is None and calls[0]["function"] == {"name": "get_weather", "arguments": '{"city":"Oslo"}'}
    assert calls[0]["id"] == parse(text, spec(), "req-1")[1][0]["id"] != parse(text, spec(), "req-2")[1][0]["id"]
    assert parse('{"answer": "sunny"}', spec(), "r") == ("sunny", [])
    for bad, says in [('{"tool_calls": [{"name": "rm_rf", "arguments": {}}]}', "not offered"),
                      ('{"tool_calls": [{"name": "get_weather", "arguments": {"city": 7, '
                       '"unit": "bob@example.com"}}]}', "rule"),
                      ('{"tool_calls": [', "not the JSON"), ('{"answer": "x"}', "no tool call")]:
        with pytest.raises(ToolCallInvalid) as err:
            parse(bad, spec("required"), "r")
        assert says in str(err.value) and "bob@example.com" not in str(err.value)


def test_render_puts_the_tools_in_the_system_message_and_calls_and_results_in_text():
    msgs = render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Oslo?"},
                   {"role": "assistant", "content": "", "tool_calls": [
                       {"id": "c1", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}]},
                   {"role": "tool", "tool_call_id": "c1", "content": "3C"}], spec())
    assert msgs[0]["content"].startswith("Be brief.") and "get_weather" in msgs[0]["content"]
    assert orjson.loads(msgs[2]["content"]) == {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]}
    assert orjson.loads(msgs[3]["content"])["tool_result"] == "3C"
    assert all(set(m) == {"role", "content"} for m in msgs)


# ---- narrowing on the labelled sets (tests/data/TOOL_NARROWING_*.md) --------------------------------

@pytest.fixture(scope="module")
def narrower():
    from pipeline.stages.route.config import ToolsPolicy
    from pipeline.stages.route.tools import narrower_for

    return narrower_for(ToolsPolicy())


@pytest.mark.parametrize(("cases", "catalog", "floor"), [
    ("tool_narrowing_train.jsonl", "tools_catalog_train.json", 0.9),  # the bar, on the set tuned on
    ("tool_narrowing_unseen.jsonl", "tools_catalog_unseen.json", 0.85),  # held out: never tuned on
])
def test_narrowing_keeps_the_needed_tools_among_the_top_k(narrower, cases, catalog, floor):
    from pipeline.evaluation.tools import evaluate, read_cases, read_catalog
    from pipeline.stages.route.config import ToolsPolicy

    report = evaluate(narrower, read_cases(DATA / cases, read_catalog(DATA / catalog)), ToolsPolicy().max_candidates)
    print(f"\n{cases}: recall at {report['k']} {report['recall']}, by kind {report['by_kind']}, "
          f"by lang {report['by_lang']}, {report['ms_p50']} ms p50")
    assert report["cases"] == 130 and report["recall"] >= floor, report["missed"]


def test_a_named_tool_and_the_tools_already_called_are_always_kept(narrower):
    from pipeline.contracts.request import Tool
    from pipeline.stages.route.tools import ToolNarrower

    tools = [Tool.model_validate({"type": "function", "function": {"name": f"tool_{i}"}}) for i in range(20)]
    req = chat_request({"messages": [
        {"role": "user", "content": "x"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "tool_17", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}, {"role": "user", "content": "again"}],
        "tools": [t.model_dump() for t in tools], "tool_choice": {"type": "function", "function": {"name": "tool_3"}}})
    result = narrower.narrow(req.body.tools, req.body.messages, 2, req.body.tool_choice)
    assert result.kept == ["tool_3", "tool_17"] and len(result.dropped) == 18
    assert isinstance(narrower, ToolNarrower)


def test_a_batch_encodes_its_queries_once_per_encoder_and_reuses_routes_vector(narrower):
    from pipeline.contracts.request import Tool
    from pipeline.evaluation.tools import read_catalog
    from pipeline.stages.route.tools import ToolNarrower, queries

    tools = [Tool.model_validate(t) for t in list(read_catalog(DATA / "tools_catalog_train.json").values())[:40]]
    calls: dict[str, list[list[str]]] = {"minilm": [], "use": []}

    def counted(name):
        def encode(texts):
            calls[name].append(list(texts))
            return narrower.encoders[name](texts)
        return encode

    counting = ToolNarrower({n: counted(n) for n in narrower.encoders}, narrower.context_weight)
    convs = [chat_request({"messages": m}).body.messages for m in (
        [{"role": "user", "content": "Refund my last order please"}],
        [{"role": "user", "content": "I need a taxi to the airport"}, {"role": "assistant", "content": "When?"},
         {"role": "user", "content": "at six"}],
        [{"role": "user", "content": "내일 서울 날씨 알려줘"}])]
    route_vec = narrower.encoders["minilm"]([queries(convs[0])[0]])[0]  # what route computed for request 0
    counting.query_vectors(convs, {"minilm": [route_vec, None, None]})  # warm: tool vectors are cached apart
    calls = {"minilm": [], "use": []}
    qs = counting.query_vectors(convs, {"minilm": [route_vec, None, None]})
    # one call, without request 0's last turn (route's vector); request 1's context is its earlier turns
    assert calls["minilm"] == [["at six", "I need a taxi to the airport\nWhen?", "내일 서울 날씨 알려줘"]], calls
    assert len(calls["use"]) == 1 and len(calls["use"][0]) == 4  # every query, one call
    for conv, q in zip(convs, qs):  # the same scores as one request at a time
        batched, alone = counting.scores(tools, conv, q), narrower.scores(tools, conv)
        assert batched.keys() == alone.keys() and all(abs(batched[k] - alone[k]) < 1e-3 for k in alone)


# ---- authorisation: what a tenant's keys may offer ------------------------------------------------

async def test_a_tenant_offering_a_tool_it_may_not_use_gets_403_before_anything_is_published(tmp_path):
    from pipeline.contracts.control import TenantUpsert
    from tests.support.door import door_without_broker, post

    door, keys, published = door_without_broker(tmp_path)
    assert door.registry.apply(TenantUpsert(tenant="busy", limits={"tools": {"allow": ["get_*"],
                                                                             "roles": {"mailer": ["send_*"]}}}))
    r = await post(door, "/v1/chat/completions", keys["busy"], body())  # get_weather and send_email
    assert r.status_code == 403 and r.json()["error"]["code"] == "tool_not_allowed"
    assert "send_email" in r.json()["error"]["message"] and "get_weather" not in r.json()["error"]["message"]
    assert published == []
    r = await post(door, "/v1/chat/completions", keys["busy"], body(tools=[WEATHER]))
    assert r.status_code == 200 and len(published) == 1
    r = await post(door, "/v1/chat/completions", keys["slow"], body())  # no access configured: any tool
    assert r.status_code == 200


def test_mask_refuses_a_tool_by_the_keys_roles_for_producers_past_the_door():
    from pipeline.config.tenants import ToolAccess
    from pipeline.contracts import RequestDoc
    from pipeline.stages.mask.auth import tool_refusal

    access = ToolAccess(allow=["get_*"], roles={"mailer": ["send_*"]})
    doc = RequestDoc(request_id="r", body=chat_request(body()).body)
    assert "send_email" in (tool_refusal(doc, access) or "")
    assert tool_refusal(doc.model_copy(update={"roles": ["mailer"]}), access) is None
    assert tool_refusal(doc, ToolAccess()) is None


def test_a_deployment_without_tool_calling_is_no_candidate_for_a_tools_request_and_says_why():
    from pipeline.config.settings import Deployment
    from pipeline.contracts import RequestDoc
    from pipeline.stages.generate.attempts import needs_for, sampling_for
    from pipeline.stages.generate.config import GeneratePolicy
    from pipeline.stages.generate.deployments import candidates

    plain = Deployment(name="plain", engine="openai", base_url="http://x/v1")  # tools: not declared
    caller = Deployment(name="caller", engine="openai", base_url="http://y/v1", tools=True)
    local = Deployment(name="local", engine="vllm", json_schema=True)  # tools through the grammar
    doc = RequestDoc(request_id="r", body=chat_request(body(tool_choice="required")).body)
    sampling = sampling_for(doc, GeneratePolicy())
    ok, refused = candidates([plain, caller, local], ["plain", "caller", "local"], needs_for(doc, 50, sampling))
    assert [d.name for d in ok] == ["caller", "local"] and refused == {"plain": "no tool calling"}
    none = RequestDoc(request_id="r", body=chat_request(body(tool_choice="none")).body)
    ok, refused = candidates([plain], ["plain"], needs_for(none, 50, sampling_for(none, GeneratePolicy())))
    assert [d.name for d in ok] == ["plain"] and not refused  # tools offered, none to be called


# ---- the rest of the sampling surface ------------------------------------------------------------

def test_stop_penalties_and_logit_bias_reach_the_engines_sampling_and_bypass_the_cache():
    from pipeline.contracts import RequestDoc
    from pipeline.engines.openai_engine import OpenAIEngine
    from pipeline.stages.cache.config import CachePolicy
    from pipeline.stages.cache.policy import bypass_reason
    from pipeline.stages.generate.attempts import sampling_for
    from pipeline.stages.generate.config import GeneratePolicy

    req = chat_request({"messages": [{"role": "user", "content": "count to ten"}], "stop": "5",
                        "presence_penalty": 0.5, "frequency_penalty": -0.25, "logit_bias": {"42": -100}})
    s = sampling_for(RequestDoc(request_id="r", body=req.body), GeneratePolicy())
    assert (s.stop, s.presence_penalty, s.frequency_penalty, s.logit_bias) == (("5",), 0.5, -0.25, {42: -100.0})
    sent = OpenAIEngine("http://x/v1", "m").body([{"role": "user", "content": "x"}], s)
    assert (sent["stop"], sent["presence_penalty"], sent["logit_bias"]) == (["5"], 0.5, {"42": -100.0})
    assert bypass_reason(RequestDoc(request_id="r", body=req.body), CachePolicy(), "faq") == "sampling_constraints"
    for bad in ({"stop": ["a"] * 5}, {"presence_penalty": 3}, {"logit_bias": {"x": 1}}, {"logit_bias": {"1": 101}}):
        with pytest.raises((BodyError, ValueError)):
            chat_request({"messages": [{"role": "user", "content": "x"}], **bad})


async def test_models_lists_the_deployments_with_their_capabilities_to_an_authenticated_caller(tmp_path):
    import httpx

    from tests.support.door import door_without_broker

    door, keys, _ = door_without_broker(tmp_path)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=door.app), base_url="http://door") as c:
        assert (await c.get("/v1/models")).status_code == 401
        r = await c.get("/v1/models", headers={"authorization": f"Bearer {keys['busy']}"})
    assert r.status_code == 200 and r.json()["object"] == "list"
    (local,) = [m for m in r.json()["data"] if m["id"] == "local-vllm"]
    assert local["llmpipe"]["tools"] is True and local["llmpipe"]["json_schema"] is True


# ---- n > 1: every choice checked, un-masked and answered -------------------------------------------

def _postprocess(tmp_path):
    from pipeline.config.settings import Settings, StageSpec
    from pipeline.runtime.stage import StageContext
    from pipeline.stages.postprocess.stage import PostprocessStage

    s = Settings(data_dir=tmp_path, stages=[StageSpec(name="postprocess", policy={"write_back": False})])
    return PostprocessStage(StageContext(spec=s.stage("postprocess"), settings=s, runtime=s.runtime))


def _generated(text: str, **kw):
    from pipeline.contracts.request import GenerationSection

    return GenerationSection(deployment="d", model="m", model_revision="r", text=text, prompt_token_ids=[1],
                             token_ids=[2], finish_reason="stop", tokens_in=1, tokens_out=3, ttft_ms=1.0, **kw)


def test_every_choice_is_checked_and_a_bad_one_names_its_index(tmp_path):
    from pipeline.contracts import RequestDoc
    from pipeline.contracts.request import Choice, ToolCall
    from pipeline.ingress.openai_reply import completion

    stage = _postprocess(tmp_path)
    req = chat_request(body(n=3, tool_choice="required"))
    call = ToolCall.model_validate({"id": "c0", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}})
    rogue = ToolCall.model_validate({"id": "c2", "function": {"name": "delete_all", "arguments": "{}"}})
    ok = [Choice(index=i, text="", tool_calls=[call], finish_reason="tool_calls") for i in (1, 2)]
    doc = RequestDoc(request_id="r", tenant_id="t", body=req.body,
                     generation=_generated("", tool_calls=[call], choices=ok))
    out = stage.decide(doc)
    assert out.response.status == "ok" and [c.index for c in out.response.choices] == [1, 2]
    answer = completion(out.response, "small")
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2]
    assert all(c["message"]["tool_calls"][0]["function"]["name"] == "get_weather" for c in answer["choices"])
    bad = doc.model_copy(update={"generation": _generated("", tool_calls=[call], choices=[
        ok[0], Choice(index=2, text="", tool_calls=[rogue], finish_reason="tool_calls")])})
    refused = stage.decide(bad).response
    assert refused.error_class == "tool_call_refused" and refused.reason.startswith("choice 2: ")


async def test_choices_and_a_rollouts_samples_each_run_with_their_own_recorded_seed():
    from types import SimpleNamespace

    from pipeline.contracts import RequestDoc
    from pipeline.contracts.request import RolloutRequest
    from pipeline.engines.chat_engine import Generation, Sampling
    from pipeline.stages.generate.rollouts.samples import sample_seeds
    from pipeline.stages.generate.stage import GenerateStage

    calls = []

    class Engine:  # records what each engine call was given
        async def generate(self, messages, sampling, request_id=None, adapter=None, on_delta=None):
            calls.append((request_id, sampling.seed))
            return Generation(text="x", prompt_token_ids=[1], token_ids=[2], logprobs=None, finish_reason="stop",
                              ttft_ms=1.0)

    stage = SimpleNamespace(engines={"d": Engine()})
    d = SimpleNamespace(name="d")
    msgs = [{"role": "user", "content": "x"}]
    plain = RequestDoc(request_id="r", body=chat_request({"messages": msgs}).body)
    await GenerateStage._sample(stage, d, plain, msgs, Sampling(), None, 1)
    assert calls == [("r", None)]
    calls.clear()
    three = plain.model_copy(update={"body": plain.body.model_copy(update={"n": 3})})
    await GenerateStage._sample(stage, d, three, msgs, Sampling(), None, 3)
    base = sample_seeds(three, Sampling(), 1)[0]
    assert calls == [("r:0", base), ("r:1", base + 1), ("r:2", base + 2)]
    calls.clear()
    one = plain.model_copy(update={"rollout": RolloutRequest(group_id="g", n=1)})
    await GenerateStage._sample(stage, d, one, msgs, Sampling(), None, 1)
    assert calls == [("r:0", sample_seeds(one, Sampling(), 1)[0])]  # the seed its rollout row records
