"""What an idle stack costs: `llmpipe up --processes` with no traffic, CPU per process over a window.

    .venv/bin/python bench/idle_bench.py                 # the default (product) topology, vLLM included
    .venv/bin/python bench/idle_bench.py --light         # model-free generate (tests.stages:FakeGenerate)

The stack starts, answers one request (so every consumer has fetched once and every model is
loaded), then rests `--settle-s`; CPU is read from /proc over `--window-s`, each process charged to
the part of the stack that started it (stack.json's pids: the supervisor with the door, the broker,
each worker group; a worker's children, e.g. vLLM's engine core, count as that worker). Printed: a
table, then one JSON line with percent of one core per part and in total.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import typer  # noqa: E402
import yaml  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench._common import code_state, cpu_by_owner, proc_ticks  # noqa: E402
from bench.stream_bench import cli  # noqa: E402

console = Console(width=None if sys.stdout.isatty() else 130)


def config(key: str, light: bool, doze_max_ms: int | None) -> dict[str, Any]:
    from pipeline.registries.tenants import key_hash

    cfg: dict[str, Any] = {"tenants": [{"name": "idle", "api_keys": [{"key_sha256": key_hash(key)}]}]}
    if light:
        cfg["stages"] = [{"name": "admit"}, {"name": "generate", "class": "tests.stages:FakeGenerate"},
                         {"name": "postprocess"}]
    if doze_max_ms is not None:
        cfg["consumer"] = {"doze_max_ms": doze_max_ms}
    return cfg


def main(light: bool = typer.Option(False, "--light", help="model-free generate (tests.stages:FakeGenerate)"),
         settle_s: float = typer.Option(20.0, help="rest after the first answer, before measuring"),
         window_s: float = typer.Option(60.0, help="the measured idle window"),
         doze_max_ms: int | None = typer.Option(None, help="consumer.doze_max_ms (default: the settings')")) -> None:
    from pipeline.registries.tenants import new_api_key

    key = new_api_key()
    with tempfile.TemporaryDirectory(prefix="idle-bench-") as tmp:
        data_dir = Path(tmp)
        cfg = data_dir / "llmpipe.yaml"
        cfg.write_text(yaml.safe_dump(config(key, light, doze_max_ms)))
        up = cli("up", "--detach", "--processes", "--config", str(cfg), "--json", data_dir=data_dir, timeout=900)
        if up.returncode != 0:
            raise SystemExit(f"llmpipe up failed: {up.stderr[-2000:]}")
        info = json.loads(up.stdout.strip().splitlines()[-1])
        try:
            r = httpx.post(info["http_url"] + "/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
                           json={"model": "small", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
                           timeout=300)
            if r.status_code != 200:
                raise SystemExit(f"the first request got {r.status_code}: {r.text[:500]}")
            time.sleep(settle_s)
            pids = json.loads((data_dir / "stack.json").read_text())["pids"]
            owners = {pid: name.removeprefix("worker:") for name, pid in pids.items()}
            before, t0 = proc_ticks(), time.monotonic()
            time.sleep(window_s)
            after, took = proc_ticks(), time.monotonic() - t0
        finally:
            cli("down", data_dir=data_dir, timeout=300)
    cpu = cpu_by_owner(before, after, owners)
    cpu.pop("other", None)  # this bench and whatever else runs on the host
    pct = {k: round(100 * v / took, 1) for k, v in cpu.items()}
    result = {"bench": "idle", "light": light, "doze_max_ms": doze_max_ms, "window_s": round(took, 1), "settle_s": settle_s,
              "cpu_pct_of_one_core": pct, "total_pct_of_one_core": round(sum(pct.values()), 1),
              "code": code_state(ROOT), "host_cpus": os.cpu_count()}
    table = Table(title=f"idle stack, {took:.0f} s: {result['total_pct_of_one_core']} % of one core in total")
    table.add_column("part")
    table.add_column("% of one core")
    for k, v in pct.items():
        table.add_row(k, str(v))
    console.print(table)
    print(json.dumps(result))


if __name__ == "__main__":
    typer.run(main)
