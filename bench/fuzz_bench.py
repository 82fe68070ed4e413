"""Hostile input at volume: tests/test_fuzz.py with many more generated cases than `make test` runs.

    .venv/bin/python bench/fuzz_bench.py                 # 5,000 HTTP bodies + 5,000 Kafka records
    .venv/bin/python bench/fuzz_bench.py --examples 20000

Same assertions as the test (every body a 4xx or an answer, every record answered or dead-lettered,
no crash, no hang, bounded memory); prints pytest's summary, then one JSON line.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

from bench._common import print_result

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--examples", type=int, default=5000, help="HTTP bodies, and Kafka records (default 5000)")
    args = ap.parse_args()
    env = {**os.environ, "LLMPIPE_FUZZ_EXAMPLES": str(args.examples), "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore",
                           "--timeout", "7200", "tests/test_fuzz.py"], cwd=ROOT, env=env)
    print_result(Console(), {"examples": args.examples, "passed": proc.returncode == 0}, t0)
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
