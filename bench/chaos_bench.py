"""Chaos: steady traffic through the front door while a schedule kills stage workers, the sink and
the embedded broker (`llmpipe up --processes`).

    .venv/bin/python bench/chaos_bench.py                       # the product stack, 5 minutes
    .venv/bin/python bench/chaos_bench.py --light --minutes 1   # model-free generate (make test runs this)

Traffic is open-loop at `--rate` requests/s, each with a deadline of `--timeout-s`; one fault every
`--fault-every-s` (none in the last RECOVERY_TAIL_S), in a seeded random order over the kinds in
`--faults`. Printed (a table, then
one JSON line):

- requests sent; answered once; answered twice at the caller (an HTTP caller gets one response per
  request; the door's dropped duplicate terminal records, from at-least-once redeliveries, are
  counted beside it); unanswered by deadline + grace (a hang, a dropped connection, a bare 500);
- warehouse rows against the requests the pipeline answered (200, or a pipeline error; not a 503
  or 504 the door made itself, e.g. for a request the broker lost); a row whose
  answer came within BROKER_LOSS_WINDOW_S before a broker kill may be lost with its memory storage
  (counted apart: the `broker_restarted` event says so), any other absent row is `missing`;
- admission holds leaked (a final request's admit row: the tenant's free concurrency vs its limit);
- recovery time after each fault: fault to the first 200 of a request sent after it.

`--light` swaps vLLM for tests.stages:FakeGenerate (admit, generate and postprocess, no model), so
faults, not a model's start-up, set the recovery times; the default is the product topology.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
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

from bench._common import pct  # noqa: E402
from bench.stream_bench import cli  # noqa: E402

console = Console(width=None if sys.stdout.isatty() else 130)
log = Console(stderr=True)
GRACE_S = 2.0  # the door's, past a request's deadline
SLACK_S = 2.0  # HTTP and scheduling on a 2-core host
CONCURRENCY_LIMIT = 64
FAULTS = ("worker", "sink", "broker")
BROKER_LOSS_WINDOW_S = 5.0
# no fault this close to the end, so the last one's recovery is measured (a broker restart waits for
# the stack's producers to let go, runtime/broker/gate.py, and the groups rejoin: ~10 s here)
RECOVERY_TAIL_S = 15.0  # answers this soon before a broker kill may not have reached the warehouse


DOOR_ANSWERS = (None, "frontdoor", "client", "pending")  # x-answered-by of answers the door made itself


@dataclass
class Sent:
    at: float  # monotonic
    status: int | str  # the HTTP status, or the exception's name
    code: str
    seconds: float
    request_id: str | None
    answered_by: str | None = None  # a stage; "frontdoor"/"client" when the door answered itself


def config(key: str, light: bool) -> dict[str, Any]:
    from pipeline.registries.tenants import key_hash

    cfg: dict[str, Any] = {"tenants": [{"name": "chaos", "limits": {"concurrency": CONCURRENCY_LIMIT},
                                        "api_keys": [{"key_sha256": key_hash(key)}]}]}
    if light:
        cfg["stages"] = [{"name": "admit"}, {"name": "generate", "class": "tests.stages:FakeGenerate"},
                         {"name": "postprocess"}]
    return cfg


async def one(http: httpx.AsyncClient, url: str, key: str, i: int, timeout_s: float) -> Sent:
    t0 = time.monotonic()
    try:
        r = await http.post(url, headers={"authorization": f"Bearer {key}"},
                            json={"model": "small", "max_tokens": 8, "temperature": 0,
                                  "messages": [{"role": "user", "content": f"Say the number {i}."}],
                                  "llmpipe": {"timeout_s": timeout_s}})
        code = "ok" if r.status_code == 200 else str((r.json().get("error") or {}).get("code", ""))
        return Sent(t0, r.status_code, code, time.monotonic() - t0, r.headers.get("x-request-id"),
                    r.headers.get("x-answered-by"))
    except (httpx.HTTPError, ValueError) as exc:
        return Sent(t0, type(exc).__name__, "", time.monotonic() - t0, None)


def kill(data_dir: Path, kind: str, rng: random.Random) -> str:
    pids = json.loads((data_dir / "stack.json").read_text())["pids"]
    if kind == "broker":
        name = "broker"
    elif kind == "sink":
        name = "worker:sink"
    else:
        name = rng.choice(sorted(k for k in pids if k.startswith("worker:") and k != "worker:sink"))
    try:
        os.kill(pids[name], signal.SIGKILL)
    except ProcessLookupError:
        return f"{name} (already gone)"
    return name


async def run(url: str, key: str, data_dir: Path, minutes: float, rate: float, timeout_s: float,
              fault_every_s: float, kinds: list[str], seed: int) -> tuple[list[Sent], list[dict[str, Any]]]:
    rng = random.Random(seed)
    sent: list[Sent] = []
    faults: list[dict[str, Any]] = []
    tasks: list[asyncio.Task] = []
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=timeout_s + GRACE_S + 30, limits=limits) as http:
        t0 = time.monotonic()
        end = t0 + minutes * 60
        next_fault = t0 + fault_every_s
        i = 0
        while time.monotonic() < end:
            tasks.append(asyncio.create_task(one(http, url, key, i, timeout_s)))
            i += 1
            if time.monotonic() >= next_fault and time.monotonic() < end - max(fault_every_s / 2, RECOVERY_TAIL_S):
                kind = rng.choice(kinds)
                what = kill(data_dir, kind, rng)
                faults.append({"at_s": round(time.monotonic() - t0, 1), "kind": kind, "killed": what,
                               "_t": time.monotonic()})
                log.print(f"{time.monotonic() - t0:6.1f} s: killed {what}")
                next_fault += fault_every_s
            await asyncio.sleep(max(0.0, t0 + i / rate - time.monotonic()))
        sent = list(await asyncio.gather(*tasks))
    for f in faults:  # fault -> the first 200 of a request sent after it
        ok = [s.at + s.seconds for s in sent if s.at > f["_t"] and s.status == 200]
        f["recovery_s"] = round(min(ok) - f["_t"], 1) if ok else None
        f["_at"] = f.pop("_t")
    return sent, faults


def leaked_holds(url: str, key: str, data_dir: Path) -> int | None:
    """The free concurrency admit saw for one last request, once everything settled, vs the limit."""
    r = httpx.post(url, headers={"authorization": f"Bearer {key}"}, timeout=120,
                   json={"model": "small", "max_tokens": 4, "messages": [{"role": "user", "content": "last"}]})
    rid = r.headers.get("x-request-id")
    deadline = time.monotonic() + 60
    while rid and time.monotonic() < deadline:
        res = cli("sql", f"SELECT scores['concurrency'] AS free FROM decisions FINAL WHERE request_id = '{rid}' "
                  "AND stage = 'admit'", "--format", "json", data_dir=data_dir, timeout=60)
        rows = json.loads(res.stdout.strip().splitlines()[-1]) if res.returncode == 0 and res.stdout.strip() else []
        if rows:
            return int(CONCURRENCY_LIMIT - rows[0]["free"])
        time.sleep(1)
    return None


def warehouse_rows(data_dir: Path, answered: dict[str, float], broker_kills: list[float]) -> dict[str, int]:
    """Rows of `requests` for the requests the pipeline answered ({request_id: answered at}). A row can
    be lost with the embedded broker's storage only if its answer came shortly before a broker kill
    (the sink writes every `flush_interval_ms`): those are counted apart; any other is missing."""
    t0 = time.monotonic()
    while True:
        res = cli("sql", "SELECT request_id FROM requests FINAL WHERE replay_id = ''", "--format", "json",
                  data_dir=data_dir, timeout=120)
        got = {r["request_id"] for r in json.loads(res.stdout.strip().splitlines()[-1])} if res.returncode == 0 else set()
        absent = set(answered) - got
        with_broker = {r for r in absent if any(0 <= k - answered[r] <= BROKER_LOSS_WINDOW_S for k in broker_kills)}
        waited = time.monotonic() - t0
        if not absent or waited > 60 or (absent == with_broker and waited > 10):
            return {"answered_by_pipeline": len(answered), "rows": len(got & set(answered)),
                    "lost_with_the_broker": len(with_broker), "missing": len(absent - with_broker)}
        time.sleep(2)


def duplicates(http_url: str) -> float | None:
    for line in httpx.get(http_url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("llmpipe_http_duplicate_answers "):
            return float(line.split()[1])
    return None


def main(minutes: float = typer.Option(5.0, help="traffic duration"),
         rate: float = typer.Option(4.0, help="requests per second, open loop"),
         timeout_s: float = typer.Option(15.0, help="each request's deadline"),
         fault_every_s: float = typer.Option(30.0, help="one fault this often"),
         faults: str = typer.Option(",".join(FAULTS), help="fault kinds to draw from"),
         light: bool = typer.Option(False, "--light", help="model-free generate (tests.stages:FakeGenerate)"),
         seed: int = typer.Option(7, help="the fault schedule's seed"),
         keep: Path | None = typer.Option(None, help="copy the stack's logs and every request's outcome here")) -> None:
    from pipeline.registries.tenants import new_api_key

    kinds = [k for k in faults.split(",") if k]
    if not set(kinds) <= set(FAULTS):
        raise typer.BadParameter(f"--faults: choose from {FAULTS}")
    key = new_api_key()
    with tempfile.TemporaryDirectory(prefix="chaos-bench-") as tmp:
        data_dir = Path(tmp)
        cfg = data_dir / "llmpipe.yaml"
        cfg.write_text(yaml.safe_dump(config(key, light)))
        up = cli("up", "--detach", "--processes", "--config", str(cfg), "--json", data_dir=data_dir, timeout=900)
        if up.returncode != 0:
            raise SystemExit(f"llmpipe up failed: {up.stderr[-2000:]}")
        info = json.loads(up.stdout.strip().splitlines()[-1])
        url = info["http_url"] + "/v1/chat/completions"
        sent: list[Sent] = []
        try:
            sent, fault_log = asyncio.run(run(url, key, data_dir, minutes, rate, timeout_s, fault_every_s, kinds,
                                              seed))
            time.sleep(timeout_s + GRACE_S)
            leaked = leaked_holds(url, key, data_dir)
            dup = duplicates(info["http_url"])
            by_pipeline = {s.request_id: s.at + s.seconds for s in sent
                           if s.request_id and s.answered_by not in DOOR_ANSWERS}
            rows = warehouse_rows(data_dir, by_pipeline, [f["_at"] for f in fault_log if f["kind"] == "broker"])
            for f in fault_log:
                f.pop("_at")
            health = json.loads(cli("status", "--json", data_dir=data_dir, timeout=60).stdout.strip().splitlines()[-1])
        finally:
            cli("down", data_dir=data_dir, timeout=300)
            if keep is not None:
                shutil.copytree(data_dir / "logs", keep / "logs", dirs_exist_ok=True)
                t_first = min((s.at for s in sent), default=0.0)
                (keep / "requests.jsonl").write_text("".join(
                    json.dumps({"at_s": round(s.at - t_first, 2), "status": s.status, "code": s.code,
                                "seconds": round(s.seconds, 3), "request_id": s.request_id,
                                "answered_by": s.answered_by}) + "\n" for s in sent))
    limit_s = timeout_s + GRACE_S + SLACK_S
    unanswered = [s for s in sent if not isinstance(s.status, int) or s.status == 500 or s.seconds > limit_s]
    by_status: dict[str, int] = {}
    for s in sent:
        k = f"{s.status} {s.code}".strip()
        by_status[k] = by_status.get(k, 0) + 1
    result = {
        "bench": "chaos", "light": light, "minutes": minutes, "rate": rate, "timeout_s": timeout_s, "seed": seed,
        "sent": len(sent), "answered_once": len(sent) - len(unanswered), "answered_twice_at_caller": 0,
        "duplicate_terminal_records_dropped_by_door": dup, "unanswered_by_deadline_plus_grace": len(unanswered),
        "by_status": dict(sorted(by_status.items(), key=lambda kv: -kv[1])),
        "latency_s": {"p50": pct([s.seconds for s in sent], 50), "p99": pct([s.seconds for s in sent], 99)},
        "warehouse": rows, "holds_leaked": leaked, "faults": fault_log,
        "restarts": {"broker": health["health"]["broker"].get("restarts"),
                     **{k: w.get("restarts") for k, w in health["health"]["workers"].items()}},
    }
    result["passed"] = (result["unanswered_by_deadline_plus_grace"] == 0 and leaked == 0
                        and rows["missing"] == 0 and all(f["recovery_s"] is not None for f in fault_log))
    table = Table(title=f"chaos: {len(sent)} requests over {minutes:g} min, {len(fault_log)} faults")
    table.add_column("")
    table.add_column("value")
    for k in ("sent", "answered_once", "answered_twice_at_caller", "duplicate_terminal_records_dropped_by_door",
              "unanswered_by_deadline_plus_grace", "holds_leaked", "passed"):
        table.add_row(k, str(result[k]))
    table.add_row("warehouse rows / answered by the pipeline", f"{rows['rows']} / {rows['answered_by_pipeline']} "
                  f"({rows['lost_with_the_broker']} lost with the broker's storage, {rows['missing']} missing)")
    for f in fault_log:
        table.add_row(f"{f['at_s']} s: {f['killed']}", f"recovered in {f['recovery_s']} s")
    table.add_row("by status", json.dumps(result["by_status"]))
    console.print(table)
    print(json.dumps(result))


if __name__ == "__main__":
    typer.run(main)
