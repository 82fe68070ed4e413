"""Analysts' read-only SQL, served by the process that owns the warehouse.

chDB allows one process per directory, so in the embedded stack `llmpipe sql` posts its query
to this endpoint of the sink process; against a ClickHouse server it queries directly.

Read-only is enforced by ClickHouse: analysts' SQL runs with the setting readonly=1
(`Warehouse.query_readonly`), which refuses writes, DDL, setting changes and the table functions
that reach outside the warehouse. `check_read_only` is a cheap syntactic pre-check in front of it:
defence in depth, and the only guard where readonly=1 is none (measured, chDB 26.9): system.*
stays readable, and in chDB the scalar file() and INTO OUTFILE still read and write files. Every
admin endpoint but /health and /metrics needs `Authorization: Bearer <admin token>`
(DATA_DIR/secrets/admin.token, or settings.secrets.admin_token). docs/ARCHITECTURE.md has the why.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import re
import secrets
import stat
from collections.abc import Callable
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID

import httpx
from fastapi import Depends, FastAPI, HTTPException, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel
from starlette.responses import Response

from pipeline.runtime.asgi import AsgiServer
from pipeline.stores.warehouse import QueryResult, Warehouse

if TYPE_CHECKING:
    from pipeline.config.settings import Settings

_STATEMENTS = ("SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXPLAIN", "EXISTS")
_FIRST_WORD = re.compile(r"^\s*(SELECT|WITH|SHOW|DESCRIBE|DESC|EXPLAIN|EXISTS)\b", re.IGNORECASE)
# SHOW forms about the warehouse's own tables; SHOW PROCESSLIST, GRANTS, USERS, SETTINGS, ACCESS,
# CLUSTERS... are about the server and other users, and are refused
_SHOW_ALLOWED = re.compile(
    r"^\s*SHOW\s+(?:(?:(?:FULL\s+)?(?:TEMPORARY\s+)?TABLES|DATABASES|(?:EXTENDED\s+)?(?:FULL\s+)?(?:COLUMNS|FIELDS)"
    r"|(?:EXTENDED\s+)?(?:INDEX|INDEXES|INDICES|KEYS))\b"
    r"|CREATE\s+(?:(?:TEMPORARY\s+)?(?:TABLE|VIEW)\s+|(?!(?:USER|USERS|ROLE|ROLES|ROW|POLICY|POLICIES|QUOTA|QUOTAS"
    r"|SETTINGS|PROFILE|PROFILES|DATABASE|DICTIONARY|FUNCTION|NAMED|MASKING|TEMPORARY)\b))\w)",
    re.IGNORECASE)
# Table functions (and the scalar `file`, `catboostEvaluate`) that reach outside the warehouse:
# files, URLs, object stores, other servers and databases, programs, stdin, the calling Python
# process (chDB's python, arrowstream), and other databases of this server (merge, loop,
# mergeTreeIndex... can name `system`). readonly=1 refuses most of them, but not the scalar
# file(), merge() nor mergeTreeIndex() (measured, chDB 26.9). The complete list of chDB's
# table functions is checked against this one and ALLOWED_TABLE_FUNCTIONS in
# tests/test_sql_gateway.py, so an upgrade that adds one fails a test until it is classified.
REFUSED_FUNCTIONS = frozenset(name.lower() for name in """
    file fileCluster url urlCluster s3 s3Cluster gcs oss cosn hdfs hdfsCluster
    azureBlobStorage azureBlobStorageCluster remote remoteSecure cluster clusterAllReplicas
    executable mysql postgresql jdbc odbc sqlite mongodb redis input hive
    deltaLake deltaLakeCluster deltaLakeS3 deltaLakeAzure deltaLakeLocal deltaLakeS3Cluster deltaLakeAzureCluster
    iceberg icebergS3 icebergAzure icebergHDFS icebergLocal icebergCluster icebergS3Cluster icebergAzureCluster
    icebergHDFSCluster hudi hudiCluster paimon paimonS3 paimonAzure paimonHDFS paimonLocal
    arrowFlight arrowflight ytsaurus prometheusQuery prometheusQueryRange timeSeriesData timeSeriesMetrics
    timeSeriesTags timeSeriesSelector merge loop mergeTreeIndex mergeTreeAnalyzeIndexes mergeTreeProjection
    mergeTreePartInfo mergeTreeAnalyzeIndexesUUID mergeTreeCodecBlockCounts mergeTreeTextIndex
    timeSeriesMetricFamilies timeSeriesSamples icebergLocalCluster paimonCluster paimonAzureCluster
    paimonHDFSCluster paimonS3Cluster bigquery python arrowstream eval
    dictionary viewIfPermitted viewExplain filesystem filesystemCluster catboostEvaluate
