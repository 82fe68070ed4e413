"""The cache's verifier: a small calibrated model over a (query, cached prompt) pair that the gate
passed, with a threshold chosen on a training split so that the false-hit rate among its hits is
bounded (pipeline/evaluation/cache_fit.py fits it; `llmpipe cache-fit`).

A hit needs both: the gate's rules (gate.py: numbers, entities, negation and its scope, order of
alternatives, question kind, every content word accounted for) and the verifier's probability >=
its threshold. The verifier can only refuse what the gate passed: refusing a hit is always safe.

Features, all of them cheap once the gate has run: both embedders' cosines (MiniLM, English; USE
multilingual v3), the gate's word counts (content words per side, those left over), character
3-gram overlap, length ratio, and whether the pair is Korean or crosses languages.
Pure: the same pair and the same weights give the same answer, so a replay re-decides it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

import numpy as np
import orjson

from pipeline.stages.cache.gate import GateVerdict

FEATURES = ("minilm_cos", "use_cos", "left_over_share", "char3_overlap", "length_ratio", "korean", "cross_lingual",
            "korean_x_use", "cross_x_use", "long")

# the sign each weight is held to: more similar never lowers the probability, more words left
# over never raises it (an unconstrained fit learned a negative weight on overlap, because hard
# negatives share most characters, and refused identical prompts); 0: free
MONOTONE = {"minilm_cos": 1, "use_cos": 1, "left_over_share": -1, "char3_overlap": 1, "length_ratio": 1}

_HANGUL = re.compile(r"[가-힣]")
_LATIN = re.compile(r"[A-Za-z]")


def _korean(text: str) -> bool:
    return len(_HANGUL.findall(text)) > len(_LATIN.findall(text))


def _grams(text: str) -> set[str]:
    t = re.sub(r"\s+", " ", text.lower())
    return {t[i:i + 3] for i in range(max(1, len(t) - 2))}


def features(query: str, candidate: str, minilm_cos: float, use_cos: float, verdict: GateVerdict) -> np.ndarray:
    """The pair as the verifier sees it, in FEATURES order."""
    ka, kb = _korean(query), _korean(candidate)
    words = sum(verdict.words) or 1
    ga, gb = _grams(query), _grams(candidate)
    la, lb = len(query), len(candidate)
    korean, cross = float(ka and kb), float(ka != kb)
    return np.array([minilm_cos, use_cos, sum(verdict.left_over) / words, len(ga & gb) / max(1, len(ga | gb)),
                     min(la, lb) / max(la, lb, 1), korean, cross, korean * use_cos, cross * use_cos,
                     float(max(la, lb) > 300)], dtype=np.float64)


@dataclass(frozen=True)
class Verifier:
    """Logistic weights over FEATURES and the calibrated threshold, with how it was fitted."""

    weights: tuple[float, ...]
    bias: float
    threshold: float
    fitted: dict  # training sets (digests), pairs, out-of-fold precision/recall, the bound and its target

    @property
    def revision(self) -> str:
        return str(self.fitted.get("revision", "unfitted"))

    def probability(self, x: np.ndarray) -> float:
        z = float(np.dot(self.weights, x)) + self.bias
        return 1.0 / (1.0 + math.exp(-z))

    def accepts(self, x: np.ndarray, threshold: float | None = None) -> tuple[bool, float]:
        p = self.probability(x)
        return p >= (self.threshold if threshold is None else threshold), p

    def to_json(self) -> bytes:
        return orjson.dumps({"features": list(FEATURES), "weights": list(self.weights), "bias": self.bias,
                             "threshold": self.threshold, "fitted": self.fitted}, option=orjson.OPT_INDENT_2)

    @classmethod
    def load(cls, path: Path | None = None) -> Verifier:
        """The shipped verifier (verifier.json beside this module) or a fitted one."""
        raw = Path(path).read_bytes() if path else files("pipeline.stages.cache").joinpath("verifier.json").read_bytes()
        o = orjson.loads(raw)
        if tuple(o["features"]) != FEATURES:
            raise ValueError(f"verifier features {o['features']} are not this code's {list(FEATURES)}: refit it")
        return cls(tuple(float(w) for w in o["weights"]), float(o["bias"]), float(o["threshold"]), o["fitted"])
