"""Pipeline overhead and overload on the whole stack (`llmpipe up --processes`, real vLLM).

    .venv/bin/python bench/pipeline_bench.py            # 5, 20, 50 req/s for 20 s each; overload 20 s (~9 min)
    .venv/bin/python bench/pipeline_bench.py --quick    # 8 s per rate, overload 10 s (~5 min)
    .venv/bin/python bench/pipeline_bench.py --quick --stack-env VLLM_CPU_OMP_THREADS_BIND=0   # try a setting
    .venv/bin/python bench/pipeline_bench.py --quick --pin   # the engine alone on core 0, the rest on the others

(1) Overhead. Text requests with distinct prompts (every one a cache miss, so every one runs every
    text stage), max_tokens 1 so the engine's part is one prefill, offered open-loop at 5, 20 and 50
    req/s by tenant `open` (no limits). Per answered request:
        overhead = E2E − generate's service time
    (E2E = answer time − creation time, both stamped by the pipeline; generate's service time is the
    engine call). It is everything the pipeline adds: hops, the other stages' work, queueing — also
    queueing in front of the engine once the offered rate passes what the host can do.
(2) Overload at 5× the measured capacity. Capacity = answers/s at the highest rate of (1) that the
    stack kept up with (or its completion rate at 50 req/s). Tenant `limited` (concurrency 8 =
    the engine's batch, no wait queue) offers 5× that for the window: admit answers the excess 429
    (`concurrency_limited`) at once. The stack's resident memory (every stack process and its
    children) is sampled every 0.5 s before and during the overload. None lost = every request sent
    got exactly one terminal answer.

Targets (issue 7): overhead p50 ≤ 30 ms at 20 req/s; zero lost under overload. Prints tables and
one JSON line (the last line of stdout).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
import typer  # noqa: E402
import yaml  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench._common import PIN_ENV, CpuWindow, cpu_by_owner, pct, pin_split, proc_ticks  # noqa: E402

OVERHEAD_TARGET_MS = 30.0
console = Console(width=None if sys.stdout.isatty() else 130)
log = Console(stderr=True)


def cli(*args: str, data_dir: Path, timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args, "--data-dir", str(data_dir)], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})


def stack_config(keys: dict[str, str]) -> dict[str, Any]:
    from pipeline.registries.tenants import key_hash

    limits = {"open": {}, "limited": {"concurrency": 8, "max_queue": 0}}
    return {"tenants": [{"name": t, "limits": limits[t], "api_keys": [{"key_sha256": key_hash(k)}]}
                        for t, k in keys.items()]}


class RssSampler:
    """Resident memory of the stack: every process in stack.json and its children (vLLM's engine core)."""

    def __init__(self, pids: list[int]) -> None:
        self.procs = [psutil.Process(p) for p in pids if psutil.pid_exists(p)]
        self.samples: list[tuple[float, float]] = []
        self._task: asyncio.Task | None = None

    def rss_mib(self) -> float:
        total = 0
        seen: set[int] = set()
        for p in self.procs:
            try:
                for q in [p, *p.children(recursive=True)]:
                    if q.pid not in seen:
                        seen.add(q.pid)
                        total += q.memory_info().rss
            except psutil.Error:
                continue
        return total / 2**20

    async def run(self) -> None:
        while True:
            self.samples.append((time.monotonic(), await asyncio.to_thread(self.rss_mib)))
            await asyncio.sleep(0.5)

    def start(self) -> RssSampler:
        self._task = asyncio.create_task(self.run())
        return self

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def between(self, t0: float, t1: float) -> list[float]:
        return [m for t, m in self.samples if t0 <= t <= t1]


async def offer(client, key: str, rate: float, seconds: float, tag: str, timeout_s: float = 120.0):
    """Open-loop: one request every 1/rate s for `seconds`, distinct prompts; returns (sent, answers, wall)."""
    from pipeline.contracts.request import ChatBody, ChatMessage

    n = max(1, int(rate * seconds))
    t0 = time.monotonic()
    docs, futs = [], []
    for i in range(n):
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        # built at send time: E2E starts when the request is created, i.e. sent
        d = client.build(body=ChatBody(messages=[ChatMessage(role="user", content=f"Reply yes. ({tag} {i})")],
                                       max_tokens=1, temperature=0.0), timeout_s=timeout_s, api_key=key)
        docs.append(d)
        futs.append((d.request_id, await client.submit(d)))
    offered_s = time.monotonic() - t0
    answers = []
    for rid, fut in futs:
        try:
            answers.append(await client.wait(rid, fut, timeout_s + 30))
        except TimeoutError:
            pass  # lost: no terminal answer
    return docs, answers, offered_s, time.monotonic() - t0


def overhead_row(rate: float, docs, answers, offered_s: float, wall_s: float) -> dict[str, Any]:
    ok = [r for r in answers if r.status.value == "ok" and "generate" in r.timings and r.e2e_ms is not None]
    over = [r.e2e_ms - r.timings["generate"].service_ms for r in ok]
    engine = [r.timings["generate"].service_ms for r in ok]
    gen_queue = [r.timings["generate"].queue_ms for r in ok]
    stages = sorted({st for r in ok for st in r.timings}, key=lambda st: pct([r.timings[st].queue_ms for r in ok
                                                                              if st in r.timings], 50) or 0)
    by_stage = {st: {"queue_p50_ms": pct([r.timings[st].queue_ms for r in ok if st in r.timings], 50),
                     "service_p50_ms": pct([r.timings[st].service_ms for r in ok if st in r.timings], 50)}
                for st in stages}
    hops = [r.e2e_ms - sum(t.queue_ms + t.service_ms for t in r.timings.values()) for r in ok]
    return {"offered_rps": rate, "sent": len(docs), "answered": len(answers), "ok": len(ok), "stages": by_stage,
            "between_stages_p50_ms": pct(hops, 50),
            "status": dict(Counter(r.status.value for r in answers)),
            "achieved_rps": round(len(answers) / wall_s, 2) if wall_s else None,
            "kept_up": wall_s <= offered_s + 5.0,
            "overhead_p50_ms": pct(over, 50), "overhead_p99_ms": pct(over, 99),
            "engine_p50_ms": pct(engine, 50), "generate_queue_p50_ms": pct(gen_queue, 50),
            "e2e_p50_ms": pct([r.e2e_ms for r in ok], 50), "e2e_p99_ms": pct([r.e2e_ms for r in ok], 99)}


async def main_async(quick: bool, stack_env: dict[str, str], pin: bool) -> dict[str, Any]:
    from pipeline.ingress.client import Client
    from pipeline.registries.tenants import new_api_key

    window = 8.0 if quick else 20.0
    overload_s = 10.0 if quick else 20.0
    data_dir = Path(tempfile.mkdtemp(prefix="pipeline-bench-"))
    keys = {"open": new_api_key(), "limited": new_api_key()}
    cfg = data_dir / "bench.yaml"
    cfg.write_text(yaml.safe_dump(stack_config(keys)))
    log.print("llmpipe up --detach --processes (default topology, real vLLM)")
    t0 = time.monotonic()
    up = await asyncio.to_thread(cli, "up", "--detach", "--processes", "--config", str(cfg), "--json",
                                 data_dir=data_dir, timeout=900, env={**stack_env, **(PIN_ENV if pin else {})})
    if up.returncode != 0:
        raise RuntimeError(f"llmpipe up failed: {up.stderr.strip()[-1500:]}")
    stack = json.loads((data_dir / "stack.json").read_text())
    log.print(f"stack up in {time.monotonic() - t0:.0f}s")
    pinned = pin_split([int(p) for p in stack["pids"].values()]) if pin else None
    rss = RssSampler([int(p) for p in stack["pids"].values()]).start()
    rows: list[dict[str, Any]] = []
    try:
        async with Client(stack["bootstrap"], topic_prefix=stack["topic_prefix"]) as c:
            await offer(c, keys["open"], 4, 3, "warm-up")
            owners = {int(p): k.split(":")[-1] for k, p in stack["pids"].items()} | {os.getpid(): "bench client"}
            for rate in (5.0, 20.0, 50.0):
                log.print(f"offering {rate:.0f} req/s for {window:.0f}s")
                cpu, ticks0 = CpuWindow(), proc_ticks()
                docs, answers, offered_s, wall = await offer(c, keys["open"], rate, window, f"r{rate:.0f}")
                row = overhead_row(rate, docs, answers, offered_s, wall)
                row["host_busy_pct"] = cpu.result().get("busy_pct")
                row["cpu_s_by_process"] = cpu_by_owner(ticks0, proc_ticks(), owners)
                row["seconds"] = round(wall, 1)
                rows.append(row)
                await asyncio.sleep(2)
            kept = [r for r in rows if r["kept_up"]]
            capacity = max(r["achieved_rps"] for r in (kept or rows))
            over_rate = 5 * capacity
            log.print(f"measured capacity {capacity} req/s; overload at {over_rate:.1f} req/s for {overload_s:.0f}s")
            before = rss.between(time.monotonic() - 10, time.monotonic())
            t_over = time.monotonic()
            docs, answers, offered_s, wall = await offer(c, keys["limited"], over_rate, overload_s, "overload")
            during = rss.between(t_over, time.monotonic())
            ids = [a.request_id for a in answers]
            overload = {
                "capacity_rps": capacity, "offered_rps": round(over_rate, 2), "sent": len(docs),
                "answered": len(answers), "lost": len(docs) - len(set(ids)), "duplicates": len(ids) - len(set(ids)),
                "status": dict(Counter(a.status.value for a in answers)),
                "error_class": dict(Counter(a.error_class for a in answers if a.error_class)),
                "rss_before_mib": round(max(before), 1) if before else None,
                "rss_max_during_mib": round(max(during), 1) if during else None,
                "rss_growth_mib": round(max(during) - max(before), 1) if before and during else None,
                "seconds": round(wall, 1)}
    finally:
        await rss.stop()
        log.print("llmpipe down")
        await asyncio.to_thread(cli, "down", data_dir=data_dir, timeout=300)
    return {"bench": "pipeline", "quick": quick, "stack_env": stack_env, "pinned": pinned, "rates": rows,
            "overload": overload,
            "target_overhead_p50_ms": OVERHEAD_TARGET_MS}


def main(quick: bool = typer.Option(False, "--quick", help="shorter windows"),
         stack_env: list[str] = typer.Option([], "--stack-env", help="KEY=VALUE for the stack's processes "
                                                                     "(e.g. VLLM_CPU_OMP_THREADS_BIND=0), repeatable"),
         pin: bool = typer.Option(False, "--pin", help="vLLM's engine core alone on core 0, the rest on the others")) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if any("=" not in kv for kv in stack_env):
        raise typer.BadParameter("--stack-env takes KEY=VALUE")
    res = asyncio.run(main_async(quick, dict(kv.split("=", 1) for kv in stack_env), pin))
    t = Table(title="Pipeline overhead = E2E − engine service time (text, cache misses, max_tokens 1)")
    for col in ("offered req/s", "sent", "ok", "achieved req/s", "kept up", "overhead p50", "overhead p99",
                "engine p50", "queue before engine p50", "e2e p50", "e2e p99", "host busy %"):
        t.add_column(col, justify="right")
    for r in res["rates"]:
        t.add_row(str(r["offered_rps"]), str(r["sent"]), str(r["ok"]), str(r["achieved_rps"]), str(r["kept_up"]),
                  str(r["overhead_p50_ms"]), str(r["overhead_p99_ms"]), str(r["engine_p50_ms"]),
                  str(r["generate_queue_p50_ms"]), str(r["e2e_p50_ms"]), str(r["e2e_p99_ms"]),
                  str(r["host_busy_pct"]))
    console.print(t)
    st = Table(title="Where the overhead goes: per-stage queue / service p50 (ms), and time between stages")
    st.add_column("offered req/s", justify="right")
    names = list(res["rates"][0]["stages"])
    for n in names:
        st.add_column(n, justify="right")
    st.add_column("between stages", justify="right")
    for r in res["rates"]:
        st.add_row(str(r["offered_rps"]), *(f"{r['stages'].get(n, {}).get('queue_p50_ms')} / "
                                            f"{r['stages'].get(n, {}).get('service_p50_ms')}" for n in names),
                   str(r["between_stages_p50_ms"]))
    console.print(st)
    cpu = Table(title="CPU seconds per stack process in each window (vLLM's engine core counts as generate)")
    cpu.add_column("offered req/s", justify="right")
    cpu.add_column("window s", justify="right")
    cpu.add_column("CPU seconds by process")
    for r in res["rates"]:
        cpu.add_row(str(r["offered_rps"]), str(r["seconds"]),
                    ", ".join(f"{k} {v}" for k, v in r["cpu_s_by_process"].items() if v >= 0.1))
    console.print(cpu)
    at20 = next(r for r in res["rates"] if r["offered_rps"] == 20.0)
    ratio = None if at20["overhead_p50_ms"] is None else round(at20["overhead_p50_ms"] / OVERHEAD_TARGET_MS, 2)
    console.print(f"overhead p50 at 20 req/s: {at20['overhead_p50_ms']} ms (target ≤ {OVERHEAD_TARGET_MS} ms; "
                  f"ratio {ratio})")
    o = res["overload"]
    console.print(f"overload: {o['offered_rps']} req/s offered (5 × {o['capacity_rps']}), {o['sent']} sent, "
                  f"{o['answered']} answered, lost {o['lost']}, statuses {o['status']}, classes {o['error_class']}; "
                  f"stack RSS {o['rss_before_mib']} MiB before, max {o['rss_max_during_mib']} MiB during "
                  f"(+{o['rss_growth_mib']} MiB)")
    res["overhead_ratio_at_20"] = ratio
    print(json.dumps(res))


if __name__ == "__main__":
    typer.run(main)
