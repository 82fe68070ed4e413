"""A caller's JSON Schema is hostile input: it may not make a worker connect anywhere, read a
file, or stall on a regex; the contract refuses what cannot be bounded with a clear reason."""

from __future__ import annotations

import time

import pytest
from pydantic import ValidationError

from pipeline.contracts.caller_schema import MAX_SCHEMA_BYTES, MAX_SCHEMA_DEPTH
from pipeline.contracts.request import JsonSchemaFormat
from pipeline.ingress.openai_body import BodyError, chat_request
from pipeline.stages.postprocess.schema import schema_violation

REVIEWED = r"^(\w+\s?)*$"  # the review's pattern: 0.8 s at 24 characters with `re`, doubling with each one more
EVIL = r"^(a|aa)+$"  # exponential even for the `regex` module, which handles REVIEWED in linear time


def test_a_remote_ref_is_never_retrieved(listener):
    url, hits = listener
    for ref in (f"{url}/latest/meta-data/", "file:///etc/hostname", "other.json"):
        why = schema_violation('"x"', {"$ref": ref})
        assert why is not None and "does not resolve locally" in why, (ref, why)
        nested = schema_violation('{"a": 1}', {"type": "object", "properties": {"a": {"$ref": ref}}})
        assert nested is not None and "does not resolve locally" in nested
    assert hits == []  # not one connection
    # local references still work
    local = {"$defs": {"n": {"type": "integer"}}, "type": "object", "properties": {"a": {"$ref": "#/$defs/n"}}}
    assert schema_violation('{"a": 1}', local) is None
    assert schema_violation('{"a": "x"}', local) == "at a: violates 'type'"


def test_the_contract_refuses_non_local_refs_with_a_reason():
    for ref in ("http://169.254.169.254/latest/meta-data/", "file:///etc/passwd", "https://example.org/s.json"):
        with pytest.raises(ValidationError, match="is not local"):
            JsonSchemaFormat.model_validate({"schema": {"$ref": ref}})
    with pytest.raises(BodyError, match="is not local"):
        chat_request({"messages": [{"role": "user", "content": "hi"}],
                      "response_format": {"type": "json_schema",
                                          "json_schema": {"name": "x", "schema": {"$ref": "http://10.0.0.1/"}}}})
    # a property that happens to be named "$ref" or "pattern" is not a keyword
    JsonSchemaFormat.model_validate({"schema": {"type": "object", "properties": {"$ref": {"type": "string"},
                                                                                 "pattern": {"type": "string"}}}})


def test_the_contract_bounds_size_depth_and_pattern_syntax():
    deep: dict = {"type": "string"}
    for _ in range(MAX_SCHEMA_DEPTH + 1):
        deep = {"type": "array", "items": deep}
    with pytest.raises(ValidationError, match="nested deeper"):
        JsonSchemaFormat.model_validate({"schema": deep})
    big = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 100}
                                            for i in range(MAX_SCHEMA_BYTES // 100)}}
    with pytest.raises(ValidationError, match="bytes"):
        JsonSchemaFormat.model_validate({"schema": big})
    with pytest.raises(ValidationError, match="does not compile"):
        JsonSchemaFormat.model_validate({"schema": {"type": "string", "pattern": "(unclosed"}})
    with pytest.raises(ValidationError, match="longer than"):
        JsonSchemaFormat.model_validate({"schema": {"type": "string", "pattern": "a" * 600}})
    with pytest.raises(ValidationError, match="unevaluatedProperties"):
        JsonSchemaFormat.model_validate({"schema": {"patternProperties": {"^a": {}}, "unevaluatedProperties": False}})


@pytest.mark.parametrize("schema, answer", [
    ({"type": "string", "pattern": EVIL}, '"' + "a" * 40 + '!"'),
    ({"type": "object", "patternProperties": {EVIL: {"type": "integer"}}}, '{"' + "a" * 40 + '!": 1}'),
    ({"type": "object", "patternProperties": {EVIL: {}}, "additionalProperties": False}, '{"' + "a" * 40 + '!": 1}'),
    ({"type": "object", "propertyNames": {"pattern": EVIL}}, '{"' + "a" * 40 + '!": 1}'),
    ({"type": "array", "items": {"type": "string", "pattern": EVIL}}, '["' + '", "'.join(["a" * 30 + "!"] * 50) + '"]'),
])
def test_a_catastrophic_pattern_is_answered_within_a_second(schema, answer):
    t0 = time.perf_counter()
    why = schema_violation(answer, schema)
    elapsed = time.perf_counter() - t0
    assert why is not None and "took longer than" in why, why
    assert elapsed < 1.0, elapsed


def test_the_reviewed_pattern_gets_its_verdict_at_once():
    t0 = time.perf_counter()
    assert schema_violation('"' + "a" * 40 + '!"', {"type": "string", "pattern": REVIEWED}) \
        == "at (root): violates 'pattern'"
    assert time.perf_counter() - t0 < 1.0


def test_patterns_still_validate_normally():
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-\\d{2}$"}},
              "patternProperties": {"^x-": {"type": "integer"}}, "additionalProperties": False}
    assert schema_violation('{"code": "ABC-12", "x-n": 3}', schema) is None
    assert schema_violation('{"code": "abc"}', schema) == "at code: violates 'pattern'"
    assert schema_violation('{"x-n": "s"}', schema) == "at x-n: violates 'type'"
    assert schema_violation('{"other": 1}', schema) == "at (root): violates 'additionalProperties'"
    # the reason never quotes the answer's value (it may carry PII)
    assert "jane@example.com" not in schema_violation('{"code": "jane@example.com"}', schema)
