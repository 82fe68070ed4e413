"""Retrieval: how similar the "same" pairs of the training sets are under MiniLM, USE and their mean."""
import os
import pickle

import numpy as np

WORK = os.environ.get("CACHE_STUDY_DIR", "/tmp/cache_study")
d = pickle.load(open(WORK + "/feats.pkl", "rb"))
rows, use, mini = d["rows"], d["use"], d["minilm"]
idx = {t: i for i, t in enumerate(d["texts"])}
HELD = {"cache_pairs_unseen5", "cache_pairs_unseen6"}
tr = [r for r in rows if r["set"] not in HELD and r["label"] == "same"]
for lang in ("en", "ko", "mixed"):
    rs = [r for r in tr if r.get("lang") == lang]
    m = np.array([mini[idx[r["a"]]] @ mini[idx[r["b"]]] for r in rs])
    u = np.array([use[idx[r["a"]]] @ use[idx[r["b"]]] for r in rs])
    c = (m + u) / 2
    print(lang, len(rs), "minilm p10/p50", np.percentile(m, [10, 50]).round(2), "use", np.percentile(u, [10, 50]).round(2),
          "mean", np.percentile(c, [10, 50]).round(2),
          f"| share >= 0.5: minilm {(m >= .5).mean():.2f} use {(u >= .5).mean():.2f} mean {(c >= .5).mean():.2f}")
