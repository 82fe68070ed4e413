"""llmpipe against LiteLLM proxy, same mock upstream, same open-loop traffic, one run.

    .venv/bin/python bench/peer_bench.py            # rates 10, 20, 40, 80 req/s, 20 s each (~12 min)
    .venv/bin/python bench/peer_bench.py --quick    # rates 10, 40, 6 s each (~6 min)
    .venv/bin/python bench/peer_bench.py --systems direct,gateway --rates 40   # one comparison
    .venv/bin/python bench/peer_bench.py --systems direct,gateway --stack-env LLMPIPE_CONSUMER__FETCH_MAX_WAIT_MS=10

Systems, one after another, each against the same instant upstream (bench/mock_upstream.py, its
own process):
  direct   the load generator talks to the mock: the floor every other latency is measured from;
  litellm  LiteLLM proxy (pinned below), one worker, master key, no database, installed by this
           bench into .bench/litellm (never into .venv, never imported by llmpipe);
  gateway  `llmpipe up --processes` with the topology generate, postprocess and an `engine: openai`
           deployment on the mock, called through its OpenAI-compatible front door;
  product  the same with mask, cache, route, admit, generate, postprocess.
           Both run the default chains (docs/design.md, "Stage chains"): gateway is one chain,
           product is mask+cache, route, admit, generate+postprocess.
  gateway-unchained, product-unchained  the same with every stage in its own worker group
           (`chain: false`): one broker crossing per stage, the layout before chains.

For each system and rate, after a warm-up: requests are sent open-loop (one every 1/rate s, each
with a distinct prompt, so every llmpipe request misses the cache), each answer is timed from send
to the last byte. Printed per rate: added latency p50/p99 (the system's minus direct's at the same
rate), CPU ms per answered request of the system's whole process tree (for llmpipe: supervisor with
the front door, broker, sink and every worker), whether it kept up, and for llmpipe the CPU split
per process. Ratios to LiteLLM come first. The mock's own CPU is shown apart and charged to nobody.
The last line of stdout is one JSON document.

Targets (issue 18): gateway CPU/request <= 0.5x LiteLLM's at 40 req/s, added p50 <= LiteLLM's and
p99 <= 2x; product keeps up with 80 req/s, CPU/request <= 2x LiteLLM's, added p50 <= 40 ms at 20 req/s.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import psutil  # noqa: E402
import typer  # noqa: E402
import yaml  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench._common import CpuWindow, cpu_by_owner, pct, print_result, proc_ticks  # noqa: E402

LITELLM = "litellm[proxy]==1.106.12"  # 1.107.0 was a compromised release: never move to it
LITELLM_VENV = ROOT / ".bench" / "litellm"
TOPOLOGIES = {"gateway": ["generate", "postprocess"],
              "product": ["mask", "cache", "route", "admit", "generate", "postprocess"],
              "full": ["mask", "cache", "route", "admit", "media", "vision", "generate", "postprocess"]}
console = Console(width=None if sys.stdout.isatty() else 140)
log = Console(stderr=True)


def free_port() -> int:
    from pipeline.runtime.broker.embedded import free_port as fp

    return fp()


async def wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{url}: the process exited with {proc.returncode}")
            try:
                async with s.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
                    if r.status < 500:
                        return
            except (TimeoutError, aiohttp.ClientError):
                pass
            await asyncio.sleep(0.3)
    raise RuntimeError(f"{url} not up within {timeout:.0f}s")


def stop_tree(proc: subprocess.Popen, timeout: float = 30) -> None:
    if proc.poll() is not None:
        return
    kids = psutil.Process(proc.pid).children(recursive=True)
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for k in kids:
        try:
            k.kill()
        except psutil.Error:
            pass


# ---- the systems --------------------------------------------------------------------------------

@dataclass
class System:
    """Where the load goes, and which processes its CPU is counted over."""

    name: str
    url: str
    headers: dict[str, str]
    roots: dict[str, int]  # owner name -> root pid (its children count as the owner)
    model: str = "mock"
    notes: dict[str, Any] = field(default_factory=dict)
    data_dir: Path | None = None  # an llmpipe stack's: stack.json names its processes now


def stack_roots(data_dir: Path) -> dict[str, int]:
    """An llmpipe stack's processes as stack.json names them now (a rolled or restarted broker is new)."""
    stack = json.loads((data_dir / "stack.json").read_text())
    roots = {k.split(":")[-1]: int(p) for k, p in stack["pids"].items()}
    roots["front door + supervisor"] = roots.pop("supervisor")
    return roots


