"""Helpers the benchmarks share: interpolated percentiles, host CPU over a phase, CPU per process."""

from __future__ import annotations

import json
import os
import time


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
    for pid, (ppid, ticks) in after.items():
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


def print_result(console, result: dict, t0: float) -> None:
    """A bench's closing lines: the wall time for the reader, then one JSON line for tools."""
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    console.print(f"wall time {result['wall_s']} s")
    print(json.dumps(result, separators=(",", ":")))
