"""ClickHouse DDL through chDB: numbered migrations apply idempotently; rows dedupe by key."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

SCRIPT = r"""
import sys
from pipeline.stores.warehouse import Warehouse, migrations
from pipeline.stores import warehouse_rows as rows
from pipeline.contracts import Evidence
w = Warehouse("chdb://" + sys.argv[1])
fresh = sys.argv[2] == "fresh"
first = w.migrate()
second = w.migrate()
expected = [n for _, n, _ in migrations()] if fresh else []
assert first == expected, first
assert second == [], second
ev = Evidence(request_id="r1", stage="s", decision="d", finished_ms=1_700_000_000_000)
w.insert("decisions", rows.DECISIONS_COLUMNS, [rows.decision_row(ev)] * 3)
w.insert("decisions", rows.DECISIONS_COLUMNS, [rows.decision_row(ev.model_copy(update={"replay_id": "x", "shadow": True}))])
assert w.query("SELECT count() FROM decisions FINAL WHERE step = 0").rows == [(2,)]
# several decisions of one stage for one request (generate's engine attempts) are kept apart by step
w.insert("decisions", rows.DECISIONS_COLUMNS, [rows.decision_row(ev.model_copy(update={"step": n})) for n in (1, 2, 2)])
assert w.query("SELECT count() FROM decisions FINAL WHERE replay_id = ''").rows == [(3,)]
tables = {r[0] for r in w.query("SHOW TABLES").rows}
assert {"decisions", "requests", "rollouts", "weight_events", "dead_letters", "schema_migrations"} <= tables, tables
print("ok", len(first))
"""


def run(directory, mode: str) -> subprocess.CompletedProcess:
    # chDB allows one directory per process: each run is a fresh interpreter
    return subprocess.run([sys.executable, "-c", SCRIPT, str(directory), mode], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_migrations_apply_twice_and_rows_dedupe(tmp_path):
    first = run(tmp_path / "wh", "fresh")
    assert first.returncode == 0, first.stderr
    from pipeline.stores.warehouse import migrations

    assert first.stdout.strip() == f"ok {len(migrations())}"
    again = run(tmp_path / "wh", "again")  # a restart re-applies nothing and re-inserts dedupe
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "ok 0"