def ensure_litellm() -> Path:
    """LiteLLM in its own virtual environment (installed once; the bench never imports it)."""
    exe = LITELLM_VENV / "bin" / "litellm"
    marker = LITELLM_VENV / "installed.txt"
    if exe.exists() and marker.exists() and marker.read_text().strip() == LITELLM:
        return exe
    log.print(f"installing {LITELLM} into {LITELLM_VENV.relative_to(ROOT)} (once)")
    shutil.rmtree(LITELLM_VENV, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(LITELLM_VENV)], check=True)
    subprocess.run([str(LITELLM_VENV / "bin" / "pip"), "install", "-q", LITELLM], check=True)
    marker.write_text(LITELLM + "\n")
    return exe


@asynccontextmanager
async def litellm(upstream: str, work: Path):
    exe = ensure_litellm()
    port, key = free_port(), "sk-bench-" + os.urandom(8).hex()
    cfg = work / "litellm.yaml"
    cfg.write_text(yaml.safe_dump({
        "model_list": [{"model_name": "mock", "litellm_params": {"model": "openai/mock", "api_base": upstream,
                                                                 "api_key": "unused"}}],
        "general_settings": {"master_key": key},
        "litellm_settings": {"telemetry": False, "drop_params": True}}))
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False",
           "NO_DOCS": "True", "LITELLM_LOG": "ERROR"}
    logf = open(work / "litellm.log", "wb")
    proc = subprocess.Popen([str(exe), "--config", str(cfg), "--host", "127.0.0.1", "--port", str(port),
                             "--num_workers", "1"], env=env, stdout=logf, stderr=subprocess.STDOUT)
    try:
        await wait_http(f"http://127.0.0.1:{port}/health/liveliness", 180, proc)
        yield System("litellm", f"http://127.0.0.1:{port}/v1/chat/completions",
                     {"Authorization": f"Bearer {key}"}, {"litellm": proc.pid}, notes={"version": LITELLM})
    finally:
        stop_tree(proc)
        logf.close()


def chained(system: str) -> list[str]:
    """The stages of the system's topology that run in the previous stage's worker."""
    from pipeline.app.assemble import topology_for
    from pipeline.config.settings import Settings

    topology = topology_for(Settings.model_validate({"stages": stage_specs(system)}))
    return [n for n in topology.order if topology.chained[n]]


