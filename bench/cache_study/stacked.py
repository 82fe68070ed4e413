"""Stacked: the cross-encoder's out-of-fold logit as one more feature of the embedding-pair classifier."""
import os
from pathlib import Path

WORK = os.environ.get("CACHE_STUDY_DIR", "/tmp/cache_study")  # features and out-of-fold scores
os.makedirs(WORK, exist_ok=True)
import sys

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import embedding_pairs as e1
from sklearn.ensemble import HistGradientBoostingClassifier

ce = np.load(WORK + "/ce_oof.npy")
orig = e1.feat
# attach ce via a lookup on (a,b,set)
key = {(r["a"], r["b"], r["set"]): ce[i] for i, r in enumerate(e1.rows)}
def feat2(r, c, mode):
    base = orig(r, c, mode)
    return np.append(base, key[(r["a"], r["b"], r["set"])])
e1.feat = feat2
def hgb(): return HistGradientBoostingClassifier(max_iter=300, learning_rate=0.05)
e1.run("scal", hgb)
e1.run("full", hgb)
