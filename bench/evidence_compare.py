"""Do two revisions decide the same on the demo traffic? Runs `llmpipe demo` on each (a git worktree
for the base, this checkout for the head) and compares the evidence rows they wrote, by stage and
decision, and for the stages whose reasons do not depend on timing, by reason too.

    python bench/evidence_compare.py --base <rev> [--out bench/results/evidence_compare.json]

A layout change must leave these equal. What may differ run to run on the same revision (the demo
sends at a fixed rate, so timing moves a few rows) is measured by `--runs-per-side 2`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# their reasons are functions of the request alone (not of timing or of the engine's tokens)
STABLE_REASONS = ("mask", "route", "route.placement", "media", "vision")


def run_demo(checkout: Path, data_dir: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(checkout)}
    r = subprocess.run([sys.executable, "-m", "pipeline.cli", "demo", "--json", "--data-dir", str(data_dir),
                        "--config", "examples/demo.yaml", "--traffic", "examples/demo_traffic.jsonl"],
                       cwd=checkout, env=env, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise SystemExit(f"demo failed in {checkout}: {r.stderr[-2000:]}")
    rows = sql(checkout, data_dir, "SELECT stage, decision, reason FROM decisions")
    return {"summary": json.loads(r.stdout.strip().splitlines()[-1]), "rows": rows}


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="the revision to compare against (a git worktree is made)")
    ap.add_argument("--runs-per-side", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "evidence_compare.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="evidence-compare-") as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(base), args.base], cwd=ROOT, check=True)
        try:
            runs: dict[str, list[Counter]] = {"base": [], "head": []}
            summaries: dict[str, list[dict]] = {"base": [], "head": []}
            for i in range(args.runs_per_side):
                for side, checkout in (("base", base), ("head", ROOT)):
                    got = run_demo(checkout, Path(tmp) / f"{side}-{i}")
                    runs[side].append(profile(got["rows"]))
                    summaries[side].append({k: got["summary"].get(k) for k in ("sent", "by_status", "seconds")})
                    print(f"{side} run {i + 1}: {len(got['rows'])} evidence rows", file=sys.stderr)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=False)
    report = {"base": args.base, "head": subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                                        text=True).stdout.strip(),
              "summaries": summaries, "base_vs_head": diff(runs["base"][0], runs["head"][0]),
              "run_to_run": {side: diff(r[0], r[1]) for side, r in runs.items() if len(r) > 1}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps(report, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
