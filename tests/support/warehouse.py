"""The warehouse as an analyst reads it: `llmpipe sql` on a data dir (through its running stack, or
chDB directly once it is down), and a wait for rows that fails with what it saw."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.cli import last_json, llmpipe
from tests.support.waits import poll


def sql(data_dir: Path, query: str) -> list[dict[str, Any]]:
    """One read-only statement's rows, as `llmpipe sql --format json` prints them."""
    r = llmpipe("sql", query, "--format", "json", data_dir=data_dir)
    assert r.returncode == 0, r.stderr
    return last_json(r)


def rows_when(data_dir: Path, query: str, done: Callable[[list[dict[str, Any]]], Any],
              timeout: float = 60) -> list[dict[str, Any]]:
    """`query`'s rows once `done(rows)` holds (the sink writes in batches); fails after `timeout`
    seconds with the query and the rows it last saw, never returns a partial answer."""
    return poll(lambda: sql(data_dir, query), done, timeout, query, interval=1.0)
