"""Fitting the cache verifier (verifier.py) on labelled pairs, with a bounded false-hit rate.

Protocol:
1. Every pair is put through the lookup's own code (`SemanticCache.pair_evidence`): the gate's
   verdict and the verifier's features. Pairs that boundaries or bypass rules decide
   (cross_tenant, volatile) and pairs whose numbers or masked entities differ (the gate refuses
   them before any model runs) are left out: the verifier never sees them.
2. Logistic regression over the features (L2, weights held to the signs in verifier.MONOTONE),
   scored out of fold: 5 folds grouped by the cached
   prompt, so no prompt is scored by a model that saw it.
3. The threshold: the lowest at which the hits that the gate *and* the out-of-fold verifier accept
   have a false-hit rate whose one-sided Clopper-Pearson upper bound (at `confidence`) is at most
   1 - target_precision. No such threshold: 1.0 + epsilon, the verifier refuses every hit.
4. The model is refitted on all pairs; the threshold from 3 is kept, with the out-of-fold numbers
   that justify it, the training files' digests and the bound, in `Verifier.fitted`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from scipy.optimize import minimize
from scipy.stats import beta
from sklearn.model_selection import GroupKFold

from pipeline.evaluation.cache import Pair, read_pairs
from pipeline.stages.cache.gate import GateVerdict
from pipeline.stages.cache.verifier import FEATURES, MONOTONE, Verifier

DECIDED_ELSEWHERE = ("cross_tenant", "volatile")
REFUSE_ALL = 1.000001


def logistic(X: np.ndarray, y: np.ndarray, l2: float = 1.0) -> tuple[np.ndarray, float]:
    """Weights and bias minimising the logistic loss + l2/2 |w|^2, each weight within its MONOTONE sign."""
    t = np.where(y, 1.0, -1.0)

    def loss(theta: np.ndarray) -> tuple[float, np.ndarray]:
        w, b = theta[:-1], theta[-1]
        z = t * (X @ w + b)
        sig = 0.5 * (1 + np.tanh(-z / 2))  # 1 / (1 + e^z), without overflow
        grad = -(t * sig)
        return (float(np.logaddexp(0, -z).sum() + 0.5 * l2 * w @ w),
                np.append(X.T @ grad + l2 * w, grad.sum()))

    bounds = [(0, None) if MONOTONE.get(f) == 1 else (None, 0) if MONOTONE.get(f) == -1 else (None, None)
              for f in FEATURES] + [(None, None)]
    res = minimize(loss, np.zeros(X.shape[1] + 1), jac=True, method="L-BFGS-B", bounds=bounds)
    return res.x[:-1], float(res.x[-1])


def _predict(model: tuple[np.ndarray, float], X: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-(X @ model[0] + model[1])))


def false_hit_bound(false_hits: int, hits: int, confidence: float) -> float:
    """One-sided Clopper-Pearson upper bound of the false-hit rate among `hits`."""
    if hits == 0:
        return 1.0
    if false_hits >= hits:
        return 1.0
    return float(beta.ppf(confidence, false_hits + 1, hits - false_hits))


def choose_threshold(p: np.ndarray, same: np.ndarray, target_precision: float,
                     confidence: float) -> tuple[float, dict]:
    """Step 3: the lowest probability threshold whose hits meet the bound (p: gate-passed pairs only)."""
    best, stats = REFUSE_ALL, {"hits": 0, "false_hits": 0, "bound": 1.0}
    for t in sorted(set(p.tolist()), reverse=True):
        hit = p >= t
        n, fp = int(hit.sum()), int((hit & ~same).sum())
        bound = false_hit_bound(fp, n, confidence)
        if bound <= 1 - target_precision:
            best, stats = t, {"hits": n, "false_hits": fp, "bound": round(bound, 4)}
    return best, stats


def fit(files: Sequence[Path], evidence: Callable[[str, str], tuple[GateVerdict, np.ndarray | None]],
        target_precision: float = 0.98, confidence: float = 0.90, on_pair: Callable[[], None] | None = None,
        folds: int = 5) -> Verifier:
    """Steps 1-4 (`evidence(query, cached_prompt)`: the gate's verdict and the features, None when
    the gate refused before any model ran)."""
    rows: list[tuple[Pair, GateVerdict, np.ndarray]] = []
    for path in files:
        for pair in read_pairs(path):
            if on_pair:
                on_pair()
            if pair.kind in DECIDED_ELSEWHERE or pair.tenant_a != pair.tenant_b:
                continue
            verdict, x = evidence(pair.b, pair.a)
            if x is not None:
                rows.append((pair, verdict, x))
    if len(rows) < 5 * folds:
        raise ValueError(f"{len(rows)} usable pairs: too few to fit and calibrate a verifier")
    X = np.stack([x for _, _, x in rows])
    y = np.array([p.label == "same" for p, _, _ in rows])
    passed = np.array([v.passed for _, v, _ in rows])
    groups = np.array([int(hashlib.sha256(p.a.encode()).hexdigest()[:8], 16) for p, _, _ in rows])
    oof = np.zeros(len(rows))
    for train, test in GroupKFold(folds).split(X, y, groups):
        oof[test] = _predict(logistic(X[train], y[train]), X[test])
    threshold, at = choose_threshold(oof[passed], y[passed], target_precision, confidence)
    hit = passed & (oof >= threshold)
    tp, fp = int((hit & y).sum()), int((hit & ~y).sum())
    gate_tp, gate_fp = int((passed & y).sum()), int((passed & ~y).sum())
    weights, bias = logistic(X, y)
    digests = {Path(f).name: hashlib.sha256(Path(f).read_bytes()).hexdigest()[:16] for f in files}
    fitted = {
        "revision": "verifier@" + hashlib.sha256(repr((sorted(digests.items()), target_precision, confidence))
                                                 .encode()).hexdigest()[:12],
        "training_files": digests, "pairs": len(rows), "same": int(y.sum()),
        "target_precision": target_precision, "confidence": confidence, "bound_at_threshold": at,
        "out_of_fold": {"gate_only": {"hits": gate_tp + gate_fp, "false_hits": gate_fp,
                                      "recall": round(gate_tp / max(1, int(y.sum())), 4)},
                        "gate_and_verifier": {"hits": tp + fp, "false_hits": fp,
                                              "recall": round(tp / max(1, int(y.sum())), 4)}},
    }
    return Verifier(tuple(float(w) for w in weights), bias, float(threshold), fitted)


__all__ = ["FEATURES", "fit", "choose_threshold", "false_hit_bound"]
