"""Analysts' read-only SQL, served by the process that owns the warehouse.

chDB allows one process per directory, so in the embedded stack `llmpipe sql` posts its query
to this endpoint of the sink process; against a ClickHouse server it queries directly.
"""

from __future__ import annotations

import asyncio
import re
from datetime import date, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

import httpx
from fastapi import FastAPI, HTTPException
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel
from starlette.responses import Response

from pipeline.runtime.asgi import AsgiServer
from pipeline.stores.warehouse import QueryResult, Warehouse

_READ_ONLY = re.compile(r"^\s*(SELECT|WITH|SHOW|DESCRIBE|DESC|EXPLAIN|EXISTS)\b", re.IGNORECASE)


class SqlError(RuntimeError):
    pass


class SqlRequest(BaseModel):
    query: str
    parameters: dict[str, Any] = {}


class SqlAnswer(BaseModel):
    columns: list[str]
    rows: list[list[Any]]


def check_read_only(sql: str) -> None:
    if not _READ_ONLY.match(sql) or ";" in sql.strip().rstrip(";"):
        raise SqlError("only one read-only statement (SELECT, WITH, SHOW, DESCRIBE, EXPLAIN, EXISTS) is accepted")


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


def admin_app(warehouse: Warehouse) -> FastAPI:
    app = FastAPI(title="llmpipe admin", docs_url=None, redoc_url=None)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/sql", response_model=SqlAnswer)
    async def sql(req: SqlRequest) -> SqlAnswer:
        try:
            check_read_only(req.query)
            result = await asyncio.to_thread(warehouse.query, req.query, req.parameters)
        except SqlError as exc:
            raise HTTPException(400, str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - ClickHouse's message is the analyst's answer
            raise HTTPException(400, f"{type(exc).__name__}: {exc}") from None
        return SqlAnswer(columns=result.columns, rows=[jsonable(list(r)) for r in result.rows])

    @app.post("/profile_runs")
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
    """The warehouse's admin endpoint on 127.0.0.1:port, inside the running event loop."""

    def __init__(self, warehouse: Warehouse, port: int) -> None:
        self.asgi = AsgiServer(admin_app(warehouse), "127.0.0.1", port)
        self.port = self.asgi.port
        self.url = self.asgi.url

    async def start(self) -> "AdminServer":
        await self.asgi.start()
        return self

    async def stop(self) -> None:
        await self.asgi.stop()


def query_via_admin(admin_url: str, sql: str, parameters: dict[str, Any] | None = None,
                    timeout: float = 60.0) -> QueryResult:
    try:
        r = httpx.post(f"{admin_url}/sql", json={"query": sql, "parameters": parameters or {}}, timeout=timeout)
    except httpx.HTTPError as exc:
        raise SqlError(f"the stack's admin endpoint {admin_url} did not answer: {exc}") from None
    if r.status_code != 200:
        detail = r.json().get("detail") if r.headers.get("content-type", "").startswith("application/json") else r.text
        raise SqlError(str(detail))
    body = r.json()
    return QueryResult(columns=body["columns"], rows=[tuple(row) for row in body["rows"]])
