"""E1: a pair classifier over embedding interactions + gate checks; leave-one-set-out OOF on the training sets."""
import os

WORK = os.environ.get("CACHE_STUDY_DIR", "/tmp/cache_study")  # features and out-of-fold scores
os.makedirs(WORK, exist_ok=True)
import pickle
import re
import sys

import numpy as np
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.linear_model import LogisticRegression

d = pickle.load(open(WORK + "/feats.pkl", "rb"))
rows, use, mini, checks = d["rows"], d["use"], d["minilm"], d["checks"]
idx = {t: i for i, t in enumerate(d["texts"])}
HELD = {"cache_pairs_unseen5", "cache_pairs_unseen6"}
HANGUL = re.compile(r"[가-힣]")
def ko(t): return len(HANGUL.findall(t)) > len(re.findall(r"[A-Za-z]", t))
CHECKS = ["numbers", "entities", "relations", "question", "negation", "negation_scope", "roles", "order", "modality",
          "alternatives", "content_words", "ask"]
VETO = ["numbers", "entities", "relations", "negation"]
def feat(r, c, mode):
    a, b = idx[r["a"]], idx[r["b"]]
    ua, ub, ma, mb = use[a], use[b], mini[a], mini[b]
    scal = [float(ua @ ub), float(ma @ mb), float(ko(r["a"]) and ko(r["b"])), float(ko(r["a"]) != ko(r["b"])),
            min(len(r["a"]), len(r["b"])) / max(len(r["a"]), len(r["b"]))]
    gc = [float(c.get(k, True)) for k in CHECKS]
    if mode == "scal":
        return np.array(scal + gc)
    return np.concatenate([ua * ub, np.abs(ua - ub), ma * mb, np.abs(ma - mb), scal, gc])
def decided(r, c):  # boundaries / bypass and hard vetoes: never a hit
    return r.get("kind") in ("cross_tenant", "volatile") or r.get("tenant_a") != r.get("tenant_b") or \
        not all(c.get(k, True) for k in VETO)
def run(mode, model_fn):
    tr = [i for i, r in enumerate(rows) if r["set"] not in HELD]
    sets = sorted({rows[i]["set"] for i in tr})
    X = np.array([feat(rows[i], checks[i], mode) for i in tr]); y = np.array([rows[i]["label"] == "same" for i in tr])
    dec = np.array([decided(rows[i], checks[i]) for i in tr])
    oof = np.zeros(len(tr))
    grp = np.array([rows[i]["set"] for i in tr])
    for s in sets:
        te = grp == s; fit = (~te) & (~dec)
        m = model_fn().fit(X[fit], y[fit]); oof[te] = m.predict_proba(X[te])[:, 1]
    oof[dec] = 0
    same = y.sum()
    print(mode, model_fn.__name__ if hasattr(model_fn,'__name__') else model_fn)
    for th in (0.5, 0.7, 0.8, 0.9, 0.95):
        hit = oof >= th; tp = (hit & y).sum(); fp = (hit & ~y).sum()
        print(f"  th {th}: precision {tp/max(1,tp+fp):.3f} recall {tp/same:.3f} fp {fp}")
    # per lang at the threshold giving <= 2% fp
    best = None
    for th in sorted(set(np.round(oof, 3)), reverse=True):
        hit = oof >= th; tp = (hit & y).sum(); fp = (hit & ~y).sum()
        if tp + fp and fp / (tp + fp) <= 0.02: best = th
    if best is not None:
        hit = oof >= best; tp = (hit & y).sum(); fp = (hit & ~y).sum()
        print(f"  best th {best}: precision {tp/(tp+fp):.3f} recall {tp/same:.3f}")
        for lang in ("en", "ko", "mixed"):
            m = np.array([rows[i].get("lang") == lang for i in tr])
            print(f"    {lang}: recall {(hit & y & m).sum()/max(1,(y & m).sum()):.3f} fp {(hit & ~y & m).sum()}")
        kinds = {}
        for j, i in enumerate(tr):
            if hit[j] and not y[j]: kinds[rows[i].get("kind")] = kinds.get(rows[i].get("kind"), 0) + 1
        print("   false hits by kind", kinds)
    return oof
if __name__ == "__main__":
    def lr(): return LogisticRegression(C=float(sys.argv[1]) if len(sys.argv) > 1 else 1.0, max_iter=3000)
    def hgb(): return HistGradientBoostingClassifier(max_iter=300, learning_rate=0.05)
    run("scal", lr); run("full", lr); run("full", hgb)
