"""Wire contracts: schema drift, versions, strictness, round trips."""

from __future__ import annotations

import jsonschema
import orjson
import pytest

from pipeline.contracts import WIRE_MODELS, Evidence, RequestDoc, Response
from pipeline.contracts.jsonschema import render
from pipeline.contracts.resources import schemas_dir
from pipeline.runtime.codec import decode
from pipeline.runtime.errors import DecodeError
from pipeline.runtime.topics import load_registry


@pytest.mark.parametrize("name", sorted(WIRE_MODELS))
def test_checked_in_json_schema_matches_the_model(name):
    path = schemas_dir() / f"{name}.json"
    assert path.exists(), f"run `make schemas`: {path} is missing"
    assert path.read_text() == render(name), f"{path} drifted from the model: run `make schemas`"


def test_every_value_carries_a_schema_version():
    for name, model in WIRE_MODELS.items():
        schema = model.model_json_schema(by_alias=True)
        # a union (control) carries the version in every variant
        variants = [schema] if "properties" in schema else [
            schema["$defs"][ref["$ref"].rsplit("/", 1)[-1]] for ref in schema["oneOf"]]
        for v in variants:
            assert "schema" in v["properties"], name
            assert v["properties"]["schema"]["const"].endswith("/v1"), name


def test_every_registry_value_schema_has_a_model():
    for spec in load_registry().values():
        assert spec.value_schema is None or spec.value_schema in WIRE_MODELS, spec


def _doc() -> RequestDoc:
    return RequestDoc(request_id="r1", tenant_id="t1", body={"messages": [{"role": "user", "content": "hi"}]})


def test_documents_validate_against_their_checked_in_schema():
    schema = orjson.loads((schemas_dir() / "request.json").read_bytes())
    jsonschema.validate(orjson.loads(_doc().model_dump_json()), schema)
    bad = orjson.loads(_doc().model_dump_json())
    bad["body"]["messages"] = []
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_round_trip_and_unknown_fields_are_refused():
    raw = _doc().model_dump_json().encode()
    assert decode(raw, RequestDoc) == _doc().model_copy(update={"created_ms": decode(raw, RequestDoc).created_ms})
    obj = orjson.loads(raw)
    obj["promtp"] = "typo"
    with pytest.raises(DecodeError) as e:
        decode(orjson.dumps(obj), RequestDoc)
    assert e.value.error_class == "schema_invalid" and "promtp" in str(e.value)
    with pytest.raises(DecodeError) as e:
        decode(b"{not json", RequestDoc)
    assert e.value.error_class == "undecodable"


def test_wrong_schema_version_is_schema_invalid():
    obj = orjson.loads(_doc().model_dump_json())
    obj["schema"] = "request/v0"
    with pytest.raises(DecodeError) as e:
        decode(orjson.dumps(obj), RequestDoc)
    assert e.value.error_class == "schema_invalid"


def test_validation_errors_never_echo_values():
    obj = orjson.loads(_doc().model_dump_json())
    obj["tenant_id"] = {"secret": "010-1234-5678"}
    with pytest.raises(DecodeError) as e:
        decode(orjson.dumps(obj), RequestDoc)
    assert "010-1234-5678" not in str(e.value) and "tenant_id" in str(e.value)


def test_response_and_evidence_defaults():
    r = Response(request_id="r", status="ok", answered_by="s", created_ms=1000, finished_ms=1250)
    assert r.e2e_ms == 250.0 and orjson.loads(r.model_dump_json())["schema"] == "response/v1"
    assert Evidence(request_id="r", stage="s", decision="d").shadow is False
