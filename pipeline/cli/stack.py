"""Run the stack: the embedded broker, topics, `up`/`down`/`status`, the front door, one worker."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pipeline.cli.app import app, topics_app
from pipeline.cli.common import (
    Bootstrap,
    CliError,
    ConfigFile,
    DataDir,
    Json,
    _print_json,
    _settings,
    _stack_bootstrap,
    _stack_doorbell,
    command,
    out,
)

if TYPE_CHECKING:
    from pipeline.config.settings import Settings

# ---- infrastructure ----------------------------------------------------------------------------


@app.command()
@command
def broker(data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
           port: Annotated[int, typer.Option(help="0 = a free port")] = 0, json: Json = False) -> None:
    """Run the embedded Kafka-protocol broker (Tansu) in the foreground until Ctrl-C."""
    import asyncio

    from pipeline.runtime.broker.embedded import EmbeddedBroker

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
    import asyncio

    from pipeline.app.assemble import topology_for
    from pipeline.runtime.topics import apply_topics

    s = _settings(data_dir, config, bootstrap)
    bs, prefix = _stack_bootstrap(s)
    res = asyncio.run(apply_topics(bs, prefix, topology_for(s).topic_registry(), s.kafka.client_kwargs()))
    if json:
        _print_json({"created": res.created, "existing": res.existing})
    else:
        out.print(f"created {len(res.created)} topics, {len(res.existing)} already existed")


@topics_app.command("chains")
@command
def topics_chains(data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, json: Json = False) -> None:
    """The worker groups of the topology: each chain's stages, the topics its workers consume, and why
    a chain ends where it does (topics/topics.yaml `boundary`, or a `chain: false`)."""
    from rich.table import Table

    from pipeline.app.assemble import topology_for
    from pipeline.runtime.topics import TopicNames

    s = _settings(data_dir, config, None)
    topology = topology_for(s)
    names = TopicNames(s.topic_prefix)
    groups = [{"group": head, "stages": topology.chain(head), "starts_because": topology.boundary(head),
               "consumes": topology.group_topics(head, names)} for head in topology.groups()]
    if json:
        _print_json({"groups": groups})
        return
    t = Table("worker group", "stages", "a chain starts here because", "consumes")
    for g in groups:
        t.add_row(g["group"], " -> ".join(g["stages"]), g["starts_because"], ", ".join(g["consumes"]))
    out.print(t)


@app.command()
@command
def up(data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
       detach: Annotated[bool, typer.Option(help="return once the stack is ready")] = False,
       processes: Annotated[bool, typer.Option(help="one process per stage group")] = False,
       json: Json = False) -> None:
    """Start the embedded stack: broker, topics, warehouse sink, every configured stage."""
    import asyncio

    from pipeline.app.dev_key import read_dev_key
    from pipeline.app.stack import StackError, run_stack, running_stack, start_detached

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
    from pipeline.app.dev_key import dev_key_path

    where = dev_key_path(s.resolved_data_dir())
    if key:
        out.print(f"development tenant {s.auth.dev_tenant!r}: API key {key} (shown once; also in {where}, mode 0600)",
                  markup=False, highlight=False)
    elif s.auth.required and s.auth.dev_tenant:
        out.print(f"development tenant {s.auth.dev_tenant!r}: its API key is in {where}", markup=False, highlight=False)


@app.command()
@command
def serve(data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
          host: Annotated[str | None, typer.Option(help="listen address (default: settings http.host)")] = None,
          port: Annotated[int | None, typer.Option(help="listen port (default: settings http.port)")] = None) -> None:
    """Run the OpenAI-compatible front door against a broker (`llmpipe up` runs one itself)."""
    import asyncio
    import signal

    from pipeline.ingress.http import FrontDoor, HttpServer
    from pipeline.runtime.serve.metrics import serve_metrics

    s = _settings(data_dir, config, bootstrap)
    boot, prefix = _stack_bootstrap(s)
    s = s.model_copy(update={"topic_prefix": prefix, "doorbell_dir": _stack_doorbell(s)})

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
    from pipeline.app.stack import stop_stack

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
           ready_file: Annotated[Path | None, typer.Option(help="touched once the worker consumes")] = None) -> None:
    """Run one stage group's worker against any broker (scale out by running more)."""
    import asyncio

    from pipeline.config.settings import MAX_IMAGE_PIXELS

    # OpenCV reads its pixel cap once, at import: set it before any stage can import cv2
    os.environ.setdefault("OPENCV_IO_MAX_IMAGE_PIXELS", str(MAX_IMAGE_PIXELS))
    from contextlib import AsyncExitStack

    from pipeline.app.assemble import check_policies, topology_for
    from pipeline.app.children import run_reported
    from pipeline.app.launch import SINK_STAGE, open_group, run_until_signalled
    from pipeline.runtime.broker.epoch import EPOCH_FILE, EpochWatch
    from pipeline.runtime.serve.metrics import serve_metrics

    s = _settings(data_dir, config, bootstrap)
    topology = topology_for(s)
    if stage != SINK_STAGE:
        topology.require_group(stage)  # before anything starts: a chained stage has no workers of its own
    check_policies(topology)
    bs, _ = _stack_bootstrap(s)
    if s.metrics_port is not None:
        port = serve_metrics(s.metrics_port, s.metrics_host)
        logging.getLogger(__name__).info("metrics on http://127.0.0.1:%d/metrics", port)

    def ready() -> None:
        if ready_file is not None:
            ready_file.parent.mkdir(parents=True, exist_ok=True)
            ready_file.touch()

    async def run() -> None:
        # a restarted embedded broker's logs start at 0: this process's own-position consumers follow
        epoch = await EpochWatch(s.resolved_data_dir() / EPOCH_FILE).start()
        try:
            await serve_worker()
        finally:
            await epoch.stop()

    async def serve_worker() -> None:
        async with AsyncExitStack() as parts:
            workers = await open_group(parts, s, topology, stage, bs, admin_port or s.admin_port)
            await run_reporting(workers)

    async def run_reporting(workers) -> None:  # their broker view goes to the supervisor (`llmpipe status`)
        await run_reported(s.resolved_data_dir(), stage, workers, lambda: run_until_signalled(workers, on_started=ready))

    asyncio.run(run())




