"""Helpers the benchmarks share: interpolated percentiles, host CPU over a phase, CPU per process,
pinning the engine to one core and everything else to the others."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def pct(values: list[float], q: float) -> float | None:
    """Percentile with linear interpolation between closest ranks."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return round(s[lo] + (s[hi] - s[lo]) * (pos - lo), 2)


class CpuWindow:
    """Host CPU busy% and steal% over a phase (/proc/stat): a noisy neighbour shows as steal."""

    def __init__(self) -> None:
        self.start = self._read()

    @staticmethod
    def _read() -> list[int] | None:
        try:
            with open("/proc/stat") as f:
                return [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None

    def result(self) -> dict[str, float | None]:
        end = self._read()
        if not self.start or not end:
            return {"busy_pct": None, "steal_pct": None}
        d = [b - a for a, b in zip(self.start, end)]
        total = sum(d[:8]) or 1  # user nice system idle iowait irq softirq steal
        idle = d[3] + d[4]
        return {"busy_pct": round(100 * (total - idle) / total, 1), "steal_pct": round(100 * d[7] / total, 1)}


def proc_ticks() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, utime + stime ticks) of every process (/proc)."""
    out: dict[int, tuple[int, int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[int(d)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
        except (OSError, IndexError, ValueError):
            pass
    return out


def cpu_by_owner(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]],
                 owners: dict[int, str]) -> dict[str, float]:
    """CPU seconds between two snapshots, each process charged to its nearest ancestor in `owners`
    (the generate worker's vLLM engine-core processes count as generate)."""
    hz = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for pid, (_ppid, ticks) in after.items():
        owner, p = None, pid
        for _ in range(50):
            if p in owners:
                owner = owners[p]
                break
            p = after.get(p, (0, 0))[0]
            if p <= 1:
                break
        if owner is None:
            owner = "other"
        d = ticks - before.get(pid, (0, 0))[1] if pid in before else ticks
        out[owner] = out.get(owner, 0.0) + d / hz
    return {k: round(v, 1) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


# vLLM's engine core renames its process (setproctitle); its OpenMP threads do the model's work
ENGINE_CORE_MARK = "EngineCore"
# `--pin`: the engine's OpenMP binds to this core alone (it binds at start-up, so the stack and the
# in-process engine are started with it), and pin_split moves every other thread off it
ENGINE_CPU = 0
PIN_ENV = {"VLLM_CPU_OMP_THREADS_BIND": str(ENGINE_CPU)}


def _is_engine_core(p) -> bool:
    import psutil

    try:
        return ENGINE_CORE_MARK in p.name() or ENGINE_CORE_MARK in " ".join(p.cmdline())
    except psutil.Error:
        return False


def _pin_threads(p, cpus: set[int]) -> int:
    """Every thread of `p` (affinity is per thread on Linux; new threads inherit their creator's)."""
    import psutil

    n = 0
    try:
        for t in p.threads():
            try:
                os.sched_setaffinity(t.id, cpus)
                n += 1
            except (ProcessLookupError, PermissionError):
                pass  # a thread that ended meanwhile
    except psutil.Error:
        pass
    return n


def _children(p) -> list:
    import psutil

    try:
        return p.children(recursive=True)
    except psutil.Error:
        return []


def pin_split(root_pids: list[int], engine_pids: list[int] | None = None) -> dict:
    """Pin vLLM's engine (found under `root_pids`: each engine-core process and its model worker) to
    ENGINE_CPU and every other process of the trees, this one included, to the remaining cores.
    `engine_pids` names the engine instead (a mock upstream standing in for it).
    Raises if there is no engine core to pin or only one core. Returns what was pinned, for the bench's JSON."""
    import psutil

    cores = sorted(os.sched_getaffinity(0) | {ENGINE_CPU})
    rest = {c for c in cores if c != ENGINE_CPU}
    if not rest:
        raise RuntimeError("--pin needs at least two cores")
    procs: dict[int, psutil.Process] = {}
    for pid in {*root_pids, *(engine_pids or []), os.getpid()}:
        try:
            root = psutil.Process(pid)
            for p in (root, *root.children(recursive=True)):
                procs[p.pid] = p
        except psutil.Error:
            pass
    heads = [p for p in procs.values() if (p.pid in engine_pids if engine_pids else _is_engine_core(p))]
    if not heads:
        raise RuntimeError(f"--pin: no process named {ENGINE_CORE_MARK} under {sorted(root_pids)}")
    # vLLM on CPU runs the model in a worker process under the engine core (the mp executor is
    # forced there): that process is the engine's compute, so it is pinned with its parent
    engine = list({p.pid: p for c in heads for p in (c, *_children(c))}.values())
    threads = {"engine": sum(_pin_threads(p, {ENGINE_CPU}) for p in engine),
               "rest": sum(_pin_threads(p, rest) for p in procs.values() if p not in engine)}
    return {"engine_cpus": [ENGINE_CPU], "engine_pids": sorted(p.pid for p in engine), "rest_cpus": sorted(rest),
            "processes": len(procs), "threads": threads}


def print_result(console, result: dict, t0: float) -> None:
    """A bench's closing lines: the wall time for the reader, then one JSON line for tools."""
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    console.print(f"wall time {result['wall_s']} s")
    print(json.dumps(result, separators=(",", ":")))


def wide_console():
    """A rich console that gives a pipe or a log the full table, not rich's 80-column default."""
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", "150")))


def code_state(root: Path) -> dict[str, Any]:
    """The commit an evaluation ran on, and the files under pipeline/ that differed from it."""

    def git(*args: str) -> str:
        r = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)
        return r.stdout if r.returncode == 0 else ""

    changed = [line[3:] for line in git("status", "--porcelain", "--", "pipeline").splitlines() if line.strip()]
    return {"commit": git("rev-parse", "--short", "HEAD").strip() or None, "pipeline_uncommitted": changed}


def fmt(v: Any, nd: int = 2) -> str:
    """A table cell: '-' for none, floats to `nd` places."""
    return "-" if v is None else (f"{v:.{nd}f}" if isinstance(v, float) else str(v))