""".split())
# The harmless table functions: generators and inline data, nothing outside the query
ALLOWED_TABLE_FUNCTIONS = frozenset(name.lower() for name in """
    numbers numbers_mt zeros zeros_mt generate_series generateSeries primes values SQLStandardValues null view
    format generateRandom fuzzJSON fuzzQuery
""".split())
# system.* holds other users' queries, settings, users and grants, logs: only these, which carry
# nothing but constants, stay readable (e.g. `SELECT 1 FROM system.one`)
ALLOWED_SYSTEM_TABLES = frozenset({"one", "numbers", "numbers_mt", "zeros", "zeros_mt"})
_SYSTEM_REF = re.compile(r"\b(system|information_schema)\b(\s*\.\s*(\w+))?", re.IGNORECASE)
_CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
_SETTINGS = re.compile(r"\bSETTINGS\b", re.IGNORECASE)
_OUTFILE = re.compile(r"\bOUTFILE\b", re.IGNORECASE)
_INSERT = re.compile(r"\bINSERT\s+INTO\b", re.IGNORECASE)
_IDENTIFIER_PARAM = re.compile(r"\{\s*\w+\s*:\s*Identifier\s*\}", re.IGNORECASE)
_HEREDOC = re.compile(r"\$(\w*)\$")
ADMIN_TOKEN_FILE = "admin.token"


class SqlError(RuntimeError):
    pass


class SqlRequest(BaseModel):
    query: str
    parameters: dict[str, Any] = {}


class SqlAnswer(BaseModel):
    columns: list[str]
    rows: list[list[Any]]


def _clean(sql: str) -> str:
    """`sql` with comments removed, string literals emptied and quoted identifiers unquoted, so a
    quoted word cannot look like a keyword and a comment or a quote cannot hide one."""
    out: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c == "-" and sql.startswith("--", i) or c == "#":
            j = sql.find("\n", i)
            i = n if j < 0 else j
            out.append(" ")
        elif c == "/" and sql.startswith("/*", i):
            depth, i = 1, i + 2  # ClickHouse nests /* */ comments
            while i < n and depth:
                if sql.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif sql.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
            if depth:
                raise SqlError("unterminated /* comment")
            out.append(" ")
        elif c in "'\"`":
            j, text = i + 1, []
            while True:
                if j >= n:
                    raise SqlError(f"unterminated {c} quote")
                if sql[j] == "\\" and j + 1 < n:
                    text.append(sql[j + 1])
                    j += 2
                elif sql[j] == c and sql.startswith(c * 2, j):
                    text.append(c)
                    j += 2
                elif sql[j] == c:
                    break
                else:
                    text.append(sql[j])
                    j += 1
            i = j + 1
            # a literal becomes '' ; an identifier its name ("system"."users" is system.users)
            out.append(" '' " if c == "'" else re.sub(r"\W", "_", "".join(text)) or "_")
        elif c == "$" and (m := _HEREDOC.match(sql, i)):
            end = sql.find(m.group(0), m.end())
            if end < 0:
                raise SqlError("unterminated $$ string")
            i = end + len(m.group(0))
            out.append(" '' ")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def check_read_only(sql: str) -> None:
    """Refuse what an analyst's statement may not do, before ClickHouse sees it: one statement of
    SELECT/WITH/SHOW/DESCRIBE/EXPLAIN/EXISTS, no INTO OUTFILE, no SETTINGS clause, no table function
    that reaches outside the warehouse, no system.* / information_schema (but ALLOWED_SYSTEM_TABLES),
    no {name:Identifier} parameter (it could name any table). Not the guarantee: readonly=1 is."""
    clean = _clean(sql).strip()
    while clean.endswith(";"):
        clean = clean[:-1].rstrip()
    if not _FIRST_WORD.match(clean) or ";" in clean:
        raise SqlError(f"only one read-only statement ({', '.join(_STATEMENTS)}) is accepted")
    if clean[:4].upper() == "SHOW" and not _SHOW_ALLOWED.match(clean):
        raise SqlError("read-only SQL: of SHOW only TABLES, DATABASES, COLUMNS, INDEX and CREATE TABLE are accepted")
    if _OUTFILE.search(clean):  # readonly=1 does not stop it in chDB: this check does
        raise SqlError("read-only SQL: INTO OUTFILE is refused")
    if _INSERT.search(clean):  # e.g. WITH ... INSERT INTO
        raise SqlError("read-only SQL: INSERT is refused")
    if _IDENTIFIER_PARAM.search(clean):
        raise SqlError("read-only SQL: {name:Identifier} parameters are refused")
    for m in _CALL.finditer(clean):
        if m.group(1).lower() in REFUSED_FUNCTIONS:
            raise SqlError(f"read-only SQL: {m.group(1)}() reaches outside the warehouse and is refused")
    for m in _SYSTEM_REF.finditer(clean):
        db, table = m.group(1).lower(), (m.group(3) or "").lower()
        if not (db == "system" and table in ALLOWED_SYSTEM_TABLES):
            raise SqlError(f"read-only SQL: {m.group(1)}{'.' + m.group(3) if table else ''} is refused "
                           f"(of system.* only {', '.join(sorted(ALLOWED_SYSTEM_TABLES))} are readable)")
    if _SETTINGS.search(clean):
        raise SqlError("read-only SQL: a SETTINGS clause is refused")


def analyst_query(warehouse: Warehouse, sql: str, parameters: dict[str, Any] | None = None) -> QueryResult:
    """The one path of untrusted SQL: the pre-check, then ClickHouse with readonly=1."""
    from clickhouse_connect.driver.exceptions import ClickHouseError

    check_read_only(sql)
    try:
        return warehouse.query_readonly(sql, parameters)
    except ClickHouseError as exc:  # the analyst's mistake: ClickHouse's message is the answer, not a traceback
        raise SqlError(" ".join(str(exc).split())) from None


# ---- the admin token ---------------------------------------------------------------------------


def admin_token_path(data_dir: Path) -> Path:
    return data_dir / "secrets" / ADMIN_TOKEN_FILE


def _read_token(path: Path) -> str:
    st = path.stat()
    if st.st_mode & 0o077:
        raise SqlError(f"{path} is readable by others (mode {stat.S_IMODE(st.st_mode):o}); chmod 600 it")
    token = path.read_text().strip()
    if not token:
        raise SqlError(f"{path} is empty; delete it and restart the stack")
    return token


def ensure_admin_token(data_dir: Path) -> str:
    """DATA_DIR/secrets/admin.token, generated on first use (mode 0600, directory 0700).

    The supervisor, the sink child and every CLI call read or create the same file; creation is
    race-free: the token is written to a private temporary file, then hard-linked into place, so the
    file appears whole or not at all, and whoever loses the race reads the winner's token."""
    directory = data_dir / "secrets"
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    if stat.S_IMODE(directory.stat().st_mode) & 0o077:
        directory.chmod(0o700)
    path = directory / ADMIN_TOKEN_FILE
    if path.exists():
        return _read_token(path)
    tmp = directory / f".{ADMIN_TOKEN_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process won: its token is the one
    finally:
        tmp.unlink(missing_ok=True)
    return _read_token(path)


