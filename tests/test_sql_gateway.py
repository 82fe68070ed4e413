"""The SQL gateway is read-only and needs a token: every known bypass of /sql is refused, by the
textual check, by the allow-list over ClickHouse's own parse (each alone), and for what it covers by
ClickHouse's readonly=1; the sink still inserts afterwards. Issue 35's `$` bypasses among them.

chDB allows one directory per process, so everything that opens a warehouse runs in one fresh
interpreter (SCRIPT) against a chDB directory in tmp; the tests read its JSON outcome."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from pipeline.analysis.report import SECTIONS, query_text
from pipeline.config.settings import SecretSettings, Settings
from pipeline.ingress.admin import (
    admin_app,
    admin_token_for,
    admin_token_path,
    ensure_admin_token,
)
from pipeline.stores.sql_gateway import (
    ALLOWED_SYSTEM_TABLES,
    ALLOWED_TABLE_FUNCTIONS,
    REFUSED_FUNCTIONS,
    SqlError,
    check_read_only,
)
from tests.support.paths import ROOT

# (name, statement[, parameters]): each must be refused by /sql, without reading @SECRET@ (a file
# holding SECRET_TEXT) or writing @OUT@; the SCRIPT puts real paths in their place
BYPASSES = [
    ("file", "SELECT * FROM file('@SECRET@', 'LineAsString')"),
    ("file scalar", "SELECT file('@SECRET@')"),
    ("quoted file", 'SELECT * FROM "file"(\'@SECRET@\', \'LineAsString\')'),
    ("outfile", "SELECT 1 INTO OUTFILE '@OUT@'"),
    ("url", "SELECT * FROM url('http://127.0.0.1:1/x', 'CSV', 'a String')"),
    ("s3", "SELECT * FROM s3('http://127.0.0.1:1/bucket-name/x.csv', 'CSV', 'a String')"),
    ("remote", "SELECT * FROM remote('127.0.0.1:1', default.decisions)"),
    ("executable", "SELECT * FROM executable('true', 'CSV', 'a String')"),
    ("python", "SELECT * FROM python(os)"),
    ("merge over system", "SELECT count() FROM merge('system', '^users$')"),
    ("SETTINGS readonly=0", "SELECT * FROM file('@SECRET@', 'LineAsString') SETTINGS readonly=0"),
    ("SETTINGS only", "SELECT 1 SETTINGS readonly=0"),
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
    ("identifier parameter", "SELECT * FROM {db:Identifier}.users", {"db": "system"}),
    ("two statements", "SELECT 1; SELECT 2"),
    ("write after select", "SELECT 1; DROP TABLE decisions"),
    ("comment-hidden statement", "SELECT 1 -- harmless\n; DROP TABLE decisions"),
    ("comment-split outfile", "SELECT 1 INTO /* x */ OUTFILE '@OUT@'"),
    ("comment before call", "SELECT * FROM file/* x */('@SECRET@', 'LineAsString')"),
    ("with insert", "WITH 1 AS x INSERT INTO decisions (request_id) SELECT 'x'"),
    ("drop", "DROP TABLE decisions"),
    ("insert", "INSERT INTO decisions (request_id) VALUES ('x')"),
    ("create", "CREATE TABLE x (a UInt8) ENGINE = Memory"),
    ("unterminated string", "SELECT 'abc"),
    # issue 35: `$` belongs to bare words, so `a$$ ... b$$` is no heredoc
    ("issue 35 read", "SELECT 1 AS a$$, file('@SECRET@','RawBLOB'), 2 AS b$$"),
    ("issue 35 write", "SELECT 'x' AS a$$ INTO OUTFILE '@OUT@' -- b$$"),
    ("tagged dollar words", "SELECT 1 AS a$t$, file('@SECRET@','RawBLOB'), 2 AS b$t$"),
    ("dollar word then unclosed tag", "SELECT 1 AS x$y$, file('@SECRET@','RawBLOB') AS $y$"),
    ("dollar words round a comment", "SELECT 1 AS a$$ /* $$ */, file('@SECRET@','RawBLOB')"),
    ("non-word tag", "SELECT $a-b$ AS s, file('@SECRET@','RawBLOB') AS t, $a-b$ AS u"),
    ("heredoc then call", "SELECT $$ $$, file('@SECRET@','RawBLOB')"),
    ("dollar words, outfile in the middle", "SELECT 1 AS a$$ UNION ALL SELECT 2 AS b$$ INTO OUTFILE '@OUT@'"),
    ("dollar words hide a second statement", "SELECT 1 AS a$$; SELECT file('@SECRET@') -- $$"),
    ("number then dollar word", "SELECT 1 AS x1$$, file('@SECRET@','RawBLOB'), 2 AS y$$"),
    # quoting
    ("backquoted file", "SELECT `file`('@SECRET@', 'RawBLOB')"),
    ("unicode-quoted file", "SELECT \u201cfile\u201d('@SECRET@', 'RawBLOB')"),
    ("unicode string then call", "SELECT \u2018it's\u2019 AS s, file('@SECRET@', 'RawBLOB')"),
    ("doubled quote then call", "SELECT 'it''s' AS s, file('@SECRET@', 'RawBLOB')"),
    ("escaped quote then call", "SELECT 'it\\'s' AS s, file('@SECRET@', 'RawBLOB')"),
    ("case", "select 1 into outfile '@OUT@'"),
    ("case of the function", "SELECT FILE('@SECRET@', 'RawBLOB')"),
    # comments
    ("hash without space is no comment", "SELECT 1 #x\n, file('@SECRET@','RawBLOB')"),
    ("hash comment ends at newline", "SELECT 1 # c\n, file('@SECRET@','RawBLOB')"),
    ("slash comment ends at newline", "SELECT 1 // c\n, file('@SECRET@','RawBLOB')"),
    ("nested comment", "SELECT /* a /* b */ c */ file('@SECRET@','RawBLOB')"),
    # unicode whitespace
    ("no-break space", "SELECT\u00a0file('@SECRET@','RawBLOB')"),
    ("em space outfile", "SELECT 1 INTO\u2003OUTFILE '@OUT@'"),
    ("zero-width space system", "SELECT * FROM system\u200b.\u200busers"),
    ("mongolian vowel separator", "SELECT\u180efile('@SECRET@','RawBLOB')"),
    # system.* spelled otherwise
    ("backquoted system", "SELECT * FROM `system`.`users`"),
    ("upper system", "SELECT * FROM SYSTEM . users"),
    ("commented system", "SELECT * FROM system./**/users"),
    ("upper information_schema", "SELECT * FROM INFORMATION_SCHEMA.TABLES"),
    ("system in a scalar subquery", "SELECT (SELECT name FROM system.users LIMIT 1)"),
    ("system in IN", "SELECT 1 WHERE 'default' IN system.users"),
    ("show create system", "SHOW CREATE TABLE system.users"),
    ("exists system", "EXISTS system.users"),
    ("show columns in system", "SHOW COLUMNS FROM users IN system"),
    ("show settings", "SHOW SETTINGS LIKE '%'"),
    # table functions wherever they stand
    ("in a subquery", "SELECT * FROM (SELECT * FROM file('@SECRET@','RawBLOB'))"),
    ("in a join", "SELECT * FROM numbers(1) AS n JOIN file('@SECRET@','RawBLOB') AS f ON 1"),
    ("in a CTE", "WITH f AS (SELECT * FROM file('@SECRET@','RawBLOB')) SELECT * FROM f"),
    ("as a WITH expression", "WITH file('@SECRET@','RawBLOB') AS s SELECT s"),
    ("in IN (subquery)", "SELECT 1 WHERE 'x' IN (SELECT * FROM file('@SECRET@','RawBLOB'))"),
    ("in ARRAY JOIN", "SELECT x FROM numbers(1) ARRAY JOIN [file('@SECRET@','RawBLOB')] AS x"),
    ("in a lambda", "SELECT arrayMap(p -> file(p, 'RawBLOB'), ['@SECRET@'])"),
    ("in view()", "SELECT * FROM view(SELECT file('@SECRET@','RawBLOB'))"),
    ("unknown table function", "SELECT * FROM someFutureTableFunction('x')"),
    ("explain syntax", "EXPLAIN SYNTAX SELECT file('@SECRET@','RawBLOB')"),
    ("explain outfile", "EXPLAIN SELECT 1 INTO OUTFILE '@OUT@'"),
    ("describe a table function", "DESCRIBE file('@SECRET@','RawBLOB')"),
    ("union outfile", "SELECT 1 UNION ALL SELECT 2 INTO OUTFILE '@OUT@'"),
    ("outfile and stdout", "SELECT 1 INTO OUTFILE '@OUT@' AND STDOUT"),
    # SETTINGS and FORMAT
    ("SETTINGS after FORMAT", "SELECT 1 FORMAT TSV SETTINGS readonly=0"),
    ("SETTINGS behind a comment", "SELECT 1 SETTINGS/**/max_threads=1"),
    ("format", "SELECT 1 FORMAT JSON"),
    ("introspection", "SELECT demangle('x')"),  # the second line: chDB's own setting, off for analysts
]
# refused by ClickHouse's parse or by the tree check alone (the textual check lets them by)
TREE_ONLY = {"unknown table function", "format", "introspection"}
# ClickHouse's parser refuses these itself (several statements, a syntax or lexer error)
PARSE_ERRORS = {"two statements", "write after select", "comment-hidden statement", "unterminated string",
                "dollar words hide a second statement", "hash without space is no comment"}
SECRET_TEXT = "mask-local-key-4f1c"

# (statement, parameters): each must pass every check (and, in SCRIPT, run under readonly=1)
ACCEPTED = [
    ("SELECT count() FROM decisions", {}),
    ("select count() from decisions final;", {}),
    ("SELECT 'file(x) INTO OUTFILE system.users; SETTINGS' AS s FROM decisions", {}),  # all inside a string
    ("SELECT count() AS `system users` FROM decisions -- a comment naming system.users and file(", {}),
    ("SELECT count() /* ; DROP TABLE decisions */ FROM decisions", {}),
    ("SELECT count() FROM decisions WHERE stage = {stage:String}", {"stage": "s"}),
    ("SELECT count() FROM decisions", {"unused": "x"}),  # an unused parameter changes nothing
    ("WITH s AS (SELECT stage FROM decisions) SELECT count() FROM s", {}),
    ("SELECT 1 FROM system.one", {}),
    ("SELECT sum(number) FROM numbers(10)", {}),
    ("SHOW TABLES", {}),
    ("SHOW CREATE TABLE decisions", {}),
    ("DESCRIBE decisions", {}),
    ("DESC TABLE decisions", {}),
    ("EXISTS TABLE decisions", {}),
    ("EXPLAIN SELECT count() FROM decisions", {}),
    # `$`: heredocs are strings, `$` inside words is a word
    ("SELECT $$file('x') INTO OUTFILE 'y'; SETTINGS$$ AS s", {}),
    ("SELECT $tag$ ; DROP TABLE decisions $tag$ AS s", {}),
    ("SELECT 1 AS a$$, 2 AS b$$", {}),
    ("SELECT \u2018a string\u2019 AS \u201ca name\u201d", {}),
    ("SELECT 1 # a comment naming file(\n, 2", {}),
    ("SELECT /* nested /* comment */ file( */ 1", {}),
    # ordinary analysis
    ("SELECT d.stage, count() AS n FROM decisions AS d LEFT JOIN (SELECT request_id FROM decisions) AS r "
     "ON d.request_id = r.request_id GROUP BY d.stage ORDER BY n DESC LIMIT 5", {}),
    ("SELECT stage FROM decisions WHERE request_id IN (SELECT request_id FROM decisions WHERE stage = 's')", {}),
    ("SELECT x FROM numbers(3) ARRAY JOIN [1, 2] AS x", {}),
    ("SELECT arrayMap(v -> v * 2, [1, 2, 3]) AS doubled, arrayFilter(v -> v > 1, [1, 2]) AS big", {}),
    ("SELECT stage, count() OVER (PARTITION BY stage) FROM decisions", {}),
    ("SELECT quantile(0.9)(number) FROM numbers(100) WHERE number BETWEEN 1 AND 50", {}),
    ("SELECT 1 UNION ALL SELECT 2", {}),
    ("SELECT * FROM view(SELECT 1 AS x)", {}),
    ("SELECT toStartOfHour(now()) - INTERVAL 1 DAY, CASE WHEN 1 THEN 'a' ELSE 'b' END", {}),
    ("SELECT count() FROM decisions WHERE stage IN {stages:Array(String)}", {"stages": ["s", "t"]}),
]
def _fill(statement: str, secret: str = "/nonexistent/secret", out: str = "/nonexistent/out") -> str:
    return statement.replace("@SECRET@", secret).replace("@OUT@", out)


@pytest.mark.parametrize("case", [b for b in BYPASSES if b[0] not in TREE_ONLY], ids=lambda b: b[0])
def test_pre_check_refuses(case):
    with pytest.raises(SqlError):
        check_read_only(_fill(case[1]))


@pytest.mark.parametrize("statement,parameters", ACCEPTED)
def test_pre_check_accepts(statement, parameters):
    check_read_only(statement)


@pytest.mark.parametrize("sql,clean", [
    ("SELECT 1 AS a$$, file('p'), 2 AS b$$", "SELECT 1 AS a$$, file( '' ), 2 AS b$$"),  # issue 35: no heredoc
    ("SELECT $$x$$, $t$y$t$", "SELECT  '' ,  '' "),  # heredocs where a token starts
    ("SELECT $a-b$x$a-b$", "SELECT $a-b$x$a-b$"),  # a tag is word characters
    ("SELECT x$y$, 1 AS $y$", "SELECT x$y$, 1 AS $y$"),  # `$y$` never closed: a word
    ("SELECT 1 #x\n# y\n#!z", "SELECT 1 #x\n \n "),  # `#` is a comment before a space or `!` only
    ("SELECT 1 // c\n, 2 -- d", "SELECT 1  \n, 2  "),
    ("SELECT /* a /* b */ c */ 1", "SELECT   1"),
    ("SELECT \u2018a'b\u2019, \u201cc d\u201d, 1 \u2212 2", "SELECT  '' , c_d, 1 - 2"),
    ("SELECT\u00a0file\u200b(", "SELECT file ("),
    ("SELECT 'a\\'b', 'c''d', `e``f`", "SELECT  '' ,  '' , e_f"),
])
def test_the_lexer_reads_like_clickhouse(sql, clean):
    """The textual check's copy of ClickHouse's lexer (measured on chDB 26.9: see sql_check)."""
    from pipeline.stores.sql_check import _clean

    assert _clean(sql) == clean


def test_shipped_queries_pass_the_pre_check():
    for sql in _shipped_queries():
        check_read_only(sql)


def _shipped_queries() -> list[str]:
    from pipeline.stores.owners import _SQL as OWNER_SQL
    from pipeline.training.samples import EXPORT_SQL, FEEDBACK_EXPORT_SQL

    return [query_text(sec.name) for sec in SECTIONS] + [EXPORT_SQL, FEEDBACK_EXPORT_SQL, *OWNER_SQL.values()]


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
    other = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; from pipeline.ingress."
                            "admin import ensure_admin_token as e; print(e(Path(sys.argv[1])))", str(tmp_path)],
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
import json, re, sys
from pathlib import Path
from fastapi.testclient import TestClient
from pipeline.contracts import Evidence
from pipeline.stores import warehouse_rows as rows
from pipeline.stores.sql_gateway import SqlError, analyst_query, check_tree
from pipeline.ingress.admin import admin_app
from pipeline.stores.warehouse import Warehouse

directory, token, secret, outfile = Path(sys.argv[1]), sys.argv[2], sys.argv[4], sys.argv[5]
bypasses, accepted, guarantee, shipped = json.loads(Path(sys.argv[3]).read_text())
fill = lambda q: q.replace("@SECRET@", secret).replace("@OUT@", outfile)
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

# 1. readonly=1 alone, no checks: ClickHouse refuses these, but not the scalar file()
out["guarantee"] = {q: attempt(lambda q=q: w.query_readonly(q)) for q in guarantee}
out["system_settings_under_readonly"] = attempt(lambda: w.query_readonly("SELECT count() FROM system.settings"))
out["file_under_readonly"] = attempt(lambda: w.query_readonly(f"SELECT file('{secret}')"))
out["introspection_by_default"] = w.query("SELECT getSetting('allow_introspection_functions')").rows[0][0]
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
out["bypasses"] = {b[0]: post(fill(b[1]), params=b[2] if len(b) > 2 else None) for b in bypasses}
out["accepted"] = {q: post(q, params=p) for q, p in accepted}
# 4. the tree check alone (no textual check): ClickHouse's formatting, EXPLAIN AST, the allow-list
def tree_alone(q, params):
    try:
        statement = w.format_readonly(q)
        check_tree(w.explain_readonly(statement, params), statement)
        return "accepted"
    except SqlError as exc:
        return f"refused: {exc}"
    except Exception as exc:
        return f"error: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
out["tree_alone"] = {b[0]: tree_alone(fill(b[1]), b[2] if len(b) > 2 else {}) for b in bypasses}
# 5. EXPLAIN AST of the issue's statements, unchecked: it parses, reads and writes nothing
out["explain_lines"] = [w.explain_readonly(w.format_readonly(fill(b[1]))) for b in bypasses
                        if b[0] in ("issue 35 read", "issue 35 write")]
out["outfile_exists"] = Path(outfile).exists()
# 6. the shipped queries (report, rollout exports, owners) pass every check with typed parameters
dummy = {"String": "x", "DateTime64(3)": "2000-01-01 00:00:00.000", "UInt8": 0, "Array(String)": ["x"], "Float64": 0.5}
out["shipped"] = [attempt(lambda q=q: analyst_query(w, q, {n: dummy[t] for n, t in re.findall(r"\{(\w+):([^}]+)\}", q)}))
                  for q in shipped]
# 7. the sink inserts after all that, through the same handle
w.insert("decisions", rows.DECISIONS_COLUMNS, [rows.decision_row(ev.model_copy(update={"request_id": "r3"}))])
out["count_end"] = w.query("SELECT count() FROM decisions FINAL").rows[0][0]
out["table_functions"] = sorted(r[0] for r in w.query("SELECT name FROM system.table_functions").rows)
w.close()
print(json.dumps(out))
"""

