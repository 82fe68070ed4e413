"""Dead letters keep no secrets and always fit their topic."""

from __future__ import annotations

import base64
import hashlib

import orjson
from aiokafka.structs import ConsumerRecord

from pipeline.contracts import DlqRecord
from pipeline.runtime.dlq import MAX_KEPT_BYTES, dead_letter


def record(value: bytes) -> ConsumerRecord:
    return ConsumerRecord(topic="t.requests", partition=0, offset=7, timestamp=1, timestamp_type=0, key=b"k",
                          value=value, checksum=None, serialized_key_size=1, serialized_value_size=len(value),
                          headers=[("request_id", b"r1")])


def test_the_api_key_is_removed_before_anything_is_kept():
    doc = {"schema": "request/v1", "request_id": "r1", "api_key": "lp-supersecret", "body": {"messages": "bad"}}
    dl = dead_letter(record(orjson.dumps(doc)), stage="mask", worker="w", error_class="schema_invalid",
                     error="body.messages", attempts=0)
    kept = orjson.loads(dl.original_value())
    assert kept["api_key"] is None and kept["body"] == doc["body"] and dl.redacted == ["api_key"]
    assert "supersecret" not in DlqRecord.model_validate_json(dl.model_dump_json()).model_dump_json()
    assert dl.value_sha256 == hashlib.sha256(orjson.dumps(doc)).hexdigest()
    # not JSON at all (truncated, say): the key is still blanked textually
    raw = b'{"request_id": "r2", "api_key": "lp-other\\"secret", "body": {'
    dl2 = dead_letter(record(raw), stage="mask", worker="w", error_class="undecodable", error="x", attempts=0)
    assert b"lp-other" not in dl2.original_value() and dl2.redacted == ["api_key"]
    clean = b'{"request_id": "r3"}'
    dl3 = dead_letter(record(clean), stage="mask", worker="w", error_class="x", error="x", attempts=0)
    assert dl3.original_value() == clean and dl3.redacted == [] and not dl3.value_truncated


def test_an_oversize_record_is_kept_truncated_with_its_digest():
    value = b"x" * (MAX_KEPT_BYTES * 3)
    dl = dead_letter(record(value), stage="grow", worker="w", error_class="too_large", error="x", attempts=1)
    assert dl.value_truncated and dl.value_bytes == len(value)
    assert dl.value_sha256 == hashlib.sha256(value).hexdigest()
    assert len(base64.b64decode(dl.value_b64)) == MAX_KEPT_BYTES
    assert len(dl.model_dump_json()) < 2 * MAX_KEPT_BYTES  # fits any topic configured for requests


def test_the_door_limit_must_leave_room_for_the_document_to_grow():
    import pytest

    from pipeline.config.settings import DOC_GROWTH_BYTES, Settings

    s = Settings()
    assert s.http.max_body_bytes + DOC_GROWTH_BYTES <= s.producer.max_request_size
    with pytest.raises(ValueError, match="must be at least"):
        Settings(http={"max_body_bytes": 8 << 20}, producer={"max_request_size": 8 << 20})
