"""What every wire model shares: a fixed `schema` tag and strict field names."""

from __future__ import annotations

import time

from pydantic import BaseModel, ConfigDict


class WireModel(BaseModel):
    # Unknown fields are refused: a typo in a producer is a schema error, not silently dropped data.
    model_config = ConfigDict(
        extra="forbid", validate_by_name=True, validate_by_alias=True, serialize_by_alias=True
    )


def now_ms() -> int:
    return int(time.time() * 1000)
