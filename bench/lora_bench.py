"""Multi-LoRA serving cost on the in-process vLLM engine (CPU build), SmolLM2-135M, in one run.

    .venv/bin/python bench/lora_bench.py            # 64 requests per phase, 8 clients, 32 new tokens
    .venv/bin/python bench/lora_bench.py --quick    # 24 requests per phase
    .venv/bin/python bench/lora_bench.py --clients 4 --requests 32   # see --help

Every phase sends the same distinct short prompts (numbered questions, greedy, max_tokens 32) from a
closed loop of C concurrent clients (each sends its next request when its previous answer is in):

1. `base, LoRA off`        a VllmEngine without LoRA, base requests: the true baseline. Then it stops.
2. `base, LoRA on, no adapter` the LoRA engine below with base-only traffic and no adapter at all
                           (what enable_lora itself costs; unsafe once adapter requests share a batch).
3. `base via zero adapter` ONE VllmEngine with LoRA on (max_loras 4, max_cpu_loras 8, rank 8); base
                           requests (adapter=None) run through its all-zero adapter: the price of the
                           mixed-batch protection (see pipeline/engines/lora_factory.zero_adapter).
4. `1 adapter`             same engine, every request on adapter a0.
5. `4 adapters`            round-robin over a0..a3.
6. `8 adapters`            round-robin over a0..a7: more than max_loras=4, so the engine swaps adapters
                           in and out of its active slots.

Adapters are made with peft (make_adapter, seed i, rank 8) in a temp dir and are NOT preloaded: a
phase that first uses an adapter pays its cold load. The first request per adapter is reported
(its TTFT includes the load) next to the phase's TTFT p50. Each engine gets a few warm-up base
requests (other prompts) before its first timed phase.

Per phase: requests, output tokens/s (generated tokens / phase wall time), e2e latency p50/p95,
TTFT p50/p95 (ms), tokens/s relative to phase 1, and `=base`: how many answers have exactly the
tokens of phase 1 for the same prompt (zero adapter: should be all; real adapters: few).
Burst fairness: 2 x max_num_seqs long requests (64 tokens) on a0, then 4 short ones (4 tokens) on
a1 0.2 s later, sent straight into the engine (vLLM's arrival-order queue) and then through
generate's FairGate (capacity max_num_seqs, generate's default token budget and reserved slots):
the short requests' latency p50/p95 in both.
Then one correctness line on the LoRA engine: 8 base prompts answered alone vs answered while 8
adapter requests run concurrently (token ids must be identical). Last line of stdout: JSON.
"""

from __future__ import annotations

import asyncio
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench._common import CpuWindow, pct, print_result  # noqa: E402

console = Console(width=None if sys.stdout.isatty() else 130)
log = Console(stderr=True)
DATA_DIR = ROOT / ".llmpipe"  # the prepared model lives here (prepare() reuses it)
N_ADAPTERS = 8
MAX_LORAS, MAX_CPU_LORAS, RANK = 4, 8, 8

SUBJECTS = [
    "a volcano", "a honeybee", "a castle", "the printing press", "a coral reef", "a glacier", "the steam engine",
    "origami", "jazz", "photosynthesis", "a violin", "a desert", "a lighthouse", "bread", "chess",
    "a hot air balloon", "tea", "a rainbow", "a submarine", "pottery", "a wind turbine", "a penguin",
    "a compass", "silk", "a tornado", "bamboo", "a telescope", "cheese", "bird migration", "an earthquake",
    "stained glass", "a sailing ship", "a mushroom", "a bicycle", "typography", "an octopus", "a piano",
    "irrigation", "glassblowing", "a thunderstorm", "an elephant", "paper money", "a microscope", "knitting",
    "cave paintings", "a windmill", "a firefly", "a railway", "an abacus", "salt", "a mechanical clock",
    "a whale", "a suspension bridge", "a kite", "olive oil", "ocean tides", "maple syrup", "a sundial",
    "puppet theatre", "a beaver", "a mosaic", "frost", "a honey badger", "lace",
]
TEMPLATES = ["Question {n}: What is {s}? Explain briefly.", "Question {n}: How does {s} work? Answer in two sentences.",
             "Question {n}: Why is {s} interesting? Give a short answer.",
             "Question {n}: Describe {s} to a child in a few sentences."]
WARMUP = ["Say hello.", "What is 2+2?", "Name three colors.", "Who wrote Hamlet?"]
CHECK = ["What is the capital of France?", "Name three colors.", "What is 2+2?", "Say hello.",
         "Who wrote Hamlet?", "What is water made of?", "Why is the sky blue?", "Count from one to five."]


