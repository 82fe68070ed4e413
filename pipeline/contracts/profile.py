"""One `llmpipe profile` run as a `profile_runs` row (schemas/clickhouse/009_profile_runs.sql): what
`llmpipe profile` sends to the admin server while the sink process owns the chDB directory."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel


class ProfileRun(BaseModel):
    run_id: str
    stage: str
    started: datetime
    seconds: float
    warmup_s: float
    model: str
    model_revision: str
    runtime: dict[str, str]
    hardware: dict[str, str]
    traffic: dict[str, float]
    control: dict[str, float]
    profiled: dict[str, float]
    overhead_pct: float
    trace_path: str
    top_ops: list[tuple[str, float, int]]

    def row(self) -> list[Any]:
        return [getattr(self, c) for c in PROFILE_COLUMNS]


PROFILE_COLUMNS = list(ProfileRun.model_fields)
