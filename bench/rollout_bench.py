"""Rollout throughput: n samples per prompt straight from the vLLM engine vs as `rollout` requests
through the whole pipeline (generated tokens/s, sample completion rate), at n = 4 and 8.

    .venv/bin/python bench/rollout_bench.py --pin             # 8 prompts, n = 4 and 8, 48 tokens (~12 min)
    .venv/bin/python bench/rollout_bench.py --pin --n 4 --prompts 4 --max-tokens 32   # a quick look

(a) engine: a VllmEngine in this process (the stack's engine settings); every sample of every prompt
    submitted at once (seed + i for sample i, temperature 1, logprobs on, as generate samples them).
(b) pipeline: `llmpipe up --detach --processes`; every prompt as one `rollout` request with n samples
    (mask -> cache (bypassed: rollouts are never cached) -> route -> admit -> generate, which samples
    the n side by side and scores them -> postprocess), submitted at once; the answers carry the samples.

tokens/s = generated tokens / (first submit -> last answer); completion rate = samples that came back
÷ samples asked for. --pin: vLLM's engine core alone on core 0 in both modes (bench/generate_bench.py
explains why). Target (issue 21): (b) tokens/s ≥ 0.9 × (a) at each n. Prints a table and one JSON line.
"""

from __future__ import annotations

import asyncio
import os
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


async def engine_samples(data_dir: Path, prompts: list[str], n: int, max_tokens: int, pin: bool) -> dict[str, Any]:
    from pipeline.config.settings import load_settings
    from pipeline.engines.chat_engine import Sampling
    from pipeline.engines.model_prep import prepare
    from pipeline.engines.vllm_engine import VllmEngine

    es = load_settings().engine
    info = await asyncio.to_thread(prepare, data_dir, es.dtype)
    e = await VllmEngine(Path(info.path), revision=info.revision, cache_dir=data_dir / "cache", dtype=es.dtype,
                         max_model_len=es.max_model_len, max_num_seqs=es.max_num_seqs).start()
    base = Sampling(max_tokens=max_tokens, temperature=1.0, seed=7, logprobs=True)
    try:
        if pin:
            pin_split([os.getpid()])
        await asyncio.gather(*(e.generate([{"role": "user", "content": "Say hello."}], replace(base, seed=i))
                               for i in range(2)))
        t0 = time.perf_counter()
        gens = await asyncio.gather(*(e.generate([{"role": "user", "content": p}], replace(base, seed=7 + i),
                                                 f"{k}:{i}") for k, p in enumerate(prompts) for i in range(n)))
        wall = time.perf_counter() - t0
    finally:
        await e.stop()
    tokens = sum(len(g.token_ids) for g in gens)
    return {"samples": len(gens), "requested": len(prompts) * n, "tokens": tokens, "wall_s": round(wall, 2),
            "tokens_per_s": round(tokens / wall, 1)}


async def pipeline_samples(data_dir: Path, prompts: list[str], ns: list[int], max_tokens: int,
                           pin: bool) -> dict[int, dict[str, Any]]:
    import json

    from pipeline.contracts.request import ChatBody, ChatMessage, RolloutRequest
    from pipeline.dev_key import read_dev_key
    from pipeline.ingress.client import Client

    up = await asyncio.to_thread(cli, "up", "--detach", "--processes", "--json", data_dir=data_dir, timeout=900,
                                 env=PIN_ENV if pin else {})
    if up.returncode != 0:
        raise RuntimeError(f"llmpipe up failed: {up.stderr.strip()[-1500:]}")
    stack = json.loads((data_dir / "stack.json").read_text())
    key = read_dev_key(data_dir)
    out: dict[int, dict[str, Any]] = {}
    try:
        if pin:
            pin_split([int(p) for p in stack["pids"].values()])
        async with Client(stack["bootstrap"], topic_prefix=stack["topic_prefix"]) as c:

            async def run(ps: list[str], n: int, tag: str) -> tuple[list, float]:
                docs = [c.build(body=ChatBody(messages=[ChatMessage(role="user", content=p)], max_tokens=max_tokens,
                                              temperature=1.0, seed=7, logprobs=True), timeout_s=900, api_key=key,
                                rollout=RolloutRequest(group_id=f"bench:{tag}:{k}", n=n))
                        for k, p in enumerate(ps)]
                t0 = time.perf_counter()
                futs = await c.submit_many(docs)
                resps = await asyncio.gather(*(c.wait(d.request_id, f, 900) for d, f in zip(docs, futs)))
                return resps, time.perf_counter() - t0

            await run(["Say hello."], 2, "warm")
            for n in ns:
                log.print(f"(b) n = {n}: {len(prompts)} rollout requests")
                resps, wall = await run(prompts, n, f"n{n}")
                samples = [s for r in resps for s in r.samples]
                tokens = sum(s.tokens_out for s in samples)
                out[n] = {"samples": len(samples), "requested": len(prompts) * n, "tokens": tokens,
                          "wall_s": round(wall, 2), "tokens_per_s": round(tokens / wall, 1),
                          "status": sorted({r.status.value for r in resps})}
    finally:
        await asyncio.to_thread(cli, "down", data_dir=data_dir, timeout=300)
    return out


async def main_async(n_prompts: int, ns: list[int], max_tokens: int, pin: bool, data_dir: Path) -> dict[str, Any]:
    prompts = prompts_for(TOPICS[:n_prompts])
    engine = {}
    for n in ns:
        log.print(f"(a) engine, n = {n}")
        engine[n] = await engine_samples(data_dir, prompts, n, max_tokens, pin)
        await asyncio.sleep(2)
    pipeline = await pipeline_samples(data_dir, prompts, ns, max_tokens, pin)
    rows = {}
    for n in ns:
        a, b = engine[n], pipeline[n]
        ratio = round(b["tokens_per_s"] / a["tokens_per_s"], 3) if a["tokens_per_s"] else None
        rows[n] = {"engine": a, "pipeline": b, "ratio": ratio,
                   "completion_rate": round(b["samples"] / b["requested"], 4) if b["requested"] else None,
                   "met": ratio is not None and ratio >= RATIO_TARGET}
        console.print(f"n = {n}: engine {a['tokens_per_s']} tok/s, pipeline {b['tokens_per_s']} tok/s "
                      f"(ratio {ratio}, target {RATIO_TARGET}), completion {rows[n]['completion_rate']}")
    return {"bench": "rollout", "prompts": n_prompts, "max_tokens": max_tokens, "pin": pin, "cpus": os.cpu_count(),
            "by_n": rows, "ratio_target": RATIO_TARGET}


def main(prompts: int = typer.Option(8, help="prompts per run"),
         n: list[int] = typer.Option([4, 8], "--n", help="samples per prompt; repeatable"),
         max_tokens: int = typer.Option(48, help="new tokens per sample"),
         pin: bool = typer.Option(False, "--pin", help="vLLM's engine core alone on core 0 in both modes")) -> None:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    if pin:
        os.environ.update(PIN_ENV)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="llmpipe-rolloutbench-") as tmp:
        result = asyncio.run(main_async(prompts, n, max_tokens, pin, Path(tmp)))
    print_result(console, result, t0)


if __name__ == "__main__":
    typer.run(main)
