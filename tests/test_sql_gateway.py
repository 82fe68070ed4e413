"""The SQL gateway is read-only and needs a token: every known bypass of /sql is refused, by the
syntactic pre-check and, without it, by ClickHouse's readonly=1; the sink still inserts afterwards.

chDB allows one directory per process, so everything that opens a warehouse runs in one fresh
interpreter (SCRIPT) against a chDB directory in tmp; the tests read its JSON outcome."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from pipeline.config.settings import SecretSettings, Settings
from pipeline.report import SECTIONS, query_text
from pipeline.stores.sql_gateway import (
    ALLOWED_SYSTEM_TABLES,
    ALLOWED_TABLE_FUNCTIONS,
    REFUSED_FUNCTIONS,
    SqlError,
    admin_app,
    admin_token_for,
    admin_token_path,
    check_read_only,
    ensure_admin_token,
)
from tests.conftest import ROOT

# (name, statement): each must be refused by the pre-check and by /sql
BYPASSES = [
    ("file", "SELECT * FROM file('/etc/hostname', 'LineAsString')"),
    ("file scalar", "SELECT file('/etc/hostname')"),
    ("quoted file", 'SELECT * FROM "file"(\'/etc/hostname\', \'LineAsString\')'),
    ("outfile", "SELECT 1 INTO OUTFILE '/tmp/llmpipe-sql-gateway-outfile'"),
    ("url", "SELECT * FROM url('http://127.0.0.1:1/x', 'CSV', 'a String')"),
    ("s3", "SELECT * FROM s3('http://127.0.0.1:1/bucket-name/x.csv', 'CSV', 'a String')"),
    ("remote", "SELECT * FROM remote('127.0.0.1:1', default.decisions)"),
    ("executable", "SELECT * FROM executable('true', 'CSV', 'a String')"),
    ("python", "SELECT * FROM python(os)"),
    ("merge over system", "SELECT count() FROM merge('system', '^users$')"),
    ("settings readonly=0", "SELECT * FROM file('/etc/hostname', 'LineAsString') SETTINGS readonly=0"),
    ("settings only", "SELECT 1 SETTINGS readonly=0"),
    ("system.users", "SELECT * FROM system.users"),
    ("system.settings", "SELECT name, value FROM system.settings"),
    ("quoted system", 'SELECT * FROM "system"."processes"'),
    ("spaced system", "SELECT * FROM system . query_log"),
    ("information_schema", "SELECT * FROM information_schema.tables"),
    ("show tables from system", "SHOW TABLES FROM system"),
    ("show processlist", "SHOW PROCESSLIST"),
    ("show grants", "SHOW GRANTS"),
    ("show create user", "SHOW CREATE USER default"),
    ("describe system", "DESCRIBE TABLE system.users"),
    ("identifier parameter", "SELECT * FROM {db:Identifier}.users"),
    ("two statements", "SELECT 1; SELECT 2"),
    ("write after select", "SELECT 1; DROP TABLE decisions"),
    ("comment-hidden statement", "SELECT 1 -- harmless\n; DROP TABLE decisions"),
    ("comment-split outfile", "SELECT 1 INTO /* x */ OUTFILE '/tmp/llmpipe-sql-gateway-outfile'"),
    ("comment before call", "SELECT * FROM file/* x */('/etc/hostname', 'LineAsString')"),
    ("with insert", "WITH 1 AS x INSERT INTO decisions (request_id) SELECT 'x'"),
    ("drop", "DROP TABLE decisions"),
    ("insert", "INSERT INTO decisions (request_id) VALUES ('x')"),
    ("create", "CREATE TABLE x (a UInt8) ENGINE = Memory"),
    ("unterminated string", "SELECT 'abc"),
]

# each must pass the pre-check (and, in SCRIPT, run under readonly=1)
ACCEPTED = [
    "SELECT count() FROM decisions",
    "select count() from decisions final;",
    "SELECT 'file(x) INTO OUTFILE system.users; SETTINGS' AS s FROM decisions",  # all inside a string
    "SELECT count() AS `system users` FROM decisions -- a comment naming system.users and file(",
    "SELECT count() /* ; DROP TABLE decisions */ FROM decisions",
    "SELECT count() FROM decisions WHERE stage = {stage:String}",
    "WITH s AS (SELECT stage FROM decisions) SELECT count() FROM s",
    "SELECT 1 FROM system.one",
    "SELECT sum(number) FROM numbers(10)",
    "SHOW TABLES",
    "SHOW CREATE TABLE decisions",
    "DESCRIBE decisions",
    "DESC TABLE decisions",
    "EXISTS TABLE decisions",
    "EXPLAIN SELECT count() FROM decisions",
]


@pytest.mark.parametrize("name,statement", BYPASSES, ids=[n for n, _ in BYPASSES])
def test_pre_check_refuses(name, statement):
    with pytest.raises(SqlError):
        check_read_only(statement)


@pytest.mark.parametrize("statement", ACCEPTED)
def test_pre_check_accepts(statement):
    check_read_only(statement)


def test_shipped_queries_pass_the_pre_check():
    from pipeline.rollouts import EXPORT_SQL, FEEDBACK_EXPORT_SQL
    from pipeline.stores.owners import _SQL as OWNER_SQL

    for sec in SECTIONS:
        check_read_only(query_text(sec.name))
    for sql in (EXPORT_SQL, FEEDBACK_EXPORT_SQL, *OWNER_SQL.values()):
        check_read_only(sql)


def test_admin_token_file_is_private_and_shared(tmp_path):
    tokens: list[str] = []
    barrier = threading.Barrier(8)

    def take() -> None:
        barrier.wait()
        tokens.append(ensure_admin_token(tmp_path))

    threads = [threading.Thread(target=take) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(tokens) == 8 and len(set(tokens)) == 1 and len(tokens[0]) >= 32  # one winner, read by all
    path = admin_token_path(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert sorted(p.name for p in path.parent.iterdir()) == ["admin.token"]  # no temporary file left
    assert ensure_admin_token(tmp_path) == tokens[0]
    # another process of the same data dir (the sink child, `llmpipe sql`) reads the same token
    other = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; from pipeline.stores."
                            "sql_gateway import ensure_admin_token as e; print(e(Path(sys.argv[1])))", str(tmp_path)],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert other.stdout.strip() == tokens[0], other.stderr
    path.chmod(0o644)
    with pytest.raises(SqlError, match="readable by others"):
        ensure_admin_token(tmp_path)


def test_configured_admin_token_wins(tmp_path):
    s = Settings(data_dir=tmp_path, secrets=SecretSettings(admin_token=SecretStr("x" * 24)))
    assert admin_token_for(s) == "x" * 24
    assert not admin_token_path(tmp_path).exists()
    with pytest.raises(SqlError, match="at least 16"):
        admin_token_for(Settings(data_dir=tmp_path, secrets=SecretSettings(admin_token=SecretStr("short"))))
    generated = admin_token_for(Settings(data_dir=tmp_path))
    assert admin_token_path(tmp_path).read_text().strip() == generated


class _NoWarehouse:
    """Auth and the pre-check answer before the warehouse is reached."""

    def __getattr__(self, name):
        raise AssertionError(f"the warehouse was reached: {name}")


def test_admin_endpoints_need_the_token():
    client = TestClient(admin_app(_NoWarehouse(), "right-token-0123456789"))
    body = {"query": "SELECT count() FROM decisions", "parameters": {}}
    assert client.get("/health").status_code == 200
    assert client.get("/metrics").status_code == 200  # open on purpose, see admin_app
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "right-token-0123456789"},
                    {"Authorization": "Bearer right-token-0123456789x"}):
        assert client.post("/sql", json=body, headers=headers).status_code == 401
        assert client.post("/profile_runs", json={}, headers=headers).status_code == 401
    r = client.post("/sql", json={"query": "SELECT * FROM system.users"},
                    headers={"Authorization": "Bearer right-token-0123456789"})
    assert r.status_code == 400 and "system.users" in r.json()["detail"]
    with pytest.raises(ValueError):
        admin_app(_NoWarehouse(), "")


SCRIPT = r"""
import json, sys
from pathlib import Path
from fastapi.testclient import TestClient
from pipeline.contracts import Evidence
from pipeline.stores import warehouse_rows as rows
from pipeline.stores.sql_gateway import admin_app
from pipeline.stores.warehouse import Warehouse

