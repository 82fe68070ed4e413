"""The warehouse's admin endpoint, served by the process that owns the warehouse.

chDB allows one process per directory, so in the embedded stack `llmpipe sql` posts its query to
this endpoint of the sink process; against a ClickHouse server it queries directly
(`warehouse_query`). Every endpoint but /health and /metrics needs `Authorization: Bearer <admin
token>` (DATA_DIR/secrets/admin.token, or settings.secrets.admin_token). Untrusted SQL takes one
path, pipeline.stores.sql_gateway.analyst_query.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from fastapi import Depends, FastAPI, HTTPException, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel
from starlette.responses import Response

from pipeline.contracts.profile import PROFILE_COLUMNS, ProfileRun
from pipeline.runtime.serve.asgi import AsgiServer
from pipeline.stores.sql_gateway import SqlError, analyst_query, jsonable
from pipeline.stores.warehouse import QueryResult, Warehouse

if TYPE_CHECKING:
    from pipeline.config.settings import Settings

ADMIN_TOKEN_FILE = "admin.token"


class SqlRequest(BaseModel):
    query: str
    parameters: dict[str, Any] = {}


class SqlAnswer(BaseModel):
    columns: list[str]
    rows: list[list[Any]]


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


def admin_token_for(settings: Settings) -> str:
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

    async def start(self) -> AdminServer:
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


def warehouse_query(settings: Settings, admin_url: str | None = None) -> Callable[[str, dict[str, Any]], QueryResult]:
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