def stage_specs(system: str, policies: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """`-unchained`: every stage its own group; otherwise the registry's default chains."""
    split = {"chain": False} if system.endswith("-unchained") else {}
    return [{"name": s, "policy": (policies or {}).get(s, {}), **split} for s in TOPOLOGIES[system.removesuffix("-unchained")]]


def llmpipe_config(system: str, upstream: str, key: str) -> dict[str, Any]:
    from pipeline.registries.tenants import key_hash
    from pipeline.stages.route.config import RoutePolicy

    # the shipped routes, with their deployment the mock (and no LoRA adapter: the mock serves none)
    routes = RoutePolicy().model_dump(mode="json")["routes"]
    for r in routes.values():
        r.update(deployments=["mock"], adapter=None)
    policies = {"route": {"routes": routes}}
    return {"auth": {"required": True, "dev_tenant": None},
            "tenants": [{"name": "bench", "limits": {}, "api_keys": [{"key_sha256": key_hash(key)}]}],
            "deployments": [{"name": "mock", "engine": "openai", "model": "mock", "base_url": upstream,
                             "concurrency": 256, "tools": True}],
            "stages": stage_specs(system, policies)}


@asynccontextmanager
async def llmpipe(topology: str, upstream: str, work: Path, stack_env: dict[str, str] | None = None):
    from pipeline.registries.tenants import new_api_key

    data_dir = work / f"llmpipe-{topology}"
    data_dir.mkdir()
    key = new_api_key()
    cfg = data_dir / "bench.yaml"
    cfg.write_text(yaml.safe_dump(llmpipe_config(topology, upstream, key)))

    def cli(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pipeline.cli", *args, "--data-dir", str(data_dir)], cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout, env={**os.environ, **(stack_env or {})})

    t0 = time.monotonic()
    up = await asyncio.to_thread(cli, "up", "--detach", "--processes", "--config", str(cfg), timeout=600)
    if up.returncode != 0:
        raise RuntimeError(f"llmpipe up ({topology}) failed: {up.stderr.strip()[-1500:]}")
    stack = json.loads((data_dir / "stack.json").read_text())
    try:
        yield System(topology, stack["http_url"].rstrip("/") + "/v1/chat/completions",
                     {"Authorization": f"Bearer {key}"}, stack_roots(data_dir),
                     notes={"stages": TOPOLOGIES[topology.removesuffix("-unchained")], "chained": chained(topology),
                            "up_s": round(time.monotonic() - t0, 1)}, data_dir=data_dir)
    finally:
        await asyncio.to_thread(cli, "down", timeout=300)


# ---- the load -----------------------------------------------------------------------------------

@dataclass
class Shot:
    sent: float
    done: float | None = None
    status: int | None = None
    error: str | None = None


BENCH_TOOLS: list[dict[str, Any]] = []  # --tools N: every request offers these (the same body for every system)


def bench_tools(n: int) -> list[dict[str, Any]]:
    """The first n tools of the development catalog (tests/data/TOOL_NARROWING_TRAIN.md)."""
    catalog = json.loads((ROOT / "tests" / "data" / "tools_catalog_train.json").read_text())["tools"]
    if n > len(catalog):
        raise typer.BadParameter(f"--tools at most {len(catalog)}")
    return catalog[:n]


async def offer(session: aiohttp.ClientSession, system: System, rate: float, seconds: float, tag: str,
                timeout_s: float = 60.0) -> tuple[list[Shot], float, float]:
    """Open loop: one request every 1/rate s for `seconds`; returns the shots, offered and total seconds."""
    n = max(1, int(rate * seconds))
    shots: list[Shot] = []
    tasks: list[asyncio.Task] = []

    async def one(i: int, shot: Shot) -> None:
        body = {"model": system.model, "max_tokens": 8, "temperature": 0,
                "messages": [{"role": "user", "content": f"Reply yes. ({tag} {i} {os.urandom(4).hex()})"}],
                **({"tools": BENCH_TOOLS} if BENCH_TOOLS else {})}
        try:
            async with session.post(system.url, json=body, headers=system.headers,
                                    timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                await r.read()
                shot.status = r.status
        except (TimeoutError, aiohttp.ClientError) as exc:
            shot.error = type(exc).__name__
        shot.done = time.perf_counter()

    t0 = time.perf_counter()
    for i in range(n):
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        shot = Shot(time.perf_counter())
        shots.append(shot)
        tasks.append(asyncio.create_task(one(i, shot)))
    offered = time.perf_counter() - t0
    await asyncio.gather(*tasks)
    return shots, offered, time.perf_counter() - t0


def tree_pids(roots: dict[str, int]) -> dict[int, str]:
    owners: dict[int, str] = {}
    for name, pid in roots.items():
        try:
            for p in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
                owners.setdefault(p.pid, name)
        except psutil.Error:
            continue
    return owners


def start_profiles(system: System, rate: float, seconds: float, out: Path) -> list[tuple[str, Path, subprocess.Popen]]:
    """py-spy (collapsed stacks, not pausing the target) on every Python process of an llmpipe stack."""
    runs = []
    for name, pid in system.roots.items():
        if name == "broker":  # the embedded broker is not a Python process
            continue
        path = out / f"{system.name}-{rate:g}-{name.replace(' ', '_')}.txt"
        runs.append((name, path, subprocess.Popen(
            ["py-spy", "record", "--pid", str(pid), "--duration", str(max(1, int(seconds))), "--format", "raw",
             "--rate", "200", "--nonblocking", "--output", str(path)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
    return runs


def profile_summary(path: Path, top: int = 12) -> dict[str, Any]:
    """From py-spy's collapsed stacks: the share of samples per leaf function and per module."""
    leaf: dict[str, int] = {}
    module: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        total += int(n)
        frames = stack.split(";")
        leaf[frames[-1]] = leaf.get(frames[-1], 0) + int(n)
        for mod in {f.split("(")[-1].split(":")[0].split("/site-packages/")[-1].split("/lib/python3.11/")[-1]
                    for f in frames if "(" in f}:
            module[mod] = module.get(mod, 0) + int(n)

    def share(d: dict[str, int]) -> list[tuple[str, float]]:
        return [(k, round(100 * v / total, 1)) for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:top]]

    return {"samples": total, "leaf_pct": share(leaf), "inclusive_module_pct": share(module)}


async def measure(session: aiohttp.ClientSession, system: System, rate: float, seconds: float,
                  mock_pid: int, profile_dir: Path | None = None) -> dict[str, Any]:
    owners = tree_pids(system.roots) | {mock_pid: "mock upstream"}
    profiles = start_profiles(system, rate, seconds, profile_dir) if profile_dir and system.name in TOPOLOGIES else []
    cpu, ticks0 = CpuWindow(), proc_ticks()
    shots, offered, wall = await offer(session, system, rate, seconds, f"{system.name}-{rate:g}")
    by_owner = cpu_by_owner(ticks0, proc_ticks(), owners)
    for name, path, proc in profiles:
        await asyncio.to_thread(proc.wait, 30)
        log.print(f"  profile of {name}: {path}")
    ok = [s for s in shots if s.status == 200]
    lat = [1000 * (s.done - s.sent) for s in ok if s.done is not None]
    mine = sum(v for k, v in by_owner.items() if k not in ("mock upstream", "other"))
    errors: dict[str, int] = {}
    for s in shots:
        if s.status != 200:
            k = s.error or f"http {s.status}"
            errors[k] = errors.get(k, 0) + 1
    return {"rate": rate, "sent": len(shots), "ok": len(ok), "errors": errors,
            "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99),
            # overload: how fast a refusal comes back (the door's 503 overloaded, admit's 429)
            "refused_p99_ms": pct([1000 * (s.done - s.sent) for s in shots if s.status in (429, 503) and s.done], 99),
            "achieved_rps": round(len(ok) / wall, 1) if wall else None,
            "kept_up": len(ok) == len(shots) and wall <= offered + max(2.0, 0.1 * offered),
            "cpu_ms_per_req": round(1000 * mine / len(ok), 1) if ok and system.roots else None,
            "cpu_s_by_process": {k: v for k, v in by_owner.items() if k != "other"},
            "host_busy_pct": cpu.result()["busy_pct"]}


async def run_system(system: System, rates: list[float], seconds: float, mock_pid: int,
                     profile_dir: Path | None = None) -> list[dict[str, Any]]:
    rows = []
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=conn) as session:
        await offer(session, system, 10, 3, f"{system.name}-warm")  # models loaded, connections open
        for rate in rates:
            log.print(f"  {system.name}: {rate:g} req/s for {seconds:g} s")
            row = await measure(session, system, rate, seconds, mock_pid, profile_dir)
            rows.append(row)
            if row["achieved_rps"] is not None and row["achieved_rps"] < 0.5 * rate:
                log.print(f"  {system.name} saturated at {row['achieved_rps']} req/s; higher rates skipped")
                break
            await asyncio.sleep(1.0)
    return rows


# ---- the report ---------------------------------------------------------------------------------

def added(rows: dict[str, list[dict[str, Any]]]) -> None:
    """Each row gets added_p50/p99_ms: its latency minus direct's at the same rate."""
    base = {r["rate"]: r for r in rows.get("direct", [])}
    for _name, rs in rows.items():
        for r in rs:
            d = base.get(r["rate"])
            for q in ("p50", "p99"):
                v, b = r.get(f"{q}_ms"), d.get(f"{q}_ms") if d else None
                r[f"added_{q}_ms"] = round(v - b, 1) if v is not None and b is not None else None


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b not in (None, 0) else None


def ratios(rows: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    peer = {r["rate"]: r for r in rows.get("litellm", [])}
    out = []
    for name in ("gateway", "gateway-unchained", "product", "product-unchained"):
        for r in rows.get(name, []):
            p = peer.get(r["rate"])
            if p is None:
                continue
            out.append({"system": name, "rate": r["rate"],
                        "cpu_per_req_vs_litellm": ratio(r["cpu_ms_per_req"], p["cpu_ms_per_req"]),
                        "added_p50_vs_litellm": ratio(r["added_p50_ms"], p["added_p50_ms"]),
                        "added_p99_vs_litellm": ratio(r["added_p99_ms"], p["added_p99_ms"])})
    return out


def fmt(v: Any) -> str:
    return "-" if v is None else (f"{v:.2f}" if isinstance(v, float) and abs(v) < 10 else str(v))


def print_tables(rows: dict[str, list[dict[str, Any]]], rat: list[dict[str, Any]],
                 highest: dict[str, float | None]) -> None:
    t = Table(title="llmpipe ÷ LiteLLM, same rate, same run (lower is better)")
    for c in ("system", "req/s", "CPU/request", "added p50", "added p99"):
        t.add_column(c, justify="right")
    for r in rat:
        t.add_row(r["system"], fmt(r["rate"]), fmt(r["cpu_per_req_vs_litellm"]), fmt(r["added_p50_vs_litellm"]),
                  fmt(r["added_p99_vs_litellm"]))
    console.print(t)
    t = Table(title="per system and rate")
    for c in ("system", "req/s", "ok/sent", "achieved", "kept up", "p50 ms", "p99 ms", "added p50", "added p99",
              "CPU ms/req", "host busy %"):
        t.add_column(c, justify="right")
    for name, rs in rows.items():
        for r in rs:
            t.add_row(name, fmt(r["rate"]), f"{r['ok']}/{r['sent']}", fmt(r["achieved_rps"]),
                      "yes" if r["kept_up"] else "NO", fmt(r["p50_ms"]), fmt(r["p99_ms"]), fmt(r["added_p50_ms"]),
                      fmt(r["added_p99_ms"]), fmt(r["cpu_ms_per_req"]), fmt(r["host_busy_pct"]))
    console.print(t)
    console.print("highest rate kept up with: " + ", ".join(f"{k} {fmt(v)}" for k, v in highest.items()))
    t = Table(title="CPU seconds per process over each window (llmpipe: per stage)")
    t.add_column("system")
    t.add_column("req/s", justify="right")
    t.add_column("CPU s by process")
    for name, rs in rows.items():
        for r in rs:
            t.add_row(name, fmt(r["rate"]), ", ".join(f"{k} {v}" for k, v in r["cpu_s_by_process"].items()))
    console.print(t)


async def main_async(systems: list[str], rates: list[float], seconds: float,
                     profile_dir: Path | None = None, stack_env: dict[str, str] | None = None) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="peer-bench-"))
    port = free_port()
    mock = subprocess.Popen([sys.executable, str(ROOT / "bench" / "mock_upstream.py"), "--port", str(port)])
    upstream = f"http://127.0.0.1:{port}/v1"
    rows: dict[str, list[dict[str, Any]]] = {}
    notes: dict[str, Any] = {}
    try:
        await wait_http(f"http://127.0.0.1:{port}/health", 30, mock)
        for name in systems:
            log.print(f"[bold]{name}[/bold]")
            if name == "direct":
                sys_ = System("direct", f"{upstream}/chat/completions", {}, {})
                rows[name] = await run_system(sys_, rates, seconds, mock.pid)
                continue
            ctx = litellm(upstream, work) if name == "litellm" else llmpipe(name, upstream, work, stack_env)
            async with ctx as sys_:
                notes[name] = sys_.notes
                rows[name] = await run_system(sys_, rates, seconds, mock.pid, profile_dir)
    finally:
        mock.send_signal(signal.SIGTERM)
        mock.wait(10)
    added(rows)
    rat = ratios(rows)
    highest = {k: max((r["rate"] for r in rs if r["kept_up"]), default=None) for k, rs in rows.items()}
    print_tables(rows, rat, highest)
    shutil.rmtree(work, ignore_errors=True)
    return {"bench": "peer", "seconds_per_rate": seconds, "stack_env": stack_env or {}, "ratios": rat, "highest_kept_up": highest,
            "systems": rows, "notes": notes}


def main(quick: bool = typer.Option(False, "--quick", help="rates 10 and 40, 6 s each"),
         systems: str = typer.Option("direct,litellm,gateway,product", help="comma-separated, run in this order"),
         rates: str = typer.Option("", help="comma-separated req/s (default 10,20,40,80; quick 10,40)"),
         seconds: float = typer.Option(0, help="seconds per rate (default 20; quick 6)"),
         profile: Path = typer.Option(None, help="py-spy every llmpipe process during each window; collapsed "
                                                 "stacks and a summary go to this folder"),
         stack_env: list[str] = typer.Option([], "--stack-env", help="KEY=VALUE for llmpipe's processes "
                                                                     "(repeatable), e.g. a consumer setting"),
         tools: int = typer.Option(0, help="every request offers this many function tools (tool_choice auto)")) -> None:
    t0 = time.perf_counter()
    BENCH_TOOLS[:] = bench_tools(tools)
    chosen = [s.strip() for s in systems.split(",") if s.strip()]
    unknown = set(chosen) - {"direct", "litellm", "gateway", "product", "gateway-unchained", "product-unchained"}
    if unknown:
        raise typer.BadParameter(f"unknown systems: {sorted(unknown)}")
    rate_list = [float(r) for r in rates.split(",") if r.strip()] or ([10.0, 40.0] if quick else [10.0, 20.0, 40.0, 80.0])
    if profile is not None:
        if not shutil.which("py-spy"):
            raise typer.BadParameter("--profile needs py-spy on PATH")
        profile.mkdir(parents=True, exist_ok=True)
    if any("=" not in kv for kv in stack_env):
        raise typer.BadParameter("--stack-env takes KEY=VALUE")
    result = asyncio.run(main_async(chosen, rate_list, seconds or (6.0 if quick else 20.0), profile,
                                    dict(kv.split("=", 1) for kv in stack_env)))
    if profile is not None:
        summary = {p.stem: profile_summary(p) for p in sorted(profile.glob("*.txt"))}
        (profile / "summary.json").write_text(json.dumps(summary, indent=1))
        for stem, sm in summary.items():
            console.print(f"[bold]{stem}[/bold] ({sm['samples']} samples): "
                          + "; ".join(f"{k} {v}%" for k, v in sm["leaf_pct"][:6]))
    result["quick"] = quick
    result["tools"] = tools
    print_result(console, result, t0)


if __name__ == "__main__":
    typer.run(main)
