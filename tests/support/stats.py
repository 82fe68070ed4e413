"""Exact intervals for tests that check a random split."""

from __future__ import annotations

import math


def binomial_interval(n: int, p: float, level: float = 0.99) -> tuple[int, int]:
    """The central `level` interval of Binomial(n, p), exact."""
    pmf = [math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
                    + k * math.log(p) + (n - k) * math.log1p(-p)) for k in range(n + 1)]
    tail = (1 - level) / 2
    lo, acc = 0, 0.0
    while acc + pmf[lo] <= tail:
        acc += pmf[lo]
        lo += 1
    hi, acc = n, 0.0
    while acc + pmf[hi] <= tail:
        acc += pmf[hi]
        hi -= 1
    return lo, hi
