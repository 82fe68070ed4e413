"""Rollout throughput: n samples per prompt straight from the vLLM engine vs as `rollout` requests
through the whole pipeline (generated tokens/s, sample completion rate), at n = 4 and 8.

    .venv/bin/python bench/rollout_bench.py --pin             # 8 prompts, n = 4 and 8, 48 tokens, 3 pairs (~12 min)
    .venv/bin/python bench/rollout_bench.py --pin --n 4 --prompts 4 --max-tokens 32 --repeat 1   # a quick look

(a) engine: a VllmEngine in this process (the stack's engine settings); every sample of every prompt
    submitted at once (seed + i for sample i, temperature 1, logprobs on, as generate samples them).
(b) pipeline: `llmpipe up --detach --processes`; every prompt as one `rollout` request with n samples
    (mask -> cache (bypassed: rollouts are never cached) -> route -> admit -> generate, which samples
    the n side by side and scores them -> postprocess), submitted at once; the answers carry the samples.

Both are up for the whole run and measured in pairs, (a) then (b), `--repeat` times per n: on this
host class one engine alone varies by +-15 % from run to run (40-52 s for the same 64 samples, measured
2026-12-04), so a ratio of two single runs measured minutes apart says more about the host than about
the pipeline. The ratio reported is the median of the pairs' ratios. An idle engine costs nothing: its
engine core sleeps a second after its last step.

tokens/s = generated tokens / (first submit -> last answer); completion rate = samples that came back
÷ samples asked for. --pin: both vLLM engines (engine core and model worker processes) on core 0,
everything else on the other cores (bench/_common.py pin_split). Target (issue 21): the median
(b)/(a) tokens/s ≥ 0.9 at each n. Prints a table and one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import typer  # noqa: E402

from bench._common import PIN_ENV, pin_split, print_result  # noqa: E402
from bench.generate_bench import TOPICS, cli, console, log, prompts_for  # noqa: E402

RATIO_TARGET = 0.9


async def start_engine(data_dir: Path):
    from pipeline.config.settings import load_settings
    from pipeline.engines.model_prep import prepare
    from pipeline.engines.vllm_engine import VllmEngine

    es = load_settings().engine
    info = await asyncio.to_thread(prepare, data_dir, es.dtype)
    return await VllmEngine(Path(info.path), revision=info.revision, cache_dir=data_dir / "cache", dtype=es.dtype,
                            max_model_len=es.max_model_len, max_num_seqs=es.max_num_seqs).start()


async def engine_run(e, prompts: list[str], n: int, max_tokens: int, tag: str) -> dict[str, Any]:
    """(a): every sample of every prompt submitted at once, seed 7 + i for sample i."""
    from pipeline.engines.chat_engine import Sampling

    base = Sampling(max_tokens=max_tokens, temperature=1.0, seed=7, logprobs=True)
    t0 = time.perf_counter()
    gens = await asyncio.gather(*(e.generate([{"role": "user", "content": p}], replace(base, seed=7 + i),
                                             f"{tag}:{k}:{i}") for k, p in enumerate(prompts) for i in range(n)))
    wall = time.perf_counter() - t0
    tokens = sum(len(g.token_ids) for g in gens)
    return {"samples": len(gens), "requested": len(prompts) * n, "tokens": tokens, "wall_s": round(wall, 2),
            "tokens_per_s": round(tokens / wall, 1)}


async def pipeline_run(c, key: str, prompts: list[str], n: int, max_tokens: int, tag: str) -> dict[str, Any]:
    """(b): every prompt as one rollout request of n samples, submitted at once."""
    from pipeline.contracts.request import ChatBody, ChatMessage, RolloutRequest

    docs = [c.build(body=ChatBody(messages=[ChatMessage(role="user", content=p)], max_tokens=max_tokens,
                                  temperature=1.0, seed=7, logprobs=True), timeout_s=900, api_key=key,
                    rollout=RolloutRequest(group_id=f"bench:{tag}:{k}", n=n))
            for k, p in enumerate(prompts)]
    t0 = time.perf_counter()
    futs = await c.submit_many(docs)
    resps = await asyncio.gather(*(c.wait(d.request_id, f, 900) for d, f in zip(docs, futs)))
    wall = time.perf_counter() - t0
    samples = [s for r in resps for s in r.samples]
    tokens = sum(s.tokens_out for s in samples)
    return {"samples": len(samples), "requested": len(prompts) * n, "tokens": tokens, "wall_s": round(wall, 2),
            "tokens_per_s": round(tokens / wall, 1), "status": sorted({r.status.value for r in resps})}


async def main_async(n_prompts: int, ns: list[int], max_tokens: int, repeat: int, pin: bool,
                     data_dir: Path) -> dict[str, Any]:
    from pipeline.app.dev_key import read_dev_key
    from pipeline.ingress.client import Client

    prompts = prompts_for(TOPICS[:n_prompts])
    up = await asyncio.to_thread(cli, "up", "--detach", "--processes", "--json", data_dir=data_dir, timeout=900,
                                 env=PIN_ENV if pin else {})
    if up.returncode != 0:
        raise RuntimeError(f"llmpipe up failed: {up.stderr.strip()[-1500:]}")
    stack = json.loads((data_dir / "stack.json").read_text())
    e = None
    pairs: dict[int, list[dict[str, Any]]] = {n: [] for n in ns}
    pinned = None
    try:
        e = await start_engine(data_dir / "engine-alone")
        if pin:
            pinned = pin_split([os.getpid(), *(int(p) for p in stack["pids"].values())])
        async with Client(stack["bootstrap"], topic_prefix=stack["topic_prefix"]) as c:
            key = read_dev_key(data_dir)
            await engine_run(e, ["Say hello."], 2, 4, "warm")
            await pipeline_run(c, key, ["Say hello."], 2, 4, "warm")
            for r in range(repeat):
                for n in ns:
                    a = await engine_run(e, prompts, n, max_tokens, f"a{r}n{n}")
                    b = await pipeline_run(c, key, prompts, n, max_tokens, f"b{r}n{n}")
                    ratio = round(b["tokens_per_s"] / a["tokens_per_s"], 3) if a["tokens_per_s"] else None
                    pairs[n].append({"engine": a, "pipeline": b, "ratio": ratio})
                    log.print(f"pair {r + 1}/{repeat}, n = {n}: engine {a['tokens_per_s']} tok/s, "
                              f"pipeline {b['tokens_per_s']} tok/s, ratio {ratio}")
    finally:
        if e is not None:
            await e.stop()
        await asyncio.to_thread(cli, "down", data_dir=data_dir, timeout=300)
    rows = {}
    for n in ns:
        ratios = [p["ratio"] for p in pairs[n] if p["ratio"] is not None]
        asked = sum(p["pipeline"]["requested"] for p in pairs[n])
        median = round(statistics.median(ratios), 3) if ratios else None
        rows[n] = {"pairs": pairs[n], "ratio_median": median, "ratios": ratios,
                   "engine_tokens_per_s_median": statistics.median(p["engine"]["tokens_per_s"] for p in pairs[n]),
                   "pipeline_tokens_per_s_median": statistics.median(p["pipeline"]["tokens_per_s"] for p in pairs[n]),
                   "completion_rate": round(sum(p["pipeline"]["samples"] for p in pairs[n]) / asked, 4)
                   if asked else None,
                   "met": median is not None and median >= RATIO_TARGET}
        console.print(f"n = {n}: engine {rows[n]['engine_tokens_per_s_median']} tok/s, pipeline "
                      f"{rows[n]['pipeline_tokens_per_s_median']} tok/s (medians of {len(ratios)}); ratio median "
                      f"{median} (pairs {ratios}, target {RATIO_TARGET}), completion {rows[n]['completion_rate']}")
    return {"bench": "rollout", "prompts": n_prompts, "max_tokens": max_tokens, "repeat": repeat, "pin": pin,
            "pinned": pinned, "cpus": os.cpu_count(), "by_n": rows, "ratio_target": RATIO_TARGET}


def main(prompts: int = typer.Option(8, help="prompts per run"),
         n: list[int] = typer.Option([4, 8], "--n", help="samples per prompt; repeatable"),
         max_tokens: int = typer.Option(48, help="new tokens per sample"),
         repeat: int = typer.Option(3, help="(a, b) pairs per n"),
         pin: bool = typer.Option(False, "--pin", help="both vLLM engines on core 0, everything else on the others"),
         ) -> None:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    if pin:
        os.environ.update(PIN_ENV)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="llmpipe-rolloutbench-") as tmp:
        result = asyncio.run(main_async(prompts, n, max_tokens, repeat, pin, Path(tmp)))
    print_result(console, result, t0)


if __name__ == "__main__":
    typer.run(main)