def admin_token_for(settings: "Settings") -> str:
    """settings.secrets.admin_token (LLMPIPE_SECRETS__ADMIN_TOKEN) if set, else the data dir's file."""
    configured = settings.secrets.admin_token
    if configured is not None:
        token = configured.get_secret_value().strip()
        if len(token) < 16:
            raise SqlError("secrets.admin_token must be at least 16 characters")
        return token
    return ensure_admin_token(settings.resolved_data_dir())


def auth_headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def jsonable(value: Any) -> Any:
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, (Decimal, UUID)):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def admin_app(warehouse: Warehouse, token: str) -> FastAPI:
    if not token:
        raise ValueError("the admin endpoint needs a token")
    app = FastAPI(title="llmpipe admin", docs_url=None, redoc_url=None)
    expected = f"Bearer {token}".encode()

    def authorised(request: Request) -> None:
        got = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(got, expected):
            raise HTTPException(401, "the admin endpoint needs Authorization: Bearer <token> "
                                     "(DATA_DIR/secrets/admin.token)", headers={"WWW-Authenticate": "Bearer"})

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    # Open, like the metrics_port every process serves for Prometheus with the same registry: metric
    # names, labels (stage, outcome, error class, partition, HTTP status) and numbers; no evidence
    # rows, prompts, tenants or secrets (tests/test_mask_stack.py checks no PII reaches it).
    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/sql", response_model=SqlAnswer, dependencies=[Depends(authorised)])
    async def sql(req: SqlRequest) -> SqlAnswer:
        try:
            result = await asyncio.to_thread(analyst_query, warehouse, req.query, req.parameters)
        except SqlError as exc:
            raise HTTPException(400, str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - ClickHouse's message is the analyst's answer
            raise HTTPException(400, f"{type(exc).__name__}: {exc}") from None
        return SqlAnswer(columns=result.columns, rows=[jsonable(list(r)) for r in result.rows])

    @app.post("/profile_runs", dependencies=[Depends(authorised)])
    async def profile_runs(run: dict[str, Any]) -> dict[str, str]:
        """`llmpipe profile` records its run here while the sink process owns the chDB directory."""
        from pipeline.profiling import PROFILE_COLUMNS, ProfileRun

        try:
            row = ProfileRun.model_validate(run).row()
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from None
        await asyncio.to_thread(warehouse.insert, "profile_runs", PROFILE_COLUMNS, [row])
        return {"status": "ok"}

    return app


class AdminServer:
    """The warehouse's admin endpoint on 127.0.0.1:port, inside the running event loop; `token`
    (admin_token_for(settings)) guards every endpoint but /health and /metrics."""

    def __init__(self, warehouse: Warehouse, port: int, token: str) -> None:
        self.asgi = AsgiServer(admin_app(warehouse, token), "127.0.0.1", port)
        self.port = self.asgi.port
        self.url = self.asgi.url

    async def start(self) -> "AdminServer":
        await self.asgi.start()
        return self

    async def stop(self) -> None:
        await self.asgi.stop()


def query_via_admin(admin_url: str, sql: str, parameters: dict[str, Any] | None = None,
                    timeout: float = 60.0, *, token: str) -> QueryResult:
    try:
        r = httpx.post(f"{admin_url}/sql", json={"query": sql, "parameters": parameters or {}}, timeout=timeout,
                       headers=auth_headers(token))
    except httpx.HTTPError as exc:
        raise SqlError(f"the stack's admin endpoint {admin_url} did not answer: {exc}") from None
    if r.status_code != 200:
        detail = r.json().get("detail") if r.headers.get("content-type", "").startswith("application/json") else r.text
        raise SqlError(str(detail))
    body = r.json()
    return QueryResult(columns=body["columns"], rows=[tuple(row) for row in body["rows"]])


def warehouse_query(settings: "Settings", admin_url: str | None = None) -> Callable[[str, dict[str, Any]], QueryResult]:
    """Read-only SQL against the warehouse's owner: the running stack's admin endpoint when the
    warehouse is embedded (only that process may open chDB), else the server directly, opened on
    first use and checked like /sql."""
    from pipeline.stores.warehouse import is_embedded, open_warehouse

    if is_embedded(settings.resolved_warehouse_dsn()) and admin_url is not None:
        token = admin_token_for(settings)
        return lambda q, p: query_via_admin(admin_url, q, p, token=token)
    wh: list[Warehouse] = []

    def direct(q: str, p: dict[str, Any]) -> QueryResult:
        if not wh:
            wh.append(open_warehouse(settings))
            wh[0].migrate()
        return analyst_query(wh[0], q, p)

    return direct
