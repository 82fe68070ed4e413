"""Compute and cache pair features for all sets: USE + MiniLM embeddings and the gate's checks."""
import os
from pathlib import Path

WORK = os.environ.get("CACHE_STUDY_DIR", "/tmp/cache_study")  # features and out-of-fold scores
os.makedirs(WORK, exist_ok=True)
import json
import os
import pickle
import sys
import time

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("OMP_NUM_THREADS", "2")
from pathlib import Path

SETS = ["cache_pairs", "cache_pairs_holdout", "cache_pairs_rules", "cache_pairs_train2", "cache_pairs_train3",
        "cache_pairs_unseen", "cache_pairs_unseen2", "cache_pairs_unseen3", "cache_pairs_unseen4",
        "cache_pairs_unseen5", "cache_pairs_unseen6"]
rows = []
for s in SETS:
    for line in open(Path(__file__).resolve().parents[2] / "tests" / "data" / f"{s}.jsonl"):
        if line.strip():
            o = json.loads(line); o["set"] = s; rows.append(o)
texts = sorted({r["a"] for r in rows} | {r["b"] for r in rows})
print(len(rows), "pairs", len(texts), "texts", flush=True)
from pipeline.engines.embedder import Embedder
from pipeline.engines.multilingual import MultilingualEncoder

t0 = time.time()
use = MultilingualEncoder(threads=2).encode(texts)
print("use", time.time() - t0, flush=True)
t0 = time.time()
emb = Embedder(threads=2).embed(texts)
print("minilm", time.time() - t0, flush=True)
idx = {t: i for i, t in enumerate(texts)}
from pipeline.engines.text_analyzer import TextAnalyzer
from pipeline.stages.cache.config import CachePolicy
from pipeline.stages.cache.gate import GateRules, gate
from pipeline.stages.cache.semantic import WordVectors

pol = CachePolicy()
rules = GateRules.build(pol)
an = TextAnalyzer()
class E:  # reuse computed MiniLM vectors for WordVectors? it embeds words: use a real embedder
    pass
wv = WordVectors(Embedder(threads=2))
t0 = time.time()
checks = []
for r in rows:
    v = gate(r["b"], r["a"], an.analyze, wv.best_match, rules)
    checks.append(dict(v.checks, passed=v.passed))
print("gate", time.time() - t0, flush=True)
pickle.dump({"rows": rows, "texts": texts, "use": use, "minilm": emb, "checks": checks}, open(WORK + "/feats.pkl", "wb"))