def prompts_for(n: int) -> list[str]:
    return [TEMPLATES[i % len(TEMPLATES)].format(n=i + 1, s=SUBJECTS[i % len(SUBJECTS)]) for i in range(n)]


def fmt(v: float | None, nd: int = 0) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def msgs(p: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": p}]


async def closed_loop(engine, prompts: list[str], adapters: list, clients: int, max_tokens: int) -> dict[str, Any]:
    """`clients` workers each take the next request index and send it when their previous one is answered.
    Request i uses prompts[i] and adapters[i % len(adapters)] (no adapters: base, adapter=None)."""
    from pipeline.engines.chat_engine import Sampling

    sampling = Sampling(max_tokens=max_tokens, temperature=0.0)
    gens: list[Any] = [None] * len(prompts)
    nxt = iter(range(len(prompts)))

    async def client() -> None:
        for i in nxt:  # shared iterator: each index is taken once
            ad = adapters[i % len(adapters)] if adapters else None
            gens[i] = await engine.generate(msgs(prompts[i]), sampling, adapter=ad)

    cpu = CpuWindow()
    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    wall = time.perf_counter() - t0
    tokens = sum(len(g.token_ids) for g in gens)
    first: dict[str, dict[str, float]] = {}
    for i, g in enumerate(gens):
        if adapters:
            name = adapters[i % len(adapters)].name
            first.setdefault(name, {"request": i, "ttft_ms": round(g.ttft_ms, 1), "e2e_ms": round(g.e2e_ms, 1)})
    ttft = [g.ttft_ms for g in gens]
    e2e = [g.e2e_ms for g in gens]
    return {"requests": len(gens), "tokens": tokens, "wall_s": round(wall, 2),
            "tokens_per_s": round(tokens / wall, 1) if wall > 0 else None,
            "e2e_p50_ms": pct(e2e, 50), "e2e_p95_ms": pct(e2e, 95), "ttft_p50_ms": pct(ttft, 50),
            "ttft_p95_ms": pct(ttft, 95), "host_cpu": cpu.result(), "first_use": first,
            "_token_ids": [g.token_ids for g in gens]}


async def burst(engine, long_ad, short_ad, gate, n_long: int, n_short: int) -> dict[str, Any]:
    """One tenant's burst of long requests on `long_ad`, then another adapter's short requests 0.2 s
    later: straight into the engine (its arrival-order queue) or through generate's FairGate."""
    from pipeline.engines.chat_engine import Sampling

    long_s, short_s = Sampling(max_tokens=64, temperature=0.0), Sampling(max_tokens=4, temperature=0.0)

    async def one(i: int, ad, sampling, lane: str) -> float:
        t0 = time.perf_counter()
        if gate is None:
            await engine.generate(msgs(f"Tell a long story about {SUBJECTS[i % len(SUBJECTS)]}."), sampling, adapter=ad)
        else:
            async with gate.slot(lane, 40 + sampling.max_tokens):
                await engine.generate(msgs(f"Tell a long story about {SUBJECTS[i % len(SUBJECTS)]}."), sampling,
                                      adapter=ad)
        return (time.perf_counter() - t0) * 1000

    t0 = time.perf_counter()
    longs = [asyncio.create_task(one(i, long_ad, long_s, long_ad.name)) for i in range(n_long)]
    await asyncio.sleep(0.2)
    shorts = await asyncio.gather(*(one(100 + i, short_ad, short_s, short_ad.name) for i in range(n_short)))
    long_ms = await asyncio.gather(*longs)
    return {"short_p50_ms": pct(list(shorts), 50), "short_p95_ms": pct(list(shorts), 95),
            "long_p50_ms": pct(list(long_ms), 50), "wall_s": round(time.perf_counter() - t0, 2)}


async def main_async(n: int, clients: int, max_tokens: int, tmp: Path) -> dict[str, Any]:
    from pipeline.config.lora import LoraSettings
    from pipeline.config.settings import load_settings
    from pipeline.contracts.adapter import AdapterSpec
    from pipeline.engines.chat_engine import Sampling
    from pipeline.engines.lora_factory import make_adapter
    from pipeline.engines.model_prep import prepare
    from pipeline.engines.vllm_engine import VllmEngine
    from pipeline.registries.adapters import adapter_digest

    es = load_settings().engine  # the engine settings the stack's generate stage uses
    info = await asyncio.to_thread(prepare, DATA_DIR, es.dtype)
    model = Path(info.path)
    log.print(f"model {info.revision} ({'reused' if info.reused else 'prepared'}); making {N_ADAPTERS} adapters")
    root = tmp / "adapters"
    t0 = time.perf_counter()
    specs = []
    for i in range(N_ADAPTERS):
        path = await asyncio.to_thread(make_adapter, model, root / f"a{i}", seed=i, rank=RANK)
        specs.append(AdapterSpec(name=f"a{i}", revision="r1", path=path, sha256=adapter_digest(path), rank=RANK,
                                 tenants=["*"]))
    make_s = time.perf_counter() - t0
    prompts = prompts_for(n)
    kw = dict(revision=info.revision, cache_dir=tmp / "cache", dtype=es.dtype, max_model_len=es.max_model_len,
              max_num_seqs=es.max_num_seqs)
    phases: dict[str, dict[str, Any]] = {}
    startup: dict[str, float] = {}

    async def warm(e) -> None:
        await asyncio.gather(*(e.generate(msgs(p), Sampling(max_tokens=max_tokens, temperature=0.0)) for p in WARMUP))

    # 1. the baseline: no LoRA at all
    log.print(f"adapters made in {make_s:.0f} s; starting engine without LoRA")
    t0 = time.perf_counter()
    e = await VllmEngine(model, **kw).start()
    startup["lora_off"] = round(time.perf_counter() - t0, 1)
    try:
        await warm(e)
        log.print("phase: base, LoRA off")
        phases["base, LoRA off"] = await closed_loop(e, prompts, [], clients, max_tokens)
    finally:
        await e.stop()
    await asyncio.sleep(2)  # let the engine core process go

    # 2.-5. one engine with LoRA on
    lora = LoraSettings(enabled=True, max_loras=MAX_LORAS, max_cpu_loras=MAX_CPU_LORAS, max_lora_rank=RANK,
                        allowed_roots=[root])
    log.print("starting engine with LoRA")
    t0 = time.perf_counter()
    e = await VllmEngine(model, **kw, lora=lora, adapters_dir=tmp / "zero").start()
    startup["lora_on"] = round(time.perf_counter() - t0, 1)
    try:
        await warm(e)  # base requests only: no adapter is loaded before its phase
        # base-only traffic without the zero adapter (safe only while no adapter request is in the
        # batch): separates what enable_lora itself costs from what the protection adds
        zero, e._zero = e._zero, None
        log.print("phase: base, LoRA on, no adapter")
        phases["base, LoRA on, no adapter"] = await closed_loop(e, prompts, [], clients, max_tokens)
        e._zero = zero
        for name, k in (("base via zero adapter", 0), ("1 adapter", 1), ("4 adapters", 4), ("8 adapters", 8)):
            log.print(f"phase: {name}")
            phases[name] = await closed_loop(e, prompts, specs[:k], clients, max_tokens)
        # fairness: a burst on one adapter vs another adapter's short requests, FIFO vs the fair gate
        from pipeline.stages.generate.config import GeneratePolicy
        from pipeline.stages.generate.fair_gate import FairGate

        gp = GeneratePolicy()  # generate's defaults for a LoRA deployment

        log.print("phase: burst fairness")
        n_long = 2 * es.max_num_seqs
        fairness = {"fifo": await burst(e, specs[0], specs[1], None, n_long, 4),
                    "fair gate": await burst(e, specs[0], specs[1], FairGate(
                        es.max_num_seqs, gp.adapter_token_budget, reserve=gp.adapter_reserve_slots), n_long, 4)}
        # correctness: base rows alone vs base rows mixed with adapter rows in the same batches
        s = Sampling(max_tokens=max_tokens, temperature=0.0)
        alone = await asyncio.gather(*(e.generate(msgs(p), s) for p in CHECK))
        mixed = await asyncio.gather(*(e.generate(msgs(p), s) for p in CHECK),
                                     *(e.generate(msgs(p), s, adapter=specs[i % N_ADAPTERS]) for i, p in enumerate(CHECK)))
    finally:
        await e.stop()
    base_mixed, adapter_rows = mixed[:len(CHECK)], mixed[len(CHECK):]
    identical = sum(a.token_ids == b.token_ids for a, b in zip(alone, base_mixed))
    adapter_differs = sum(a.token_ids != b.token_ids for a, b in zip(alone, adapter_rows))

    ref = phases["base, LoRA off"]["_token_ids"]
    base_tps = phases["base, LoRA off"]["tokens_per_s"]
    for r in phases.values():
        r["same_as_base"] = sum(x == y for x, y in zip(r.pop("_token_ids"), ref))
        r["ratio"] = round(r["tokens_per_s"] / base_tps, 3) if base_tps and r["tokens_per_s"] else None

    t = Table(title=f"Multi-LoRA on vLLM CPU: {n} requests/phase, {clients} closed-loop clients, "
                    f"max_tokens {max_tokens}, greedy (max_loras {MAX_LORAS}, max_cpu_loras {MAX_CPU_LORAS}, rank {RANK})")
    for col in ("phase", "requests", "tokens", "wall s", "tokens/s", "e2e p50", "e2e p95", "TTFT p50", "TTFT p95",
                "vs LoRA off", "=base", "cpu/steal%"):
        t.add_column(col, justify="left" if col == "phase" else "right")
    for name, r in phases.items():
        t.add_row(name, str(r["requests"]), str(r["tokens"]), fmt(r["wall_s"], 2), fmt(r["tokens_per_s"], 1),
                  fmt(r["e2e_p50_ms"]), fmt(r["e2e_p95_ms"]), fmt(r["ttft_p50_ms"]), fmt(r["ttft_p95_ms"]),
                  fmt(r["ratio"], 2), f"{r['same_as_base']}/{r['requests']}",
                  f"{fmt(r['host_cpu']['busy_pct'])}/{fmt(r['host_cpu']['steal_pct'])}")
    t.caption = ("ms; e2e and TTFT per request from the engine call; tokens/s = generated tokens / phase wall time; "
                 "=base: answers with the same tokens as `base, LoRA off`. Engine startup: LoRA off "
                 f"{startup['lora_off']} s, LoRA on {startup['lora_on']} s; adapters made in {make_s:.1f} s")
    console.print(t)

    ft = Table(title="First request per adapter (cold: its TTFT includes loading the adapter)")
    for col in ("adapter", "first used in", "request #", "TTFT ms", "e2e ms", "phase TTFT p50", "TTFT - p50"):
        ft.add_column(col, justify="left" if col in ("adapter", "first used in") else "right")
    first_loads: dict[str, Any] = {}
    for name, r in phases.items():
        for ad, f in r["first_use"].items():
            if ad in first_loads:
                continue
            first_loads[ad] = {"phase": name, **f, "extra_over_p50_ms": round(f["ttft_ms"] - r["ttft_p50_ms"], 1)}
            ft.add_row(ad, name, str(f["request"]), fmt(f["ttft_ms"]), fmt(f["e2e_ms"]), fmt(r["ttft_p50_ms"]),
                       fmt(first_loads[ad]["extra_over_p50_ms"]))
    console.print(ft)
    bt = Table(title=f"Burst fairness: {2 * es.max_num_seqs} long requests (64 tokens) on a0, then 4 short "
                     "ones (4 tokens) on a1 0.2 s later")
    for col in ("admission", "short p50 ms", "short p95 ms", "long p50 ms", "wall s"):
        bt.add_column(col, justify="left" if col == "admission" else "right")
    for name, r in fairness.items():
        bt.add_row(name, fmt(r["short_p50_ms"]), fmt(r["short_p95_ms"]), fmt(r["long_p50_ms"]), fmt(r["wall_s"], 2))
    console.print(bt)
    console.print(f"base rows identical under mixed traffic: {identical}/{len(CHECK)}")
    console.print(f"(adapter rows differing from base on the same prompts: {adapter_differs}/{len(CHECK)})")
    for r in phases.values():
        r.pop("first_use")
    return {"bench": "lora", "host": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "model": info.revision, "requests": n, "clients": clients, "max_tokens": max_tokens,
            "lora": {"max_loras": MAX_LORAS, "max_cpu_loras": MAX_CPU_LORAS, "rank": RANK, "adapters": N_ADAPTERS},
            "engine": {"dtype": es.dtype, "max_num_seqs": es.max_num_seqs}, "startup_s": startup,
            "adapters_made_s": round(make_s, 1), "phases": phases, "first_loads": first_loads, "burst_fairness": fairness,
            "base_identical_under_mixed": identical, "adapter_rows_differ": adapter_differs, "check_prompts": len(CHECK)}


app = typer.Typer(add_completion=False)


@app.command()
def main(
    quick: bool = typer.Option(False, "--quick", help="24 requests per phase"),
    requests: int = typer.Option(None, help=f"requests per phase (default 64, quick 24; max {len(SUBJECTS) * 4})"),
    clients: int = typer.Option(8, help="concurrent closed-loop clients"),
    max_tokens: int = typer.Option(32, help="new tokens per request"),
) -> None:
    """Tokens/s and latency of base vs 0/1/4/8 LoRA adapters on one vLLM engine, against a LoRA-off engine."""
    n = requests if requests is not None else (24 if quick else 64)
    if not 1 <= n <= len(SUBJECTS) * 4 or clients < 1 or max_tokens < 1:
        raise typer.BadParameter("requests 1..256, clients >= 1, max_tokens >= 1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    t0 = time.perf_counter()
    tmp = tempfile.mkdtemp(prefix="llmpipe-lorabench-")
    try:
        result = asyncio.run(main_async(n, clients, max_tokens, Path(tmp)))
    finally:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    print_result(console, result, t0)


if __name__ == "__main__":
    app()
