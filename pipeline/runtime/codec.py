"""Bytes <-> wire models, and the Kafka headers every pipeline record carries."""

from __future__ import annotations

from typing import TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from pipeline.runtime.errors import DecodeError

M = TypeVar("M", bound=BaseModel)

Headers = list[tuple[str, bytes]]


def encode(model: BaseModel) -> bytes:
    return model.model_dump_json().encode()


def describe_validation_error(exc: ValidationError, limit: int = 5) -> str:
    """Field paths and error types only: the offending values may be PII, so they are left out."""
    parts = []
    for err in exc.errors(include_input=False, include_url=False, include_context=False)[:limit]:
        loc = ".".join(str(p) for p in err["loc"]) or "<root>"
        parts.append(f"{loc}: {err['type']}")
    more = exc.error_count() - limit
    return "; ".join(parts) + (f"; +{more} more" if more > 0 else "")


def decode(raw: bytes | None, model: type[M]) -> M:
    """Parse and validate; raise DecodeError('undecodable' | 'schema_invalid')."""
    if raw is None:
        raise DecodeError("undecodable", "record has no value (tombstone)")
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise DecodeError("undecodable", f"not JSON: {exc.msg} at byte {exc.pos}") from None
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        raise DecodeError("schema_invalid", describe_validation_error(exc), raw=obj) from None


def header_map(headers: Headers | tuple | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in headers or ():
        if value is not None:
            out[name] = value.decode("utf-8", "replace")
    return out


def request_headers(
    request_id: str, tenant_id: str | None, deadline_ms: int | None, attempt: int, traceparent: str | None
) -> Headers:
    hs: Headers = [("request_id", request_id.encode()), ("attempt", str(attempt).encode())]
    if tenant_id:
        hs.append(("tenant_id", tenant_id.encode()))
    if deadline_ms is not None:
        hs.append(("deadline", str(deadline_ms).encode()))
    if traceparent:
        hs.append(("traceparent", traceparent.encode()))
    return hs