# readonly=1 by itself (no checks) must refuse these: reads and writes outside, DDL, DML, settings
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
    secret = tmp / "secrets" / "mask-local.key"
    secret.parent.mkdir()
    secret.write_text(SECRET_TEXT)
    spec = tmp / "spec.json"
    spec.write_text(json.dumps([BYPASSES, ACCEPTED, GUARANTEE, _shipped_queries()]))
    token = ensure_admin_token(tmp / "data")
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp / "warehouse"), token, str(spec), str(secret),
                        str(tmp / "written.txt")], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_readonly_holds_without_the_pre_check(outcome):
    for q, res in outcome["guarantee"].items():
        assert not res["ok"], q
        assert "readonly" in res["error"].lower() or "READONLY" in res["error"], (q, res["error"])
    assert outcome["tables_after"].count("decisions") == 1 and "injected" not in outcome["tables_after"]
    # readonly=1 leaves system.* readable and, in chDB, the scalar file(): that is why the checks exist
    assert outcome["system_settings_under_readonly"]["ok"]
    assert outcome["file_under_readonly"]["rows"] == [[SECRET_TEXT]]
    assert outcome["introspection_by_default"] is True  # chDB's default; the analyst client turns it off


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
    """Issue 35 among them: `a$$, file(...), b$$` read the file, `a$$ INTO OUTFILE ... -- b$$` wrote one."""
    for name, res in outcome["bypasses"].items():
        assert res["status"] == 400 and res["body"]["detail"], (name, res)
        assert SECRET_TEXT not in json.dumps(res), name
    assert "read-only SQL: file() reaches outside" in outcome["bypasses"]["issue 35 read"]["body"]["detail"]
    assert "INTO OUTFILE is refused" in outcome["bypasses"]["issue 35 write"]["body"]["detail"]
    assert "Introspection functions are disabled" in outcome["bypasses"]["introspection"]["body"]["detail"]
    assert not outcome["outfile_exists"]


