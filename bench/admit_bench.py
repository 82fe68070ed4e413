"""admit benchmarks: decisions/s of one worker, and the admit hop's added latency at 500 req/s.

    .venv/bin/python bench/admit_bench.py            # full: 20,000 decisions, 5,000 records, 500 req/s x 10 s
    .venv/bin/python bench/admit_bench.py --quick    # 5,000 decisions, 2,000 records, 500 req/s x 4 s

1. decisions (no broker): AdmitStage.process on 10 metered tenants (RPM/TPM/concurrency/budget,
   a deployment with a global limit), building its changelog records; the prompt tokenization
   alone side by side; then settlements (AdmitRelease) per second.
2. worker: N records pre-published to `stage.admit` (keyed by tenant), one admit worker started;
   records/s from partition assignment until the N-th is forwarded (outputs and changelog acked).
3. hop latency: pre (Relay) -> X -> answer (Answer), X = admit or a Relay, each stage worker its
   own process, paced at --rate req/s, side by side in one run. Added latency of hop X =
   Response.timings[X].queue_ms + service_ms (record timestamp -> decided).

Targets (issue 5): >= 5,000 decisions/s per worker; admit hop p99 added <= 10 ms at 500 req/s.
Prints rich tables, then one JSON line (the last line of stdout).
"""

from __future__ import annotations

import asyncio
import logging
import os
import platform
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import typer  # noqa: E402
from aiokafka import AIOKafkaProducer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench._common import CpuWindow, pct, print_result  # noqa: E402
from bench.runtime_bench import WorkerProc, create_topics, fmt, paced, run_worker_until  # noqa: E402
from pipeline.app.assemble import topology_for  # noqa: E402
from pipeline.app.launch import stage_worker  # noqa: E402
from pipeline.config.settings import Settings  # noqa: E402
from pipeline.contracts import AdmitRelease, ReplyTo, RequestDoc  # noqa: E402
from pipeline.contracts.base import now_ms  # noqa: E402
from pipeline.contracts.request import ChatBody, ChatMessage  # noqa: E402
from pipeline.engines.chat_engine import chat_prompt_ids  # noqa: E402
from pipeline.engines.model_prep import prepare  # noqa: E402
from pipeline.runtime.broker.embedded import EmbeddedBroker  # noqa: E402
from pipeline.runtime.codec import encode, request_headers  # noqa: E402
from pipeline.runtime.topics import TopicNames  # noqa: E402

DECISIONS_TARGET = 5_000.0
P99_TARGET_MS = 10.0
TENANTS = [f"t{i}" for i in range(10)]
console = Console()


def settings(data_dir: Path, model_dir: Path, prefix: str = "llmpipe.", bootstrap: str | None = None,
             stages: list[dict[str, Any]] | None = None) -> Settings:
    limits = {"rpm": 10_000_000, "tpm": 10_000_000_000, "concurrency": 1_000_000, "daily_budget_usd": 1e9,
              "monthly_budget_usd": 1e9}
    return Settings(data_dir=data_dir, topic_prefix=prefix, bootstrap=bootstrap, stages=stages or [{"name": "admit"}],
                    engine={"model_dir": model_dir},
                    tenants=[{"name": t, "limits": limits} for t in TENANTS],
                    deployments=[{"name": "edge", "cost_per_1k_input": 0.1, "cost_per_1k_output": 0.2,
                                  "limits": {"rpm": 60_000_000, "concurrency": 6_000_000}},
                                 {"name": "cloud", "cost_per_1k_input": 0.5, "cost_per_1k_output": 1.5}])


def docs_for(n: int, prefix: str = "llmpipe.") -> list[RequestDoc]:
    reply = ReplyTo(topic=TopicNames(prefix).responses, partition=0)
    created = now_ms()
    return [RequestDoc(request_id=uuid.uuid4().hex, tenant_id=TENANTS[i % len(TENANTS)], created_ms=created,
                       deadline_ms=created + 3_600_000, reply_to=reply,
                       body=ChatBody(messages=[ChatMessage(role="user", content=f"admission benchmark request {i}: "
                                                                                "summarise my last three invoices")],
                                     max_tokens=64))
            for i in range(n)]


# ---- 1. decisions without a broker -------------------------------------------------------------


