"""Do two revisions decide the same on the demo traffic? Runs `llmpipe demo` on each (a git worktree
per revision; the head defaults to this checkout) and compares the evidence rows they wrote, by
stage and decision, and for the stages whose reasons do not depend on timing, by reason too.

    python bench/evidence_compare.py --base <rev> [--head <rev>] [--runs-per-side 2] [--out FILE]

A layout change must leave these equal, or with `--runs-per-side 2` or more, differ only within the
range the same revision shows from run to run (`outside_run_to_run` lists any key that does not;
the script exits 1 on one). By default both sides run so that timing moves as few rows as it can:
requests one at a time (`--concurrency 1`), and every deployment of each revision's own
`examples/demo.yaml` answered by the instant mock upstream (`bench/mock_upstream.py`, the same fixed
answer on both sides). Two things still move with timing: how many of tenant tight-rpm's requests
fall in one minute, and whether tight-conc's previous request was released before its next one
arrived (admitted vs admitted_after_wait). `--engine` keeps the configured engine and
`--concurrency 48 --rate 2.5` is the demo's own pacing; then cache write-back races and engine
timeouts move rows too.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
# their reasons are functions of the request alone (not of timing or of the engine's tokens)
STABLE_REASONS = ("mask", "route", "route.placement", "media", "vision")


def demo_config(checkout: Path, upstream: str | None, out: Path) -> Path:
    """The revision's own demo config; with an upstream, every deployment is answered by it."""
    cfg = yaml.safe_load((checkout / "examples" / "demo.yaml").read_text())  # anchors resolved
    if upstream:
        for dep in cfg.get("deployments", []):
            dep.update(engine="openai", base_url=upstream)
    out.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return out


def run_demo(checkout: Path, data_dir: Path, config: Path, rate: float, concurrency: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(checkout)}
    r = subprocess.run([sys.executable, "-m", "pipeline.cli", "demo", "--json", "--data-dir", str(data_dir),
                        "--config", str(config), "--traffic", "examples/demo_traffic.jsonl",
                        "--rate", str(rate), "--concurrency", str(concurrency)],
                       cwd=checkout, env=env, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise SystemExit(f"demo failed in {checkout}: {r.stderr[-2000:]}")
    rows = sql(checkout, data_dir, "SELECT stage, decision, reason FROM decisions")
    return {"summary": json.loads(r.stdout.strip().splitlines()[-1]), "rows": rows}


@contextmanager
def mock_upstream() -> Iterator[str]:
    sys.path.insert(0, str(ROOT))
    from pipeline.runtime.broker.embedded import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "mock_upstream.py"), "--port", str(port)])
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(10)


def sql(checkout: Path, data_dir: Path, query: str) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    r = subprocess.run([sys.executable, "-m", "pipeline.cli", "sql", query, "--format",
                        "json", "--data-dir", str(data_dir)], cwd=checkout, env=env, capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"sql failed: {r.stderr[-1000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def profile(rows: list[dict]) -> Counter:
    """(stage, decision) counts, and (stage, decision, reason) for the timing-free stages."""
    c: Counter = Counter()
    for r in rows:
        c[(r["stage"], r["decision"])] += 1
        if r["stage"] in STABLE_REASONS:
            c[(r["stage"], r["decision"], r["reason"])] += 1
    return c


def diff(a: Counter, b: Counter) -> dict[str, list]:
    keys = sorted(set(a) | set(b), key=str)
    return {" | ".join(k): [a.get(k, 0), b.get(k, 0)] for k in keys if a.get(k, 0) != b.get(k, 0)}


def outside_run_to_run(base: list[Counter], head: list[Counter]) -> dict[str, dict]:
    """Keys whose counts on one side never fall within the other side's range over its runs: a
    difference that run-to-run variation on one revision does not explain."""
    out = {}
    for k in sorted(set().union(*base, *head), key=str):
        b, h = [c.get(k, 0) for c in base], [c.get(k, 0) for c in head]
        if max(b) < min(h) or max(h) < min(b):
            out[" | ".join(k)] = {"base": b, "head": h}
    return out


def full_profile(rows: list[dict]) -> Counter:
    """(stage, decision, reason) counts for every stage: equal only when timing moved nothing."""
    return Counter((r["stage"], r["decision"], r["reason"]) for r in rows)


@contextmanager
def worktree(rev: str, path: Path) -> Iterator[Path]:
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(path), rev], cwd=ROOT, check=True)
    try:
        yield path
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT, check=False)


def rev_of(rev: str) -> str:
    return subprocess.run(["git", "rev-parse", rev], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="the revision to compare against (a git worktree is made)")
    ap.add_argument("--head", help="the revision compared (default: this checkout as it is)")
    ap.add_argument("--runs-per-side", type=int, default=1)
    ap.add_argument("--engine", action="store_true", help="keep the configured engine instead of the mock upstream")
    ap.add_argument("--rate", type=float, default=100.0, help="requests per second offered")
    ap.add_argument("--concurrency", type=int, default=1, help="requests in flight at most")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "evidence_compare.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="evidence-compare-") as t, ExitStack() as stack:
        tmp = Path(t)
        upstream = None if args.engine else stack.enter_context(mock_upstream())
        sides = {"base": stack.enter_context(worktree(args.base, tmp / "base")),
                 "head": stack.enter_context(worktree(args.head, tmp / "head")) if args.head else ROOT}
        runs: dict[str, list[Counter]] = {"base": [], "head": []}
        full: dict[str, list[Counter]] = {"base": [], "head": []}
        summaries: dict[str, list[dict]] = {"base": [], "head": []}
        for i in range(args.runs_per_side):
            for side, checkout in sides.items():
                config = demo_config(checkout, upstream, tmp / f"{side}-{i}.yaml")
                got = run_demo(checkout, tmp / f"{side}-{i}", config, args.rate, args.concurrency)
                runs[side].append(profile(got["rows"]))
                full[side].append(full_profile(got["rows"]))
                summaries[side].append({k: got["summary"].get(k) for k in ("requests", "statuses", "seconds")})
                print(f"{side} run {i + 1}: {len(got['rows'])} evidence rows", file=sys.stderr)
    report = {"base": rev_of(args.base), "head": rev_of(args.head or "HEAD"),
              "head_worktree_dirty": not args.head and bool(subprocess.run(
                  ["git", "status", "--porcelain", "--", "pipeline"], cwd=ROOT, capture_output=True,
                  text=True).stdout.strip()),
              "upstream": "configured engine" if args.engine else "mock (bench/mock_upstream.py)",
              "rate": args.rate, "concurrency": args.concurrency,
              "rows": {side: [sum(c.values()) for c in fs] for side, fs in full.items()},
              "summaries": summaries, "base_vs_head": diff(runs["base"][0], runs["head"][0]),
              "base_vs_head_all_reasons": diff(full["base"][0], full["head"][0]),
              "run_to_run": {side: diff(r[0], r[1]) for side, r in runs.items() if len(r) > 1},
              "run_to_run_all_reasons": {side: diff(r[0], r[1]) for side, r in full.items() if len(r) > 1},
              "outside_run_to_run": outside_run_to_run(runs["base"], runs["head"])}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps(report, indent=2, ensure_ascii=False))
    if report["outside_run_to_run"] if args.runs_per_side > 1 else report["base_vs_head"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
