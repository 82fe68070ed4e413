"""Generation throughput: the same prompts straight into the vLLM engine vs through the whole pipeline.

    .venv/bin/python bench/generate_bench.py            # 64 prompts x 64 new tokens (~3.5 min)
    .venv/bin/python bench/generate_bench.py --quick    # 16 prompts x 32 new tokens (~2.5 min)
    .venv/bin/python bench/generate_bench.py --stack-env LLMPIPE_CONSUMER__FETCH_MAX_WAIT_MS=500   # try a setting
    .venv/bin/python bench/generate_bench.py --pin      # the engine on core 0, everything else on the others

(a) engine: the prepared model in a VllmEngine in this process (the engine settings the stack uses),
    every prompt submitted at once with asyncio.gather.
(b) pipeline: `llmpipe up --detach --processes` on a fresh data dir (the model prepared in (a) is
    reused), then every prompt submitted at once with Client.submit_many (mask -> cache -> route ->
    admit -> generate -> postprocess, one worker process per chain), answers awaited on the reply partition.

tokens/s = generated tokens / (first submit -> last answer). ignore_eos is not exposed, so the
prompts ask for long essays and the tokens actually generated are counted (a short answer lowers
both modes alike). The engine is stopped before the stack starts: two engines do not fit 2 cores.
A few warm-up requests (other prompts) run before each timed part. Every pipeline answer must be a
cache miss (distinct topics); a hit is reported and its tokens are not counted.

--pin separates the pipeline's cost from core sharing: in both modes vLLM's engine core (its
OpenMP bound to core 0 from start-up) runs alone on core 0, and every other process and thread, the
in-process engine's front end in (a) and every stack process in (b), on the other cores. Then the
feed ratio asks only whether the pipeline keeps the engine's continuous batching fed.

Prints a rich table, a per-stage table for (b) with CPU seconds per stack process (timed part and
3 s of the idle stack after warm-up), then one JSON line (the last line of stdout).
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
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
BASE_ENV = dict(os.environ)  # the stack gets the caller's environment, not what the in-process engine sets

import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench._common import (  # noqa: E402
    PIN_ENV,
    CpuWindow,
    cpu_by_owner,
    pct,
    pin_split,
    print_result,
    proc_ticks,
)

RATIO_TARGET = 0.9
STAGES = ["mask", "cache", "route", "admit", "generate", "postprocess"]
console = Console(width=None if sys.stdout.isatty() else 120)
log = Console(stderr=True)

TOPICS = [
    "volcanoes", "honeybees", "medieval castles", "the printing press", "coral reefs", "glaciers",
    "the steam engine", "origami", "jazz music", "photosynthesis", "the violin", "desert ecosystems",
    "lighthouses", "bread baking", "chess strategy", "hot air balloons", "tea cultivation", "rainbows",
    "submarines", "ancient pottery", "wind turbines", "penguins", "the magnetic compass", "silk weaving",
    "tornadoes", "bamboo forests", "the telescope", "cheese making", "migratory birds", "earthquakes",
    "stained glass windows", "sailing ships", "wild mushrooms", "the bicycle", "typography", "octopuses",
    "the piano", "irrigation canals", "glassblowing", "thunderstorms", "elephants", "paper money",
    "the microscope", "knitting", "cave paintings", "windmills", "fireflies", "railways", "the abacus",
    "salt production", "mechanical clocks", "whales", "suspension bridges", "kites", "olive oil",
    "ocean tides", "maple syrup", "sundials", "puppet theatre", "beavers", "mosaics", "frost on windows",
    "honey badgers", "lace making",
]
WARMUP_TOPICS = ["snowflakes", "carousels", "tortoises", "candle making", "igloos", "harmonicas", "canoes", "cacti"]
TEMPLATES = [
    "Write a long, detailed essay about {t}. Explain the history, how it works, and why it matters, with examples.",
    "Tell me everything you know about {t}: where it comes from, how it works, and some surprising facts.",
    "Give a thorough, multi-paragraph explanation of {t} for a curious student, with plenty of detail.",
    "Describe {t} at length: its origins, the key ideas behind it, and its role in everyday life.",
]


def prompts_for(topics: list[str]) -> list[str]:
    return [TEMPLATES[i % len(TEMPLATES)].format(t=t) for i, t in enumerate(topics)]


def fmt(v: float | None, nd: int = 1) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def summary(tokens: list[int], ttft: list[float], e2e: list[float], wall_s: float) -> dict[str, Any]:
    total = sum(tokens)
    return {"requests": len(tokens), "tokens": total, "tokens_min": min(tokens, default=0),
            "tokens_mean": round(total / len(tokens), 1) if tokens else None, "wall_s": round(wall_s, 2),
            "tokens_per_s": round(total / wall_s, 1) if wall_s > 0 else None,
            "ttft_p50_ms": pct(ttft, 50), "ttft_p95_ms": pct(ttft, 95), "e2e_p50_ms": pct(e2e, 50),
            "e2e_p95_ms": pct(e2e, 95)}


# ---- (a) the engine in this process ------------------------------------------------------------


async def engine_mode(data_dir: Path, prompts: list[str], warmup: list[str], max_tokens: int,
                      pin: bool) -> dict[str, Any]:
    from pipeline.config.settings import load_settings
    from pipeline.engines.chat_engine import Sampling
    from pipeline.engines.model_prep import prepare
    from pipeline.engines.vllm_engine import VllmEngine

    es = load_settings().engine  # the engine settings the stack's generate stage uses
    t0 = time.perf_counter()
    info = await asyncio.to_thread(prepare, data_dir, es.dtype)
    prep_s = time.perf_counter() - t0
    log.print(f"(a) model {info.revision} ({'reused' if info.reused else 'prepared'} in {prep_s:.0f} s); starting engine")
    t0 = time.perf_counter()
    e = await VllmEngine(Path(info.path), revision=info.revision, cache_dir=data_dir / "cache", dtype=es.dtype,
                         max_model_len=es.max_model_len, max_num_seqs=es.max_num_seqs).start()
    start_s = time.perf_counter() - t0
    sampling = Sampling(max_tokens=max_tokens, temperature=0.0)

    def run(ps: list[str]):
        return asyncio.gather(*(e.generate([{"role": "user", "content": p}], sampling) for p in ps))

    try:
        pinned = pin_split([os.getpid()]) if pin else None
        await run(warmup)
        log.print(f"(a) engine up in {start_s:.0f} s, warmed up; timing {len(prompts)} prompts")
        cpu = CpuWindow()
        t0 = time.perf_counter()
        gens = await run(prompts)
        wall = time.perf_counter() - t0
        cpu_use = cpu.result()
    finally:
        await e.stop()
    out = summary([len(g.token_ids) for g in gens], [g.ttft_ms for g in gens], [g.e2e_ms for g in gens], wall)
    out.update({"mode": "engine", "startup_s": round(start_s, 1), "host_cpu": cpu_use, "pinned": pinned,
                "finish": dict(Counter(g.finish_reason for g in gens)), "max_num_seqs": es.max_num_seqs,
                "revision": info.revision})
    out["_per_prompt_tokens"] = [len(g.token_ids) for g in gens]
    return out


# ---- (b) the whole pipeline --------------------------------------------------------------------


def cli(*args: str, data_dir: Path, timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args, "--data-dir", str(data_dir)], cwd=ROOT,
                          env={**BASE_ENV, **(env or {})}, capture_output=True, text=True, timeout=timeout)


async def pipeline_mode(data_dir: Path, prompts: list[str], warmup: list[str], max_tokens: int,
                        stack_env: dict[str, str], idle_s: float, pin: bool) -> dict[str, Any]:
    from pipeline.app.dev_key import read_dev_key
    from pipeline.contracts.request import ChatBody, ChatMessage
    from pipeline.ingress.client import Client

    log.print("(b) llmpipe up --detach --processes")
    t0 = time.perf_counter()
    up = await asyncio.to_thread(cli, "up", "--detach", "--processes", "--json", data_dir=data_dir, timeout=900,
                                 env=stack_env)
    start_s = time.perf_counter() - t0
    if up.returncode != 0:
        raise RuntimeError(f"llmpipe up failed ({up.returncode}): {up.stderr.strip()[-1500:]}")
    stack = json.loads((data_dir / "stack.json").read_text())
    key = read_dev_key(data_dir)  # authentication is on: the development tenant's key
    pinned = None
    try:
        if pin:
            pinned = pin_split([int(p) for p in stack["pids"].values()])
        async with Client(stack["bootstrap"], topic_prefix=stack["topic_prefix"]) as c:

            def docs_for(ps: list[str]):
                return [c.build(body=ChatBody(messages=[ChatMessage(role="user", content=p)], max_tokens=max_tokens,
                                              temperature=0.0), timeout_s=600, api_key=key) for p in ps]

            async def run(ps: list[str]):
                docs = docs_for(ps)
                t_submit = time.perf_counter()
                futs = await c.submit_many(docs)
                sent = {d.request_id: t_submit for d in docs}
                got: dict[str, float] = {}

                async def one(rid: str, fut: asyncio.Future) -> Any:
                    resp = await c.wait(rid, fut, 600)
                    got[rid] = time.perf_counter()
                    return resp

                resps = await asyncio.gather(*(one(d.request_id, f) for d, f in zip(docs, futs)))
                wall = time.perf_counter() - t_submit
                client_e2e = [(got[r.request_id] - sent[r.request_id]) * 1000 for r in resps]
                return resps, wall, client_e2e

            log.print(f"(b) stack up in {start_s:.0f} s; warming up")
            await run(warmup)
            owners = {int(p): k.split(":")[-1] for k, p in stack["pids"].items()} | {os.getpid(): "bench client"}
            idle, ticks0 = CpuWindow(), proc_ticks()
            await asyncio.sleep(idle_s)  # the stack with nothing to do: what it costs the engine
            idle_use = idle.result()
            idle_use["seconds"] = idle_s
            idle_use["cpu_s_by_process"] = cpu_by_owner(ticks0, proc_ticks(), owners)
            log.print(f"(b) idle stack: host busy {idle_use['busy_pct']}%; timing {len(prompts)} prompts")
            cpu = CpuWindow()
            ticks0 = proc_ticks()
            resps, wall, client_e2e = await run(prompts)
            by_proc = cpu_by_owner(ticks0, proc_ticks(), owners)
            cpu_use = cpu.result()
    finally:
        log.print("(b) llmpipe down")
        down = await asyncio.to_thread(cli, "down", data_dir=data_dir, timeout=300)
        if down.returncode != 0:
            log.print(f"[red]llmpipe down failed: {down.stderr.strip()[-500:]}[/]")
    ok = [r for r in resps if r.status.value == "ok"]
    generated = [r for r in ok if r.cache != "hit"]
    out = summary([r.usage.completion_tokens for r in generated], [r.ttft_ms for r in generated if r.ttft_ms is not None],
                  [r.e2e_ms for r in resps if r.e2e_ms is not None], wall)
    stages = {}
    for st in STAGES:
        q = [r.timings[st].queue_ms for r in resps if st in r.timings]
        s = [r.timings[st].service_ms for r in resps if st in r.timings]
        stages[st] = {"n": len(q), "queue_p50_ms": pct(q, 50), "queue_p95_ms": pct(q, 95),
                      "service_p50_ms": pct(s, 50), "service_p95_ms": pct(s, 95)}
    out.update({"mode": "pipeline", "startup_s": round(start_s, 1), "host_cpu": cpu_use, "idle_stack_cpu": idle_use,
                "cpu_s_by_process": by_proc, "stack_env": stack_env, "pinned": pinned,
                "status": dict(Counter(r.status.value for r in resps)), "cache": dict(Counter(str(r.cache) for r in resps)),
                "errors": sorted({f"{r.error_class}: {r.reason}" for r in resps if r.status.value != "ok"})[:5],
                "client_e2e_p50_ms": pct(client_e2e, 50), "client_e2e_p95_ms": pct(client_e2e, 95), "stages": stages})
    out["_per_prompt_tokens"] = [r.usage.completion_tokens for r in resps]
    return out


# ---- report ------------------------------------------------------------------------------------


def main_table(a: dict[str, Any], b: dict[str, Any], ratio: float | None, n: int, max_tokens: int) -> Table:
    pinned = " - engine pinned to its own core" if a.get("pinned") else ""
    t = Table(title=f"Generation: {n} prompts x {max_tokens} new tokens (greedy), all submitted at once{pinned}")
    for col in ("mode", "tokens", "tok/req min/mean", "wall s", "tokens/s", "TTFT p50", "TTFT p95", "e2e p50",
                "e2e p95", "cpu/steal%"):
        t.add_column(col, justify="left" if col == "mode" else "right")
    for name, r in (("(a) engine", a), ("(b) pipeline", b)):
        t.add_row(name, str(r["tokens"]), f"{r['tokens_min']}/{fmt(r['tokens_mean'])}", fmt(r["wall_s"], 2),
                  fmt(r["tokens_per_s"]), fmt(r["ttft_p50_ms"], 0), fmt(r["ttft_p95_ms"], 0), fmt(r["e2e_p50_ms"], 0),
                  fmt(r["e2e_p95_ms"], 0), f"{fmt(r['host_cpu']['busy_pct'], 0)}/{fmt(r['host_cpu']['steal_pct'], 0)}")
    verdict = "-" if ratio is None else f"{ratio:.2f} {'>=' if ratio >= RATIO_TARGET else '<'} {RATIO_TARGET}"
    t.add_row("b/a", "", "", "", verdict, "", "", "", "", "", end_section=True)
    t.caption = (f"ms; TTFT = engine submit -> first token (pipeline: the answers' ttft_ms); e2e = (a) engine call, "
                 f"(b) created_ms -> finished_ms of the answer (client-seen p50/p95 {fmt(b['client_e2e_p50_ms'], 0)}/"
                 f"{fmt(b['client_e2e_p95_ms'], 0)}). (b) status {b['status']}, cache {b['cache']}")
    return t


def stage_table(b: dict[str, Any]) -> Table:
    t = Table(width=min(console.width, 120),
              title="(b) per stage (ms): queue = input record ts -> processing start; service = processing")
    idle = b["idle_stack_cpu"]

    def top(d: dict[str, float]) -> str:
        return ", ".join(f"{k} {v}" for k, v in d.items() if v >= 0.1) or "-"

    t.caption = (f"CPU s by process (engine processes count as generate) - timed part: {top(b['cpu_s_by_process'])}; "
                 f"idle stack after warm-up ({idle['seconds']} s, host busy {fmt(idle['busy_pct'], 0)}%): "
                 f"{top(idle['cpu_s_by_process'])}")
    for col in ("stage", "n", "queue p50", "queue p95", "service p50", "service p95"):
        t.add_column(col, justify="left" if col == "stage" else "right")
    for st, v in b["stages"].items():
        t.add_row(st, str(v["n"]), fmt(v["queue_p50_ms"], 0), fmt(v["queue_p95_ms"], 0), fmt(v["service_p50_ms"], 0),
                  fmt(v["service_p95_ms"], 0))
    return t


async def main_async(n: int, max_tokens: int, n_warmup: int, data_dir: Path, stack_env: dict[str, str],
                     idle_s: float, pin: bool) -> dict[str, Any]:
    prompts = prompts_for(TOPICS[:n])
    warm_a = prompts_for(WARMUP_TOPICS[:n_warmup])
    warm_b = prompts_for(WARMUP_TOPICS[n_warmup:2 * n_warmup])  # not the ones (a) used: no cache entry to hit
    a = await engine_mode(data_dir, prompts, warm_a, max_tokens, pin)
    await asyncio.sleep(2)  # let the engine core process go
    b = await pipeline_mode(data_dir, prompts, warm_b, max_tokens, {**stack_env, **(PIN_ENV if pin else {})},
                            idle_s, pin)
    ratio = round(b["tokens_per_s"] / a["tokens_per_s"], 3) if a["tokens_per_s"] and b["tokens_per_s"] else None
    same = sum(x == y for x, y in zip(a.pop("_per_prompt_tokens"), b.pop("_per_prompt_tokens")))
    console.print(main_table(a, b, ratio, n, max_tokens))
    console.print(stage_table(b))
    if b["cache"].get("hit"):
        console.print(f"[yellow]warning: {b['cache']['hit']} pipeline answers were cache hits (tokens not counted)[/]")
    if b["errors"]:
        console.print(f"[red]pipeline errors: {b['errors']}[/]")
    console.print(f"same token count per prompt in (a) and (b): {same}/{n}")
    return {"bench": "generate", "host": {"cpus": os.cpu_count(), "python": platform.python_version()}, "pin": pin,
            "prompts": n, "max_tokens": max_tokens, "warmup": n_warmup, "engine": a, "pipeline": b,
            "ratio_b_over_a": ratio, "ratio_target": RATIO_TARGET, "same_token_count": same}


app = typer.Typer(add_completion=False)


@app.command()
def main(
    quick: bool = typer.Option(False, "--quick", help="16 prompts x 32 tokens"),
    prompts: int = typer.Option(None, help=f"prompts (default 64, quick 16; max {len(TOPICS)})"),
    max_tokens: int = typer.Option(None, help="new tokens per prompt (default 64, quick 32)"),
    warmup: int = typer.Option(4, help="warm-up requests per mode (different prompts; max 4)"),
    keep: bool = typer.Option(False, "--keep", help="keep the temp data dir (logs) and print its path"),
    stack_env: list[str] = typer.Option([], "--stack-env", help="KEY=VALUE for the stack's processes, repeatable "
                                        "(e.g. LLMPIPE_CONSUMER__FETCH_MAX_WAIT_MS=100)"),
    idle: float = typer.Option(3.0, help="seconds the idle stack's host CPU is sampled before (b) is timed"),
    pin: bool = typer.Option(False, "--pin", help="vLLM's engine core alone on core 0, everything else on the others"),
) -> None:
    """(a) vLLM engine in-process vs (b) the whole pipeline: tokens/s, their ratio, TTFT and e2e."""
    n = prompts if prompts is not None else (16 if quick else 64)
    mt = max_tokens if max_tokens is not None else (32 if quick else 64)
    if not 1 <= n <= len(TOPICS):
        raise typer.BadParameter(f"1..{len(TOPICS)}", param_hint="--prompts")
    if not 0 <= warmup <= len(WARMUP_TOPICS) // 2:
        raise typer.BadParameter(f"0..{len(WARMUP_TOPICS) // 2}", param_hint="--warmup")
    if any("=" not in kv for kv in stack_env):
        raise typer.BadParameter("KEY=VALUE", param_hint="--stack-env")
    env = dict(kv.split("=", 1) for kv in stack_env)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # this process only (the stack gets BASE_ENV)
    if pin:
        os.environ.update(PIN_ENV)  # (a)'s engine binds its OpenMP at start; (b) gets it with --stack-env
    t0 = time.perf_counter()
    tmp = tempfile.mkdtemp(prefix="llmpipe-genbench-")
    try:
        result = asyncio.run(main_async(n, mt, warmup, Path(tmp), env, idle, pin))
    finally:
        if keep:
            log.print(f"data dir kept: {tmp}")
        else:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    print_result(console, result, t0)


if __name__ == "__main__":
    app()