async def decisions_bench(data_dir: Path, model_dir: Path, n: int) -> dict[str, Any]:
    s = settings(data_dir, model_dir)
    stage = topology_for(s).build("admit", bootstrap="")
    await stage.start()
    docs = docs_for(n)
    tok = stage.tokenizer
    for d in docs[:200]:  # warm-up (tokenizer caches, allocator)
        chat_prompt_ids(tok, [{"role": m.role, "content": m.content} for m in d.body.messages])
    t0 = time.perf_counter()
    for d in docs:
        chat_prompt_ids(tok, [{"role": m.role, "content": m.content} for m in d.body.messages])
    tokenize_s = time.perf_counter() - t0
    lat: list[float] = []
    admitted = []
    t0 = time.perf_counter()
    for d in docs:
        t1 = time.perf_counter()
        out = await stage.process(d)
        lat.append((time.perf_counter() - t1) * 1e6)
        if out.response is None:
            admitted.append(out.doc)
    decide_s = time.perf_counter() - t0
    side = sum(1 for _ in admitted)
    t0 = time.perf_counter()
    for d in admitted:
        await stage.on_side_input("admit.release", AdmitRelease(request_id=d.request_id, tenant_id=d.tenant_id or "",
                                                                status="ok", tokens_in=20, tokens_out=30,
                                                                cost_usd=0.0001, answered_by="bench"))
    settle_s = time.perf_counter() - t0
    await stage.stop()
    per_s = n / decide_s
    return {"decisions": n, "admitted": side, "decisions_per_s": round(per_s, 1),
            "ratio_to_target": round(per_s / DECISIONS_TARGET, 2),
            "decision_p50_us": pct(lat, 50), "decision_p99_us": pct(lat, 99),
            "tokenize_only_per_s": round(n / tokenize_s, 1),
            "policy_share_of_time": round(max(0.0, decide_s - tokenize_s) / decide_s, 2),
            "settlements_per_s": round(len(admitted) / settle_s, 1) if admitted else None}


# ---- 2. one worker through the broker ----------------------------------------------------------


async def worker_bench(broker: EmbeddedBroker, tmp: Path, model_dir: Path, n: int, timeout_s: float,
                       concurrency: int = 64) -> dict[str, Any]:
    prefix = f"bench{uuid.uuid4().hex[:8]}."
    names = TopicNames(prefix)
    s = settings(tmp, model_dir, prefix, broker.bootstrap,
                 [{"name": "admit", "runtime": {"concurrency": concurrency}},
                  {"name": "answer", "class": "tests.stages:Answer"}])
    await create_topics(s)
    docs = docs_for(n, prefix)
    p = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=5, max_batch_size=256 << 10)
    await p.start()
    try:
        futs = [await p.send(names.stage_input("admit"), encode(d), key=(d.tenant_id or "").encode(),
                             headers=request_headers(d.request_id, d.tenant_id, d.deadline_ms, d.attempt, None))
                for d in docs]
        await asyncio.gather(*futs)
    finally:
        await p.stop()
    parts = topology_for(s).topic_registry()["stage.answer"].partitions
    r = await run_worker_until(stage_worker(s, topology_for(s), "admit", broker.bootstrap), broker.bootstrap,
                               names.stage_input("answer"), parts, n, timeout_s)
    span = r.t_done - r.t_assigned
    rate = r.seen / span if span > 0 else 0.0
    return {"concurrency": concurrency, "records": n, "forwarded": r.seen, "complete": r.seen >= n,
            "process_s": round(span, 2), "records_per_s": round(rate, 1),
            "ratio_to_target": round(rate / DECISIONS_TARGET, 2), "host_cpu": r.cpu}


# ---- 3. hop latency, admit vs a relay ----------------------------------------------------------


async def hop_bench(broker: EmbeddedBroker, tmp: Path, model_dir: Path, hop: str, rate: float, duration_s: float,
                    warmup_s: float) -> dict[str, Any]:
    from pipeline.ingress.client import Client

    prefix = f"bench{uuid.uuid4().hex[:8]}."
    d = tmp / f"hop-{hop}"
    d.mkdir(exist_ok=True)
    middle = {"name": "admit"} if hop == "admit" else {"name": "relay", "class": "tests.stages:Relay"}
    stages = [{"name": "pre", "class": "tests.stages:Relay"}, middle, {"name": "answer", "class": "tests.stages:Answer"}]
    s = settings(d, model_dir, prefix, broker.bootstrap, stages)
    await create_topics(s)
    procs = [WorkerProc(st["name"], s, d / f"{st['name']}.log") for st in stages]
    try:
        async with Client(broker.bootstrap, topic_prefix=prefix) as client:
            def build(i: int) -> RequestDoc:
                return client.build(body=ChatBody(messages=[ChatMessage(role="user", content=f"hop latency {i}")],
                                                  max_tokens=32), tenant_id=TENANTS[i % len(TENANTS)], timeout_s=60)

            first = build(0)
            await client.wait(first.request_id, await client.submit(first), 180)  # every group joined
            await paced(client, rate, warmup_s, build)
            cpu = CpuWindow()
            samples, sent, achieved, timeouts = await paced(client, rate, duration_s, build)
            cpu_use = cpu.result()
    finally:
        for p in procs:
            p.stop()
    name = middle["name"]
    added = [t[name]["queue_ms"] + t[name]["service_ms"] for t in samples if name in t]
    return {"hop": hop, "rate_target": rate, "rate_achieved": round(achieved, 1), "sent": sent,
            "answered": len(samples), "timeouts": timeouts, "host_cpu": cpu_use,
            "added_p50_ms": pct(added, 50), "added_p95_ms": pct(added, 95), "added_p99_ms": pct(added, 99),
            "service_p50_ms": pct([t[name]["service_ms"] for t in samples if name in t], 50),
            "e2e_p50_ms": pct([t["_e2e_ms"] for t in samples], 50), "e2e_p99_ms": pct([t["_e2e_ms"] for t in samples], 99)}


