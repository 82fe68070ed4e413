"""E2: cross-encoder fine-tuned from the packaged MiniLM weights; OOF by set (or a quick 3-group split)."""
import os
from pathlib import Path

WORK = os.environ.get("CACHE_STUDY_DIR", "/tmp/cache_study")  # features and out-of-fold scores
os.makedirs(WORK, exist_ok=True)
import os
import pickle
import random
import sys
import time

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from pipeline.engines.embedder import packaged_model_dir

torch.set_num_threads(2)
d = pickle.load(open(WORK + "/feats.pkl", "rb"))
rows, checks = d["rows"], d["checks"]
HELD = {"cache_pairs_unseen5", "cache_pairs_unseen6"}
tok = AutoTokenizer.from_pretrained(str(packaged_model_dir()))
EPOCHS = int(os.environ.get("EPOCHS", 3)); MAXLEN = int(os.environ.get("MAXLEN", 128))
def train(pairs, seed=0):
    torch.manual_seed(seed); random.seed(seed)
    m = AutoModelForSequenceClassification.from_pretrained(str(packaged_model_dir()), num_labels=1)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-5, weight_decay=0.01)
    data = [(a, b, y) for a, b, y in pairs] + [(b, a, y) for a, b, y in pairs]  # both orders
    steps = EPOCHS * (len(data) // 16 + 1)  # linear warm-up over 10 %, then linear decay
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1, (s + 1) / (0.1 * steps)) * max(0.0, 1 - s / steps))
    m.train()
    for ep in range(EPOCHS):
        random.shuffle(data); t0 = time.time()
        for i in range(0, len(data), 16):
            batch = data[i:i + 16]
            enc = tok([x[0] for x in batch], [x[1] for x in batch], truncation=True, max_length=MAXLEN, padding=True,
                      return_tensors="pt")
            logit = m(**enc).logits.squeeze(-1)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logit, torch.tensor([float(x[2]) for x in batch]))
            loss.backward(); opt.step(); sched.step(); opt.zero_grad()
        print(f"   epoch {ep} {time.time()-t0:.0f}s loss {loss.item():.3f}", flush=True)
    m.eval(); return m
@torch.no_grad()
def score(m, pairs):
    out = []
    for i in range(0, len(pairs), 64):
        b = pairs[i:i + 64]
        enc = tok([x[0] for x in b], [x[1] for x in b], truncation=True, max_length=MAXLEN, padding=True, return_tensors="pt")
        s1 = m(**enc).logits.squeeze(-1)
        enc = tok([x[1] for x in b], [x[0] for x in b], truncation=True, max_length=MAXLEN, padding=True, return_tensors="pt")
        s2 = m(**enc).logits.squeeze(-1)
        out += ((s1 + s2) / 2).tolist()
    return np.array(out)
def usable(r):
    return r.get("kind") not in ("cross_tenant", "volatile") and r.get("tenant_a") == r.get("tenant_b")
if __name__ == "__main__":
    tr = [i for i, r in enumerate(rows) if r["set"] not in HELD]
    sets = sorted({rows[i]["set"] for i in tr})
    folds = [sets[k::3] for k in range(3)]  # 3 folds of whole sets
    oof = np.full(len(rows), np.nan)
    for f in folds:
        fit = [(rows[i]["a"], rows[i]["b"], rows[i]["label"] == "same") for i in tr
               if rows[i]["set"] not in f and usable(rows[i])]
        te = [i for i in tr if rows[i]["set"] in f]
        print("fold", f, len(fit), "train", len(te), "test", flush=True)
        m = train(fit)
        oof[te] = score(m, [(rows[i]["a"], rows[i]["b"]) for i in te])
    np.save(WORK + "/ce_oof.npy", oof)