directory, token = Path(sys.argv[1]), sys.argv[2]
bypasses, accepted, guarantee = json.loads(Path(sys.argv[3]).read_text())
out = {}
w = Warehouse(f"chdb://{directory}")
w.migrate()
ev = Evidence(request_id="r1", stage="s", decision="d", finished_ms=1_700_000_000_000)
w.insert("decisions", rows.DECISIONS_COLUMNS, [rows.decision_row(ev)])

def attempt(fn):
    try:
        res = fn()
        return {"ok": True, "rows": [[str(v) for v in r] for r in res.rows][:3]}
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}

# 1. readonly=1 alone, no pre-check: ClickHouse refuses
out["guarantee"] = {q: attempt(lambda q=q: w.query_readonly(q)) for q in guarantee}
out["system_settings_under_readonly"] = attempt(lambda: w.query_readonly("SELECT count() FROM system.settings"))
# 2. the same handle still writes: the sink's inserts never share the read-only session
w.insert("decisions", rows.DECISIONS_COLUMNS, [rows.decision_row(ev.model_copy(update={"request_id": "r2"}))])
out["count_after"] = w.query("SELECT count() FROM decisions FINAL").rows[0][0]
out["tables_after"] = sorted(r[0] for r in w.query("SHOW TABLES").rows)
# 3. the real admin app
client = TestClient(admin_app(w, token))
auth = {"Authorization": f"Bearer {token}"}
def post(q, headers=auth, params=None):
    r = client.post("/sql", json={"query": q, "parameters": params or {}}, headers=headers)
    return {"status": r.status_code, "body": r.json()}
