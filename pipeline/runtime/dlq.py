"""Dead letters: the original record, minus secrets and bounded in size, plus why it failed and where.

1. A caller's `api_key` and the door's `caller_assertion` are removed from the value before
   anything is kept (the DLQ is retained for weeks; a key there is a key at rest): every
   occurrence, at any depth, duplicated or with an escaped name. The digest is of the original bytes.
2. A value larger than `MAX_KEPT_BYTES` keeps only its first bytes: base64 grows a value by a
   third, so a record near the topic's size limit could otherwise never be dead-lettered, and the
   stage would retry it forever. Its length and SHA-256 say what it was.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re

from aiokafka.structs import ConsumerRecord

from pipeline.contracts import DlqRecord
from pipeline.runtime.codec import header_map

MAX_KEPT_BYTES = 1 << 20
# Fields whose values are credentials: a Kafka producer's API key, the door's signed assertion.
# Compared case-insensitively and after JSON unescaping ("api\u005fkey" is "api_key").
SECRET_FIELDS = frozenset({"api_key", "caller_assertion"})
# A value that is not JSON may still carry a key: each `"name": value` pair, the value a string
# (perhaps cut short by truncation at the end) or a bare word.
# A value with none of these can hold no secret field (every escaped name has a `\u`): kept as it is
# without parsing it again (a flood of poison records costs a byte scan each, not a json.loads).
_MAYBE = re.compile(rb"(?i)api.key|caller.assertion|\\u")
_PAIR = re.compile(rb'"((?:[^"\\]|\\.)*)"(\s*:\s*)("(?:[^"\\]|\\.)*(?:"|\\?\Z)|[^,}\]\s]*)', re.S)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _secret_name(name: str) -> str | None:
    low = name.lower()
    return low if low in SECRET_FIELDS else None


def _redact_json(value: bytes) -> tuple[bytes, list[str]] | None:
    """Every secret field at any depth, duplicates included (orjson keeps only a key's last value:
    `{"api_key": "lp-…", "api_key": null}` looked clean). None when the value is not JSON."""
    found: set[str] = set()

    def pairs(items: list[tuple[str, object]]) -> dict[str, object]:
        out: dict[str, object] = {}
        for k, v in items:
            name = _secret_name(k)
            if name is not None and v is not None:
                found.add(name)
            out[k] = None if name is not None else v
        return out

    try:
        obj = json.loads(value, object_pairs_hook=pairs)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested too deep to parse here
        return None
    if not found:
        return value, []
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode(), sorted(found)


def _redact_text(value: bytes) -> tuple[bytes, list[str]]:
    found: set[str] = set()

    def blank(m: re.Match[bytes]) -> bytes:
        try:
            name = _secret_name(json.loads(b'"' + m.group(1) + b'"'))
        except ValueError:
            name = _secret_name(m.group(1).decode("utf-8", "replace"))
        if name is None or m.group(3) == b"null":
            return m.group(0)
        found.add(name)
        return b'"' + m.group(1) + b'"' + m.group(2) + b"null"

    return _PAIR.sub(blank, value), sorted(found)


def redact_key(value: bytes) -> tuple[bytes, list[str]]:
    """The value without the caller's credentials (SECRET_FIELDS, wherever they stand and however
    often); the names of what was removed. A value that is not JSON is blanked textually."""
    if not _MAYBE.search(value):
        return value, []
    done = _redact_json(value)
    return done if done is not None else _redact_text(value)


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
