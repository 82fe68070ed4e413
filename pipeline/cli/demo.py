"""`llmpipe demo`: the bundled traffic through the front door on a fresh stack, then the report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pipeline.cli.app import app
from pipeline.cli.common import (
    CliError,
    DataDir,
    Json,
    _print_json,
    _query_fn,
    _settings,
    command,
    out,
    parse_since,
)


@app.command()
@command
def demo(data_dir: DataDir = Path(".llmpipe/demo"),
         config: Annotated[Path, typer.Option("--config", exists=True, dir_okay=False,
                                              help="the demo's settings (tenants get keys per run)")
                                              ] = Path("examples/demo.yaml"),
         traffic: Annotated[Path, typer.Option("--traffic", exists=True, dir_okay=False,
                                               help="demo traffic JSONL")] = Path("examples/demo_traffic.jsonl"),
         rate: Annotated[float | None, typer.Option(help="requests per second offered (default: measured: "
                                                         "70 % of what this host answers, at most 2.5)")] = None,
         concurrency: Annotated[int, typer.Option(help="requests in flight at most")] = 48,
         json: Json = False) -> None:
    """Start the embedded stack, send the bundled traffic through the front door, print the report, stop."""
    import time as _time

    from pipeline.analysis.render import render_html
    from pipeline.analysis.report import build_report
    from pipeline.app.stack import StackError, running_stack, stop_stack
    from pipeline.demo.images import DemoImageServer
    from pipeline.demo.run import read_demo_traffic

    d = data_dir.expanduser().resolve()
    if running_stack(d):
        raise StackError(f"a stack is already running for {d} (llmpipe down --data-dir {d} first)")
    lines = read_demo_traffic(traffic)
    d.mkdir(parents=True, exist_ok=True)
    images = DemoImageServer().start()
    t0 = _time.monotonic()
    try:
        info, keys = _start_stack(d, config, images.port)
        out.print(f"stack up in {_time.monotonic() - t0:.0f}s; front door {info.http_url}")
        if rate is None:
            rate = _measured_rate(info.http_url, keys, config)
        since = parse_since("1s")  # the report covers the traffic only (not the pace probes)
        run = _send(lines, info.http_url, keys, images.base_url, rate, concurrency, quiet=json)
        query = _query_fn(_settings(d, None, None))
        _wait_for_rows(query, run.reached_pipeline(), 90)
        doc = build_report(query, since)
        (d / "report.html").write_text(render_html(doc), encoding="utf-8")
        summary = run.summary(round(_time.monotonic() - t0, 1), doc, d / "report.html")
        if json:
            _print_json(summary)
        else:
            _print_demo(doc, run, summary, d / "report.html")
    finally:
        images.stop()
        if running_stack(d):
            with out.status("stopping the stack..."):
                stop_stack(d)


def _measured_rate(http_url: str, keys: dict[str, str], config: Path) -> float:
    """What this host carries, measured through the door as a tenant without limits, and the rate offered."""
    import asyncio

    from pipeline.demo.pace import measure_door, pick_rate
    from pipeline.demo.run import demo_tenants

    key = next((keys[t] for t in demo_tenants(config, unlimited=True) if t in keys), None)
    if key is None:
        raise CliError(f"{config}: no tenant without limits to measure this host's pace with; give --rate")
    with out.status("measuring what this host answers (4 requests at once, twice)..."):
        cap = asyncio.run(measure_door(http_url, key))
    rate = pick_rate(cap)
    out.print(f"this host answered {cap.answers_per_s:.2f} requests/s ({cap.probes} at once, p50 "
              f"{cap.latency_p50_s:.1f} s): offering {rate:g} req/s (--rate to choose)")
    return rate


def _start_stack(d: Path, config: Path, images_port: int):
    """A key per configured tenant (one not configured gets 401: "nobody"), the demo's config with
    them, and `llmpipe up --processes` on it in the background."""
    import yaml

    from pipeline.app.stack import start_detached
    from pipeline.demo.run import demo_config, demo_tenants
    from pipeline.registries.tenants import new_api_key

    keys = {t: new_api_key() for t in demo_tenants(config)}
    cfg_file = d / "demo-config.yaml"
    cfg_file.write_text(yaml.safe_dump(demo_config(config, keys, images_port), allow_unicode=True))
    with out.status("starting the stack: broker, warehouse, the stage workers, vLLM (about a minute)..."):
        info = start_detached(["up", "--processes", "--data-dir", str(d), "--config", str(cfg_file)], d,
                              timeout_s=600)
    return info, keys


def _send(lines, http_url: str, keys: dict[str, str], images_url: str, rate: float, concurrency: int, *,
          quiet: bool):
    import asyncio

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from pipeline.demo.run import send_traffic

    with Progress(TextColumn("sending demo traffic"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=out, disable=quiet) as progress:
        task = progress.add_task("send", total=len(lines))
        return asyncio.run(send_traffic(lines, http_url, keys, images_url, rate=rate, concurrency=concurrency,
                                        on_done=lambda: progress.advance(task)))


def _wait_for_rows(query, expected: int, timeout_s: float) -> None:
    """The sink writes in batches: wait until the warehouse holds a row per request that reached it."""
    import time as _time

    deadline = _time.monotonic() + timeout_s
    while _time.monotonic() < deadline:
        if query("SELECT count() FROM requests FINAL", {}).rows[0][0] >= expected:
            return
        _time.sleep(1)


def _print_demo(doc, run, summary: dict, report_path: Path) -> None:
    from rich.table import Table

    from pipeline.analysis.render import print_report
    from pipeline.demo.run import MEANING, status_summary

    print_report(doc, out)
    t = Table("traffic", "sent", "answers (HTTP status×count, codes)", "cache hits", "what it shows",
              title="What the demo sent", title_justify="left")
    for name, c in sorted(run.by_category().items(), key=lambda kv: -kv[1]["requests"]):
        t.add_row(name, str(c["requests"]), status_summary(c), str(c["cache_hits"]), MEANING.get(name, ""))
    out.print(t)
    out.print(f"{len(run.sent)} requests in {summary['seconds']}s including start-up; ok latency "
              f"p50 {summary['latency_ok_ms']['p50']} ms, p95 {summary['latency_ok_ms']['p95']} ms. "
              f"HTML report: {report_path}")