out["no_token"] = post("SELECT count() FROM decisions", headers={})
out["wrong_token"] = post("SELECT count() FROM decisions", headers={"Authorization": "Bearer nope"})
out["right_token"] = post("SELECT count() FROM decisions FINAL")
out["parameters"] = post("SELECT count() FROM decisions FINAL WHERE request_id = {rid:String}", params={"rid": "r1"})
out["bypasses"] = {name: post(q) for name, q in bypasses}
out["accepted"] = {q: post(q, params={"stage": "s"}) for q in accepted}
# 4. the sink inserts after all that, through the same handle
w.insert("decisions", rows.DECISIONS_COLUMNS, [rows.decision_row(ev.model_copy(update={"request_id": "r3"}))])
out["count_end"] = w.query("SELECT count() FROM decisions FINAL").rows[0][0]
out["table_functions"] = sorted(r[0] for r in w.query("SELECT name FROM system.table_functions").rows)
w.close()
print(json.dumps(out))
"""

# readonly=1 by itself (no pre-check) must refuse these: reads and writes outside, DDL, DML, settings
GUARANTEE = [
    "SELECT * FROM file('/etc/hostname', 'LineAsString')",
    "SELECT * FROM file('/etc/hostname', 'LineAsString') SETTINGS readonly = 0",
    "SELECT * FROM url('http://127.0.0.1:1/x', 'CSV', 'a String')",
    "SELECT * FROM s3('http://127.0.0.1:1/bucket-name/x.csv', 'CSV', 'a String')",
    "SELECT * FROM remote('127.0.0.1:1', default.decisions)",
    "SELECT * FROM executable('true', 'CSV', 'a String')",
    "INSERT INTO decisions (request_id) VALUES ('injected')",
    "WITH 1 AS x INSERT INTO decisions (request_id) SELECT 'injected'",
    "CREATE TABLE injected (a UInt8) ENGINE = Memory",
    "DROP TABLE decisions",
    "TRUNCATE TABLE decisions",
    "ALTER TABLE decisions DELETE WHERE 1",
]


@pytest.fixture(scope="module")
def outcome(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("sql_gateway")
    spec = tmp / "spec.json"
    spec.write_text(json.dumps([BYPASSES, ACCEPTED, GUARANTEE]))
    token = ensure_admin_token(tmp / "data")
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp / "warehouse"), token, str(spec)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_readonly_holds_without_the_pre_check(outcome):
    for q, res in outcome["guarantee"].items():
        assert not res["ok"], q
        assert "readonly" in res["error"].lower() or "READONLY" in res["error"], (q, res["error"])
    assert outcome["tables_after"].count("decisions") == 1 and "injected" not in outcome["tables_after"]
    # readonly=1 leaves system.* readable: that is why the pre-check refuses it
    assert outcome["system_settings_under_readonly"]["ok"]


def test_sink_still_inserts_after_readonly_queries(outcome):
    assert outcome["count_after"] == 2  # r1 and r2: nothing injected, the insert went through
    assert outcome["count_end"] == 3


def test_sql_endpoint_token_and_normal_queries(outcome):
    assert outcome["no_token"]["status"] == 401
    assert outcome["wrong_token"]["status"] == 401
    assert outcome["right_token"] == {"status": 200, "body": {"columns": ["count()"], "rows": [[2]]}}
    assert outcome["parameters"]["body"]["rows"] == [[1]]
    for q, res in outcome["accepted"].items():
        assert res["status"] == 200, (q, res)


def test_sql_endpoint_refuses_every_bypass(outcome):
    for name, res in outcome["bypasses"].items():
        assert res["status"] == 400, (name, res)
        assert "read-only" in res["body"]["detail"] or "unterminated" in res["body"]["detail"], (name, res)
    assert not Path("/tmp/llmpipe-sql-gateway-outfile").exists()


def test_every_table_function_is_classified(outcome):
    """A chDB upgrade that adds a table function fails here until it is put in one of the two lists."""
    names = {n.lower() for n in outcome["table_functions"]}
    assert names - REFUSED_FUNCTIONS - ALLOWED_TABLE_FUNCTIONS == set()
    assert not REFUSED_FUNCTIONS & ALLOWED_TABLE_FUNCTIONS
    assert {"one", "numbers"} <= ALLOWED_SYSTEM_TABLES


def test_a_wrong_query_is_one_line_from_the_cli(tmp_path):
    """Direct mode (no stack running): ClickHouse's refusal is the answer, on one line, exit 1."""
    r = subprocess.run([sys.executable, "-m", "pipeline.cli", "sql", "SELECT no_such_column FROM decisions",
                        "--data-dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 1, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "no_such_column" in lines[0], r.stderr[-2000:]
    assert "Traceback" not in r.stderr
