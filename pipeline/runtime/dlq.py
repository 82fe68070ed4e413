"""Dead letters: the original record byte for byte, plus why it failed and where."""

from __future__ import annotations

import base64

from aiokafka.structs import ConsumerRecord

from pipeline.contracts import DlqRecord
from pipeline.runtime.codec import header_map


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def dead_letter(
    record: ConsumerRecord, *, stage: str, worker: str, error_class: str, error: str, attempts: int
) -> DlqRecord:
    hdrs = header_map(record.headers)
    return DlqRecord(
        stage=stage,
        worker=worker,
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        timestamp_ms=record.timestamp,
        key_b64=None if record.key is None else _b64(record.key),
        value_b64=_b64(record.value or b""),
        headers=[(k, _b64(v or b"")) for k, v in (record.headers or ())],
        error_class=error_class,
        error=error[:2000],
        attempts=attempts,
        request_id=hdrs.get("request_id"),
        tenant_id=hdrs.get("tenant_id"),
    )
