"""The ClickHouse warehouse through clickhouse-connect: `chdb://DIR` (embedded) or `http(s)://host`.

One code path for both. In embedded mode one process owns the chDB directory (chDB refuses a
second), so analysts' queries are served by that process (see pipeline.stores.sql_gateway).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import clickhouse_connect
from clickhouse_connect.driver.client import Client

from pipeline.config.settings import Settings
from pipeline.contracts.resources import clickhouse_migrations_dir

_MIGRATION = re.compile(r"^(\d{3})_[a-z0-9_]+\.sql$")
# per-query settings of analysts' SQL (readonly=2 would still allow file() and url(): measured, chDB 26)
READONLY_SETTINGS: dict[str, Any] = {"readonly": 1}


class WarehouseError(RuntimeError):
    pass


@dataclass
class QueryResult:
    columns: list[str]
    rows: list[tuple[Any, ...]]


def connect(dsn: str, username: str | None = None, password: str | None = None) -> Client:
    """A client for the DSN; a server's credentials come apart from it (a DSN is printed and logged)."""
    parsed = urlparse(dsn)
    if parsed.scheme == "chdb":
        path = Path(parsed.path)
        if not path.is_absolute():
            raise WarehouseError(f"chdb DSN needs an absolute directory, got {dsn!r}")
        path.mkdir(parents=True, exist_ok=True)
        return clickhouse_connect.get_client(dsn=f"chdb://{path}")
    if parsed.scheme in ("http", "https"):
        creds = {k: v for k, v in (("username", username), ("password", password)) if v is not None}
        return clickhouse_connect.get_client(dsn=dsn, **creds)
    raise WarehouseError(f"unsupported warehouse DSN {dsn!r} (use chdb:///abs/dir or http(s)://host:port)")


def open_warehouse(settings: Settings) -> Warehouse:
    """The configured warehouse, with the server credentials settings hold (none for chDB)."""
    pw = settings.warehouse_password
    return Warehouse(settings.resolved_warehouse_dsn(), settings.warehouse_user,
                     pw.get_secret_value() if pw is not None else None)


def is_embedded(dsn: str) -> bool:
    return urlparse(dsn).scheme == "chdb"


def migrations(directory: Path | None = None) -> list[tuple[int, str, str]]:
    out = []
    for f in sorted((directory or clickhouse_migrations_dir()).glob("*.sql")):
        m = _MIGRATION.match(f.name)
        if not m:
            raise WarehouseError(f"migration file {f.name!r} is not named NNN_name.sql")
        out.append((int(m.group(1)), f.stem, f.read_text()))
    versions = [v for v, _, _ in out]
    if len(set(versions)) != len(versions):
        raise WarehouseError("two migrations share a number")
    return out


def statements(sql: str) -> list[str]:
    """A migration's statements (`;`-separated; a part that is only comments is none)."""
    parts = (s.strip() for s in sql.split(";"))
    return [p for p in parts if p and not all(line.strip().startswith("--") for line in p.splitlines())]