# ---- report -----------------------------------------------------------------------------------


async def main_async(n_decisions: int, n_records: int, rate: float, duration: float, warmup: float) -> dict[str, Any]:
    out: dict[str, Any] = {"bench": "admit", "host": {"cpus": os.cpu_count(), "python": platform.python_version()}}
    data_dir = ROOT / ".llmpipe"
    model_dir = Path((await asyncio.to_thread(prepare, data_dir)).path)
    with tempfile.TemporaryDirectory(prefix="llmpipe-bench-") as d:
        tmp = Path(d)
        dec = await decisions_bench(tmp, model_dir, n_decisions)
        out["decisions"] = dec
        t = Table(title=f"1. admission decisions, one stage, no broker ({n_decisions:,} requests, 10 metered tenants)")
        for col in ("decisions/s", "/5,000", "p50 µs", "p99 µs", "tokenize-only/s", "policy share", "settle/s"):
            t.add_column(col, justify="right")
        t.add_row(fmt(dec["decisions_per_s"], 0), fmt(dec["ratio_to_target"], 2), fmt(dec["decision_p50_us"], 0),
                  fmt(dec["decision_p99_us"], 0), fmt(dec["tokenize_only_per_s"], 0), fmt(dec["policy_share_of_time"], 2),
                  fmt(dec["settlements_per_s"], 0))
        console.print(t)
        kafka_log = logging.getLogger("aiokafka")
        kafka_log.setLevel(logging.CRITICAL)
        broker = await EmbeddedBroker(tmp / "broker").start()
        kafka_log.setLevel(logging.WARNING)
        try:
            w = await worker_bench(broker, tmp, model_dir, n_records, timeout_s=max(120.0, n_records / 20))
            out["worker"] = w
            t = Table(title=f"2. one admit worker on the broker ({n_records:,} pre-published records, concurrency 64)")
            for col in ("records/s", "/5,000", "forwarded", "seconds", "cpu/steal %"):
                t.add_column(col, justify="right")
            t.add_row(fmt(w["records_per_s"], 0), fmt(w["ratio_to_target"], 2), f"{w['forwarded']:,}",
                      fmt(w["process_s"], 2), f"{fmt(w['host_cpu']['busy_pct'], 0)}/{fmt(w['host_cpu']['steal_pct'], 0)}")
            console.print(t)
            hops = [await hop_bench(broker, tmp, model_dir, h, rate, duration, warmup) for h in ("relay", "admit")]
            out["hops"] = hops
            t = Table(title=f"3. added latency of one hop, pre -> X -> answer, {rate:.0f} req/s x {duration:.0f} s "
                            "(worker processes)")
            for col in ("X", "sent/s", "answered", "p50 ms", "p95 ms", "p99 ms", "p99/10ms", "svc p50", "e2e p99", "cpu %"):
                t.add_column(col, justify="right")
            for h in hops:
                t.add_row(h["hop"], fmt(h["rate_achieved"], 0), f"{h['answered']}/{h['sent']}", fmt(h["added_p50_ms"]),
                          fmt(h["added_p95_ms"]), fmt(h["added_p99_ms"]),
                          fmt(None if h["added_p99_ms"] is None else h["added_p99_ms"] / P99_TARGET_MS, 2),
                          fmt(h["service_p50_ms"]), fmt(h["e2e_p99_ms"]), fmt(h["host_cpu"]["busy_pct"], 0))
            console.print(t)
        finally:
            broker.stop()
    return out


app = typer.Typer(add_completion=False)


@app.command()
def main(quick: bool = typer.Option(False, "--quick"),
         rate: float = typer.Option(500.0, help="hop latency: offered requests per second"),
         duration: float = typer.Option(None, help="hop latency: measured seconds (default 10, quick 4)")) -> None:
    """Admission decisions/s and the admit hop's added latency."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    t0 = time.perf_counter()
    result = asyncio.run(main_async(5_000 if quick else 20_000, 2_000 if quick else 5_000, rate,
                                    duration if duration is not None else (4.0 if quick else 10.0), 1.0 if quick else 2.0))
    print_result(console, result, t0)


if __name__ == "__main__":
    app()
