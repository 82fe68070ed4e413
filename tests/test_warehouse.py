"""ClickHouse DDL through chDB: numbered migrations apply idempotently; rows dedupe by key."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.paths import ROOT

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


# Identities are the tenant's (issue 35, findings 5 and 6): rows of two tenants that chose the same
# feedback_id / request_id are both kept, and the feedback views join each tenant's own rows.
IDENTITIES = r"""
import sys
from pipeline.stores.warehouse import Warehouse, migrations, statements
from pipeline.stores import warehouse_rows as rows
from pipeline.contracts import Evidence, Feedback, Response, Rollout
w = Warehouse("chdb://" + sys.argv[1])
upgrade = sys.argv[2] == "upgrade"
w.migrate(until=16 if upgrade else None)  # upgrade: the warehouse as it was, its rows written, then 017
T = 1_700_000_000_000
def answer(tenant, status, route):
    return Response(request_id="req-7", tenant_id=tenant, status=status, answered_by="postprocess", route=route,
                    actor_revision="m@1", finished_ms=T)
def sample(tenant, score):
    return Rollout(sample_id="req-7:0", group_id="g1", request_id="req-7", tenant_id=tenant, actor_revision="m@1",
                   temperature=1.0, top_p=1.0, max_tokens=8, prompt_token_ids=[1], generated_token_ids=[2],
                   logprobs=[-0.1], finish_reason="stop", score=score, created_ms=T)
def decision(tenant, version):
    return Evidence(request_id="req-7", tenant_id=tenant, stage="route", decision="simple", policy_version=version,
                    finished_ms=T)
def fb(tenant, value):
    return Feedback(feedback_id="fb-42", request_id="req-7", metric="thumbs_up", value=value, tenant_id=tenant,
                    created_ms=T)
# acme first, then globex reusing both ids (a later insert: it would win a shared key)
for tenant, status, value, score in (("acme", "ok", True, 1.0), ("globex", "error", False, 0.0)):
    # the columns of the warehouse as it was: later migrations add some (018: tool_calls)
    cols = [c for c in rows.REQUESTS_COLUMNS if not upgrade or c != "tool_calls"]
    row = dict(zip(rows.REQUESTS_COLUMNS, rows.request_row(answer(tenant, status, f"route-{tenant}"))))
    w.insert("requests", cols, [[row[c] for c in cols]])
    w.insert("rollouts", rows.ROLLOUTS_COLUMNS, [rows.rollout_row(sample(tenant, score))])
    w.insert("decisions", rows.DECISIONS_COLUMNS, [rows.decision_row(decision(tenant, f"pol-{tenant}"))])
    w.insert("feedback", rows.FEEDBACK_COLUMNS, [rows.feedback_row(fb(tenant, value))])
if upgrade:
    assert "017_tenant_keys" in w.migrate()
    # a crash part-way (a table swapped, the old one not dropped yet) and 017 not recorded: it runs
    # again from the start, and keeps every row
    rekey = statements(next(sql for version, _, sql in migrations() if version == 17))
    swapped = next(i for i, st in enumerate(rekey) if st.startswith("EXCHANGE"))
    for statement in rekey[:swapped + 1] + rekey:
        w.client.command(statement)
for table in ("requests", "rollouts", "decisions", "feedback"):
    w.query(f"OPTIMIZE TABLE {table} FINAL")  # a merge: what FINAL would keep forever
got = {t: w.query(f"SELECT tenant_id FROM {t} FINAL ORDER BY tenant_id").rows
       for t in ("requests", "rollouts", "decisions", "feedback")}
assert all(v == [("acme",), ("globex",)] for v in got.values()), got
joined = w.query("SELECT tenant_id, value_float, status, route, route_policy_version FROM feedback_joined "
                 "ORDER BY tenant_id").rows
assert joined == [("acme", 1.0, "ok", "route-acme", "pol-acme"),
                  ("globex", 0.0, "error", "route-globex", "pol-globex")], joined
