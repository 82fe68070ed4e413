"""Dead letters: the original record, minus secrets and bounded in size, plus why it failed and where.

1. A caller's `api_key` is removed from the value before anything is kept (the DLQ is retained
   for weeks; a key there is a key at rest). The digest is of the original bytes.
2. A value larger than `MAX_KEPT_BYTES` keeps only its first bytes: base64 grows a value by a
   third, so a record near the topic's size limit could otherwise never be dead-lettered, and the
   stage would retry it forever. Its length and SHA-256 say what it was.
"""

from __future__ import annotations

import base64
import hashlib
import re

import orjson
from aiokafka.structs import ConsumerRecord

from pipeline.contracts import DlqRecord
from pipeline.runtime.codec import header_map

MAX_KEPT_BYTES = 1 << 20
# A value that is not JSON may still carry a key: blank every `"api_key": "…"` pair textually.
_KEY_TEXT = re.compile(rb'"api_key"\s*:\s*"(?:[^"\\]|\\.)*"')


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def redact_key(value: bytes) -> tuple[bytes, list[str]]:
    """The value without the caller's API key; the names of what was removed."""
    try:
        obj = orjson.loads(value)
    except orjson.JSONDecodeError:
        cleaned, n = _KEY_TEXT.subn(b'"api_key":null', value)
        return cleaned, ["api_key"] if n else []
    if isinstance(obj, dict) and obj.get("api_key") is not None:
        obj["api_key"] = None
        return orjson.dumps(obj), ["api_key"]
    return value, []


def dead_letter(
    record: ConsumerRecord, *, stage: str, worker: str, error_class: str, error: str, attempts: int,
    max_kept_bytes: int = MAX_KEPT_BYTES,
) -> DlqRecord:
    hdrs = header_map(record.headers)
    original = record.value or b""
    kept, redacted = redact_key(original)
    return DlqRecord(
        stage=stage,
        worker=worker,
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        timestamp_ms=record.timestamp,
        key_b64=None if record.key is None else _b64(record.key),
        value_b64=_b64(kept[:max_kept_bytes]),
        value_bytes=len(original),
        value_sha256=hashlib.sha256(original).hexdigest(),
        value_truncated=len(kept) > max_kept_bytes,
        redacted=redacted,
        headers=[(k, _b64(v or b"")) for k, v in (record.headers or ())],
        error_class=error_class,
        error=error[:2000],
        attempts=attempts,
        request_id=hdrs.get("request_id"),
        tenant_id=hdrs.get("tenant_id"),
    )