class Warehouse:
    """A thread-safe handle: chDB serialises its queries; a server client is reused per thread."""

    def __init__(self, dsn: str, username: str | None = None, password: str | None = None) -> None:
        self.dsn = dsn
        self._creds = (username, password)
        self.client = connect(dsn, *self._creds)
        self._analyst: Client | None = None  # query_readonly's own client, opened on first use
        self._lock = threading.Lock()

    def migrate(self, until: int | None = None) -> list[str]:
        """Apply numbered migrations not applied yet (up to `until`, a test's older warehouse); safe
        to run any number of times."""
        with self._lock:
            self.client.command(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version UInt32, name String, "
                "applied DateTime64(3, 'UTC') DEFAULT now64(3)) ENGINE = ReplacingMergeTree ORDER BY version"
            )
            done = {r[0] for r in self.client.query("SELECT version FROM schema_migrations FINAL").result_rows}
            applied = []
            for version, name, sql in migrations():
                if version in done or (until is not None and version > until):
                    continue
                for statement in statements(sql):
                    self.client.command(statement)
                self.client.insert("schema_migrations", [[version, name]], column_names=["version", "name"])
                applied.append(name)
            return applied

    def insert(self, table: str, columns: list[str], rows: list[list[Any]]) -> None:
        if rows:
            with self._lock:
                self.client.insert(table, rows, column_names=columns)

    def query(self, sql: str, parameters: dict[str, Any] | None = None) -> QueryResult:
        """The pipeline's own queries (trusted SQL). Analysts' SQL goes through `query_readonly`."""
        with self._lock:
            r = self.client.query(sql, parameters=parameters or {})
        return QueryResult(columns=list(r.column_names), rows=[tuple(row) for row in r.result_rows])

    def query_readonly(self, sql: str, parameters: dict[str, Any] | None = None) -> QueryResult:
        """Untrusted (analysts') SQL: ClickHouse itself enforces `readonly=1` on it.

        readonly=1 refuses writes, DDL, setting changes (`SETTINGS readonly=0` in the query too) and
        the table functions file, url, remote, executable. It does NOT stop the scalar `file()` nor
        `INTO OUTFILE` in chDB (clickhouse-local mode), nor reads of system.*: those are refused by
        sql_gateway.analyst_query's checks in front of this (measured, chDB 26.9). chDB has no file
        sandbox to add under them (measured): `user_files_path` does not confine file() nor INTO
        OUTFILE in clickhouse-local mode, and its only user may neither revoke its own FILE grant
        (no grant option) nor create a user without it.

        The query runs on its own client, never the one the sink inserts through: clickhouse-connect's
        chDB backend applies per-call settings of an INSERT-looking query with SET and cannot restore
        readonly afterwards, which would leave that session read-only. The analyst client is set
        readonly=1 for good (chDB), and every query also carries readonly=1 (a server gets it per
        HTTP request).
        """
        with self._lock:
            r = self._analyst_client().query(sql, parameters=parameters or {}, settings=READONLY_SETTINGS)
        return QueryResult(columns=list(r.column_names), rows=[tuple(row) for row in r.result_rows])

    def format_readonly(self, sql: str) -> str:
        """ClickHouse's own single-line formatting of one statement. The statement is a string
        parameter of formatQuerySingleLine: nothing of it runs, and several statements, or one
        that does not parse, are ClickHouse's error."""
        with self._lock:
            r = self._analyst_client().query("SELECT formatQuerySingleLine({q:String})", parameters={"q": sql},
                                             settings=self._parse_settings())
        return str(r.result_rows[0][0])

    def explain_readonly(self, statement: str, parameters: dict[str, Any] | None = None) -> list[str]:
        """ClickHouse's parse of one statement (`format_readonly`'s output), as EXPLAIN AST's lines:
        it parses and runs nothing (tested: file() is not read, INTO OUTFILE not written)."""
        with self._lock:
            r = self._analyst_client().query(f"EXPLAIN AST {statement}", parameters=parameters or {},
                                             settings=self._parse_settings())
        return [str(row[0]) for row in r.result_rows]

    def _parse_settings(self) -> dict[str, Any] | None:
        # clickhouse-connect's chDB backend appends per-call settings to the text as a SETTINGS
        # clause, which the parse would show as the query's own: that client is readonly for good
        return None if is_embedded(self.dsn) else READONLY_SETTINGS

    def _analyst_client(self) -> Client:
        """The analysts' client, opened on first use (the caller holds the lock). In chDB it is set
        readonly=1 for good, after switching off introspection functions (addressToLine,
        demangle...; on by default in chDB 26.9: measured), which readonly=1 then keeps off."""
        if self._analyst is None:
            client = connect(self.dsn, *self._creds)
            if is_embedded(self.dsn):
                client.command("SET allow_introspection_functions = 0")
                client.command("SET readonly = 1")
            self._analyst = client
        return self._analyst

    def close(self) -> None:
        with self._lock:
            if self._analyst is not None:
                self._analyst.close()
            self.client.close()