@app.command("roll-broker")
@command
def roll_broker(data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None,
                wait_s: Annotated[float, typer.Option("--wait-s", help="how long to wait for the roll")] = 120.0,
                json: Json = False) -> None:
    """Roll the running stack's embedded broker now: drained, restarted, its compacted topics carried over
    (it also rolls by itself at embedded_broker.roll_rss_mib)."""
    from pipeline.app.stack import ask_broker_roll

    s = _settings(data_dir, config, None)
    broker = ask_broker_roll(s.resolved_data_dir(), wait_s)
    if json:
        _print_json(broker)
    else:
        out.print(f"the broker rolled (roll {broker['rolls']}): {broker['last_roll_why']}")


@app.command()
@command
def status(data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
           json: Json = False) -> None:
    """Show the running stack: what stack.json records, and the supervisor's live view (run/health.json:
    the broker, each worker with its restarts and last exit code, the door's readiness)."""
    import orjson
    from rich.table import Table

    from pipeline.app.stack import read_health, running_stack

    s = _settings(data_dir, config, bootstrap)
    info = running_stack(s.resolved_data_dir())
    if info is None:
        raise CliError(f"no stack is running for {s.resolved_data_dir()}")
    doc = {**info.__dict__, "health": read_health(s.resolved_data_dir(), info.http_url)}
    if json:
        _print_json(doc)
        return
    out.print_json(orjson.dumps({k: v for k, v in doc.items() if k != "health"}).decode())
    health = doc["health"]
    table = Table(title="stack health")
    for col in ("part", "state", "pid", "restarts", "last exit"):
        table.add_column(col)
    broker = health.get("broker") or {}
    rolls = f" ({broker['rolls']} roll(s), {broker.get('rolls_put_off', 0)} put off)" if broker.get("rolls") else ""
    table.add_row("broker", f"{broker.get('state', '?')}{rolls}", str(info.pids.get("broker", "")),
                  str(broker.get("restarts", "")), str(broker.get("last_exit_code", "") or ""))
    for name, w in (health.get("workers") or {}).items():
        table.add_row(f"worker {name}", str(w.get("state")), str(w.get("pid")), str(w.get("restarts", 0)),
                      "" if w.get("last_exit_code") is None else str(w["last_exit_code"]))
    ready = health.get("ready") or {}
    table.add_row("front door", "ready" if ready.get("ready") else f"not ready: {ready.get('reason', '?')}", "", "", "")
    out.print(table)



