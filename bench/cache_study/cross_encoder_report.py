"""E3: report CE OOF alone and stacked with scalar features; vetoes applied."""
import os
from pathlib import Path

WORK = os.environ.get("CACHE_STUDY_DIR", "/tmp/cache_study")  # features and out-of-fold scores
os.makedirs(WORK, exist_ok=True)
import sys

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from embedding_pairs import HELD, checks, decided, rows

ce = np.load(WORK + "/ce_oof.npy")
tr = [i for i, r in enumerate(rows) if r["set"] not in HELD]
y = np.array([rows[i]["label"] == "same" for i in tr]); same = y.sum()
dec = np.array([decided(rows[i], checks[i]) for i in tr])
s = ce[tr].copy(); s[dec] = -99
def report(name, s):
    best = None
    for th in sorted(set(np.round(s, 3)), reverse=True):
        hit = s >= th; tp = (hit & y).sum(); fp = (hit & ~y).sum()
        if tp + fp >= 20 and fp / (tp + fp) <= 0.02: best = th
    print(name, "best th", best)
    for th in ([best] if best is not None else []) + [0, 1, 2, 3]:
        hit = s >= th; tp = (hit & y).sum(); fp = (hit & ~y).sum()
        line = f"  th {th:.2f}: precision {tp/max(1,tp+fp):.3f} recall {tp/same:.3f} fp {fp} |"
        for lang in ("en", "ko", "mixed"):
            m = np.array([rows[i].get("lang") == lang for i in tr])
            line += f" {lang} {(hit & y & m).sum()/max(1,(y & m).sum()):.2f}/{(hit & ~y & m).sum()}"
        print(line)
        if th == best:
            kinds = {}
            for j, i in enumerate(tr):
                if hit[j] and not y[j]: kinds[rows[i].get("kind")] = kinds.get(rows[i].get("kind"), 0) + 1
            print("   fp kinds", kinds)
report("ce", s)
# no vetoes at all
s2 = ce[tr].copy(); s2[np.array([rows[i].get("kind") in ("cross_tenant","volatile") for i in tr])] = -99
report("ce without vetoes", s2)
