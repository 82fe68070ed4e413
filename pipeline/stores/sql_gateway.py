"""Analysts' read-only SQL: the one path untrusted SQL takes to the warehouse (`analyst_query`).

Read-only is enforced in three layers: a textual check that lexes the query as ClickHouse does, an
allow-list over ClickHouse's own parse of it (pipeline.stores.sql_check), and the setting
readonly=1 (`Warehouse.query_readonly`), which refuses writes, DDL, setting changes and most table
functions. The checks are the only guard where readonly=1 is none (measured, chDB 26.9): system.*
stays readable, and in chDB the scalar file() and INTO OUTFILE still read and write files, with no
file sandbox to fall back on (see query_readonly). In the embedded stack the query reaches the
warehouse through the admin endpoint of the process that owns it (pipeline.ingress.admin).
"""

from __future__ import annotations

import re
from datetime import date, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

from pipeline.stores.sql_check import (  # noqa: F401 - re-exported: the gateway's checks and lists
    ALLOWED_SYSTEM_TABLES,
    ALLOWED_TABLE_FUNCTIONS,
    REFUSED_FUNCTIONS,
    SqlError,
    check_read_only,
    check_tree,
)
from pipeline.stores.warehouse import QueryResult, Warehouse

# a server-side {name:Type} placeholder, as clickhouse-connect finds them (binding.external_bind_re):
# without one it would format the parameters into the text itself, after the checks
_PLACEHOLDER = re.compile(r"\{\w+:[^}]+\}")
_PARAMETER_NAME = re.compile(r"[A-Za-z_]\w*")


def analyst_query(warehouse: Warehouse, sql: str, parameters: dict[str, Any] | None = None) -> QueryResult:
    """The one path of untrusted SQL (issue 35). The textual check; ClickHouse's own formatting of
    the query as one statement (the query is a string parameter of formatQuerySingleLine: nothing
    of it runs, and several statements are refused); the textual check again on that formatting;
    the allow-list over ClickHouse's parse of it (EXPLAIN AST: parses, runs nothing); then that
    same formatted statement runs with readonly=1. What was checked is what runs."""
    from clickhouse_connect.driver.exceptions import ClickHouseError

    check_read_only(sql)
    try:
        statement = warehouse.format_readonly(sql)
        check_read_only(statement)
        parameters = _server_side(statement, parameters or {})
        check_tree(warehouse.explain_readonly(statement, parameters), statement)
        return warehouse.query_readonly(statement, parameters)
    except ClickHouseError as exc:  # the analyst's mistake: ClickHouse's message is the answer, not a traceback
        raise SqlError(" ".join(str(exc).split())) from None


def _server_side(statement: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """The parameters, bound by ClickHouse as typed values: none where the statement has no
    {name:Type} placeholder (an unused parameter changes nothing), so clickhouse-connect never
    formats them into the text (`%(name)s`) after the checks."""
    for name in parameters:
        if not _PARAMETER_NAME.fullmatch(name):
            raise SqlError(f"parameter name {name!r} is not an identifier")
    return parameters if _PLACEHOLDER.search(statement) else {}


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
