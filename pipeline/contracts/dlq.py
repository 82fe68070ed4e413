"""A dead letter: the original record, byte for byte, and why it could not be processed."""

from __future__ import annotations

import base64
from typing import Final, Literal

from pydantic import Field

from pipeline.contracts.base import WireModel, now_ms

DLQ_SCHEMA: Final = "dlq/v1"


class DlqRecord(WireModel):
    schema_: Literal["dlq/v1"] = Field(DLQ_SCHEMA, alias="schema")
    stage: str
    worker: str
    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key_b64: str | None = None
    value_b64: str = Field(description="the original value bytes, base64 (the first value_kept_bytes of them "
                                       "when the record was too large to keep whole)")
    value_bytes: int | None = Field(None, description="length of the original value")
    value_sha256: str | None = Field(None, description="digest of the original value, before any redaction")
    value_truncated: bool = False
    redacted: list[str] = Field(default_factory=list, description="secrets removed from the value (api_key)")
    headers: list[tuple[str, str]] = Field(default_factory=list, description="(name, base64 value)")
    error_class: str = Field(description="undecodable | schema_invalid | processing_failed | ...")
    error: str = Field(description="the error, without the record's content")
    attempts: int = 0
    request_id: str | None = None
    tenant_id: str | None = None
    failed_ms: int = Field(default_factory=now_ms)

    def original_value(self) -> bytes:
        return base64.b64decode(self.value_b64)

    def original_key(self) -> bytes | None:
        return None if self.key_b64 is None else base64.b64decode(self.key_b64)
