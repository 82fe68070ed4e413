"""postprocess's checks that need no infrastructure: JSON-schema validation of answers (no silent
repair, no values quoted back) and the cache bypass for structured output."""

from __future__ import annotations

from pipeline.contracts import RequestDoc
from pipeline.contracts.request import ChatBody, ChatMessage, ResponseFormat
from pipeline.stages.cache.config import CachePolicy
from pipeline.stages.cache.policy import bypass_reason
from pipeline.stages.postprocess.schema import schema_violation

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
          "required": ["city"], "additionalProperties": False}


def test_valid_answers_pass_and_invalid_ones_say_where_without_quoting_values():
    assert schema_violation('{"city": "Paris", "population": 2100000}', SCHEMA) is None
    assert schema_violation("The capital is Paris", SCHEMA).startswith("not JSON")
    why = schema_violation('{"city": "Paris", "population": "jane.doe@example.com"}', SCHEMA)
    assert why == "at population: violates 'type'" and "jane" not in why
    assert schema_violation('{"population": 3}', SCHEMA) == "at (root): violates 'required'"
    assert schema_violation('{"city": "x", "extra": 1}', SCHEMA) == "at (root): violates 'additionalProperties'"
    assert schema_violation("{}", {"type": "no-such-type"}).startswith("the requested schema is itself invalid")


def test_structured_output_requests_bypass_the_cache():
    rf = ResponseFormat.model_validate({"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}})
    doc = RequestDoc(request_id="r", body=ChatBody(messages=[ChatMessage(role="user", content="What is the capital of France?")],
                                                   response_format=rf))
    assert bypass_reason(doc, CachePolicy(), "faq") == "structured_output"
    plain = doc.model_copy(update={"body": doc.body.model_copy(update={"response_format": None})})
    assert bypass_reason(plain, CachePolicy(), "faq") != "structured_output"


def test_an_answer_breaking_the_requested_schema_becomes_an_error_answer(tmp_path):
    from pipeline.config.settings import Settings, StageSpec
    from pipeline.contracts.request import GenerationSection
    from pipeline.runtime.stage import StageContext
    from pipeline.stages.postprocess.stage import PostprocessStage

    s = Settings(data_dir=tmp_path, stages=[StageSpec(name="postprocess", policy={"write_back": False})])
    stage = PostprocessStage(StageContext(spec=s.stage("postprocess"), settings=s, runtime=s.runtime))
    rf = ResponseFormat.model_validate({"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}})
    gen = GenerationSection(deployment="d", model="m", model_revision="r", text='{"town": "Paris"}',
                            prompt_token_ids=[1], token_ids=[2, 3], finish_reason="stop", tokens_in=1, tokens_out=2,
                            ttft_ms=1.0, cost_usd=0.5)
    doc = RequestDoc(request_id="r", tenant_id="t", generation=gen,
                     body=ChatBody(messages=[ChatMessage(role="user", content="capital?")], response_format=rf))
    bad = stage.decide(doc)
    assert bad.response.status == "error" and bad.response.error_class == "schema_invalid"
    assert "violates 'required'" in bad.response.reason and bad.evidence[0].reason == "schema_invalid"
    good = stage.decide(doc.model_copy(update={"generation": gen.model_copy(update={"text": '{"city": "Paris"}'})}))
    assert good.response.status == "ok" and good.response.cost_usd == 0.5 and good.response.deployment == "d"


def test_postprocess_writes_back_under_the_cache_stages_own_policy(tmp_path):
    """One source: the cache stage's policy in the topology, unless postprocess names its own."""
    from pipeline.config.settings import Settings
    from pipeline.runtime.stage import StageContext
    from pipeline.stages.postprocess.stage import PostprocessStage

    def stage(post_policy: dict) -> PostprocessStage:
        s = Settings(data_dir=tmp_path, stages=[{"name": "cache", "policy": {"tenant_modes": {"beta": "shadow"},
                                                                             "default_domain": "tech"}},
                                                {"name": "postprocess", "policy": post_policy}])
        return PostprocessStage(StageContext(spec=s.stage("postprocess"), settings=s, runtime=s.runtime))

    assert stage({}).cache_policy.tenant_modes == {"beta": "shadow"}
    assert stage({}).cache_policy.default_domain == "tech"
    assert stage({"cache": {"default_domain": "faq"}}).cache_policy.default_domain == "faq"
