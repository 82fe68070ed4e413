"""The cache verifier: its calibration is bounded and its shipped weights behave (pure: no index)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.evaluation.cache_fit import (
    REFUSE_ALL,
    choose_threshold,
    false_hit_bound,
    logistic,
)
from pipeline.stages.cache.gate import GateVerdict
from pipeline.stages.cache.verifier import FEATURES, MONOTONE, Verifier, features


def test_the_false_hit_bound_is_clopper_pearson():
    # 0 false hits in n: the bound is 1 - (1 - confidence)^(1/n)
    assert false_hit_bound(0, 149, 0.95) == pytest.approx(1 - 0.05 ** (1 / 149), rel=1e-6)
    assert false_hit_bound(0, 0, 0.9) == 1.0 and false_hit_bound(3, 3, 0.9) == 1.0
    assert false_hit_bound(1, 210, 0.95) > 0.02 > false_hit_bound(1, 210, 0.90)


def test_the_threshold_is_the_lowest_that_meets_the_bound():
    rng = np.random.default_rng(7)
    p_same, p_diff = rng.uniform(0.5, 1.0, 400), rng.uniform(0.0, 0.7, 100)
    p = np.concatenate([p_same, p_diff])
    same = np.concatenate([np.ones(400, bool), np.zeros(100, bool)])
    t, at = choose_threshold(p, same, 0.98, 0.9)
    hit = p >= t
    assert at["hits"] == hit.sum() and at["false_hits"] == (hit & ~same).sum()
    assert false_hit_bound(at["false_hits"], at["hits"], 0.9) <= 0.02
    lower = p[p < t].max()  # one step lower breaks the bound
    h2 = p >= lower
    assert false_hit_bound(int((h2 & ~same).sum()), int(h2.sum()), 0.9) > 0.02
    # too few clean hits to certify anything: refuse every hit
    assert choose_threshold(np.array([0.9, 0.8]), np.array([True, True]), 0.98, 0.95)[0] == REFUSE_ALL


def test_the_fit_keeps_the_monotone_signs():
    rng = np.random.default_rng(3)
    X = rng.uniform(0, 1, (300, len(FEATURES)))
    # labels that *fall* with char overlap: the constraint must hold the weight at 0, not below
    y = X[:, FEATURES.index("char3_overlap")] < 0.5
    w, _ = logistic(X, y)
    for name, sign in MONOTONE.items():
        assert w[FEATURES.index(name)] * sign >= -1e-9, name


def test_the_shipped_verifier_accepts_an_identical_prompt_and_refuses_on_override():
    v = Verifier.load()
    assert len(v.weights) == len(FEATURES) and v.fitted["pairs"] >= 500 and 0 < v.threshold <= 1
    verdict = GateVerdict(passed=True, words=(4, 4), left_over=(0, 0))
    for text in ("환불 신청은 어디서 하나요?", "How do I reset my password?"):
        x = features(text, text, 1.0, 1.0, verdict)
        assert v.accepts(x)[0]
        assert not v.accepts(x, threshold=REFUSE_ALL)[0]
    # every word left over lowers the probability
    worse = features("a b c d", "e f g h", 1.0, 1.0, GateVerdict(passed=True, words=(4, 4), left_over=(4, 4)))
    assert v.probability(worse) <= v.probability(features("a b c d", "a b c d", 1.0, 1.0, verdict))


def test_a_verifier_for_other_features_is_refused(tmp_path):
    import orjson

    bad = tmp_path / "v.json"
    bad.write_bytes(orjson.dumps({"features": ["minilm_cos"], "weights": [1.0], "bias": 0.0, "threshold": 0.5,
                                  "fitted": {}}))
    with pytest.raises(ValueError, match="refit"):
        Verifier.load(bad)