def test_the_tree_check_alone_refuses_every_bypass(outcome):
    """Without the textual check, ClickHouse's parse and the allow-list over it refuse each one."""
    for name, verdict in outcome["tree_alone"].items():
        if name == "introspection":  # an ordinary function: chDB's own setting refuses it
            assert verdict == "accepted"
        elif "SETTINGS" in name:  # EXPLAIN applies a query's SETTINGS: readonly=1 refuses them there too
            assert verdict.startswith("error: ") and "in readonly mode" in verdict, (name, verdict)
        elif name in PARSE_ERRORS:
            assert verdict.startswith("error: "), (name, verdict)
        else:
            assert verdict.startswith("refused: "), (name, verdict)


def test_explain_ast_only_parses(outcome):
    """The tree check's own EXPLAIN AST, given the issue's statements unchecked, reads and writes nothing."""
    read, write = outcome["explain_lines"]
    assert any(line.strip().startswith("Function file") for line in read)
    assert SECRET_TEXT not in json.dumps(read)
    assert any("written.txt" in line for line in write)  # INTO OUTFILE was parsed...
    assert not outcome["outfile_exists"]  # ...and nothing was written


def test_shipped_queries_pass_every_check(outcome):
    for res in outcome["shipped"]:
        assert res["ok"], res


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