means = w.query("SELECT tenant_id, group_mean_score, group_size FROM training_samples ORDER BY tenant_id").rows
assert means == [("acme", 1.0, 1), ("globex", 0.0, 1)], means
print("ok")
"""


def test_ids_of_two_tenants_never_replace_each_other(tmp_path):
    r = subprocess.run([sys.executable, "-c", IDENTITIES, str(tmp_path / "wh"), "fresh"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


def test_migration_017_keeps_an_existing_warehouses_rows_and_rekeys_them(tmp_path):
    """An existing warehouse (migrations up to 016, rows written under the old keys, colliding ones
    not merged yet) is rebuilt by 017 with every row kept."""
    r = subprocess.run([sys.executable, "-c", IDENTITIES, str(tmp_path / "wh"), "upgrade"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


TOOL_SECTIONS = r"""
import sys, json
from datetime import datetime, timezone
from pipeline.analysis.report import build_report
from pipeline.stores.warehouse import Warehouse
from pipeline.stores import warehouse_rows as rows
from pipeline.contracts import Evidence, Response
from pipeline.contracts.request import Choice, ToolCall
w = Warehouse("chdb://" + sys.argv[1])
w.migrate()
T = 1_700_000_000_000
def call(name):
    return ToolCall(id="c-" + name, function={"name": name, "arguments": "{}"})
answers = [
    Response(request_id="a", tenant_id="acme", status="ok", answered_by="postprocess", route="support",
             tool_calls=[call("get_weather"), call("send_email")], finished_ms=T),
    Response(request_id="b", tenant_id="acme", status="ok", answered_by="postprocess", route="support",
             tool_calls=[call("get_weather")], choices=[Choice(index=1, text="", tool_calls=[call("get_weather")],
                                                              finish_reason="tool_calls")], finished_ms=T),
    Response(request_id="c", tenant_id="acme", status="error", error_class="tool_call_refused",
             answered_by="postprocess", finished_ms=T),
    Response(request_id="d", tenant_id="acme", status="rejected", error_class="tool_not_allowed",
             answered_by="mask", finished_ms=T),
]
w.insert("requests", rows.REQUESTS_COLUMNS, [rows.request_row(r) for r in answers])
decisions = [
    Evidence(request_id="a", tenant_id="acme", stage="route.tools", decision="narrowed",
             scores={"tools.offered": 40.0, "tools.kept": 8.0}, finished_ms=T),
    Evidence(request_id="b", tenant_id="acme", stage="route.tools", decision="narrowed",
             scores={"tools.offered": 20.0, "tools.kept": 8.0}, finished_ms=T),
    Evidence(request_id="a", tenant_id="acme", stage="generate.attempt", decision="refused",
             reason="incompatible: no tool calling", finished_ms=T),
]
w.insert("decisions", rows.DECISIONS_COLUMNS, [rows.decision_row(e) for e in decisions])
doc = build_report(lambda sql, p: w.query(sql, p), datetime.fromtimestamp(T / 1000 - 60, timezone.utc))
print(json.dumps({k: doc["sections"][k] for k in ("tool_calls", "tool_checks")}))
"""


def test_the_report_counts_tool_calls_narrowing_and_refusals_from_the_raw_rows(tmp_path):
    r = subprocess.run([sys.executable, "-c", TOOL_SECTIONS, str(tmp_path / "wh")], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    calls = {row["tool"]: (row["calls"], row["requests"]) for row in got["tool_calls"]}
    assert calls == {"get_weather": (3, 2), "send_email": (1, 1)}, got["tool_calls"]  # a second choice counts
    (checks,) = got["tool_checks"]
    assert checks == {"narrowed": 2, "offered_avg": 30.0, "kept_avg": 8.0, "not_allowed": 1, "invalid_calls": 0,
                      "refused_calls": 1, "deployments_skipped": 1}, checks
