"""Soak: a steady rate through the front door for a long time, measured window by window, to see
whether a long-running stack drifts (issue 38, item 9: the embedded broker keeps every batch and
lists them all on each fetch).

    .venv/bin/python bench/soak_bench.py                           # product topology, 20 req/s, 30 min
    .venv/bin/python bench/soak_bench.py --minutes 4 --window-s 30 # a short look

The stack is `llmpipe up --processes` with the default (chained) product topology on the instant
mock upstream (bench/mock_upstream.py), as in bench/peer_bench.py. Each window offers `--rate`
requests/s open-loop and records the answered share, latency p50/p99, CPU ms per answered request of
the whole stack (per process too) and, at its end, the broker's and the whole stack's RSS. Printed:
a table per window, then the first and last `--compare` windows side by side, then one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import psutil  # noqa: E402
import typer  # noqa: E402
from rich.table import Table  # noqa: E402

from bench._common import print_result  # noqa: E402
from bench.peer_bench import console, free_port, llmpipe, log, measure, stack_roots, tree_pids, wait_http  # noqa: E402


def rss_mib(roots: dict[str, int]) -> dict[str, float]:
    """RSS per owner (a root and its children), MiB."""
    out: dict[str, float] = {}
    for pid, owner in tree_pids(roots).items():
        try:
            out[owner] = out.get(owner, 0.0) + psutil.Process(pid).memory_info().rss / 2**20
        except psutil.Error:
            continue
    return {k: round(v, 1) for k, v in out.items()}


def mean(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return round(sum(vals) / len(vals), 2) if vals else None


async def soak(topology: str, rate: float, minutes: float, window_s: float) -> dict[str, Any]:
    import subprocess
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="soak-bench-"))
    port = free_port()
    mock = subprocess.Popen([sys.executable, str(ROOT / "bench" / "mock_upstream.py"), "--port", str(port)])
    windows: list[dict[str, Any]] = []
    try:
        await wait_http(f"http://127.0.0.1:{port}/health", 30, mock)
        async with llmpipe(topology, f"http://127.0.0.1:{port}/v1", work) as system, \
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            t0 = time.monotonic()
            while time.monotonic() - t0 < minutes * 60:
                assert system.data_dir is not None
                system.roots = stack_roots(system.data_dir)  # a rolled broker is a new process
                row = await measure(session, system, rate, window_s, mock.pid)
                mem = rss_mib(stack_roots(system.data_dir))
                broker = (json.loads((system.data_dir / "run" / "health.json").read_text()).get("broker") or {})
                row.update(minute=round((time.monotonic() - t0) / 60, 1), broker_rss_mib=mem.get("broker"),
                           rss_mib_by_process=mem,
                           stack_rss_mib=round(sum(mem.values()), 1), broker_rolls=broker.get("rolls"),
                           broker_restarts=broker.get("restarts"))
                windows.append(row)
                log.print(f"  {row['minute']:>5} min: {row['ok']}/{row['sent']} ok, p50 {row['p50_ms']} ms, "
                          f"p99 {row['p99_ms']} ms, {row['cpu_ms_per_req']} CPU ms/req, broker "
                          f"{row['broker_rss_mib']} MiB, rolls {row['broker_rolls']}")
    finally:
        mock.terminate()
        mock.wait(10)
    return {"bench": "soak", "topology": topology, "rate": rate, "minutes": minutes, "window_s": window_s,
            "windows": windows}


def main(topology: str = typer.Option("product", help="gateway or product (bench/peer_bench.py)"),
         rate: float = typer.Option(20.0, help="requests per second, open loop, the whole time"),
         minutes: float = typer.Option(30.0, help="how long"),
         window_s: float = typer.Option(60.0, help="one measured window"),
         compare: int = typer.Option(5, help="windows averaged at the start and at the end")) -> None:
    t0 = time.perf_counter()
    result = asyncio.run(soak(topology, rate, minutes, window_s))
    rows = result["windows"]
    t = Table(title=f"soak: {topology} at {rate:g} req/s")
    for c in ("minute", "ok/sent", "p50 ms", "p99 ms", "CPU ms/req", "broker MiB", "stack MiB", "rolls"):
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row(str(r["minute"]), f"{r['ok']}/{r['sent']}", str(r["p50_ms"]), str(r["p99_ms"]),
                  str(r["cpu_ms_per_req"]), str(r["broker_rss_mib"]), str(r["stack_rss_mib"]), str(r["broker_rolls"]))
    console.print(t)
    first, last = rows[:compare], rows[-compare:]
    keys = ("p50_ms", "p99_ms", "cpu_ms_per_req", "broker_rss_mib", "stack_rss_mib")
    result["first_vs_last"] = {k: [mean(first, k), mean(last, k)] for k in keys}
    for k, (a, b) in result["first_vs_last"].items():
        console.print(f"{k}: first {compare} windows {a}, last {compare} {b}")
    print_result(console, result, t0)


if __name__ == "__main__":
    typer.run(main)
