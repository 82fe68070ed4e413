"""Helpers both benchmarks share: interpolated percentiles and host CPU over a phase."""

from __future__ import annotations


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
