"""Model work per request of bench/peer_bench.py's product traffic, measured apart: mask's NER and the
cache's embedding, one request at a time, one thread each (CPU ms per request). What a peer-bench CPU
split charges to mask+cache beyond this is the pipeline's own work in that process.

    OMP_NUM_THREADS=1 .venv/bin/python bench/model_cost_probe.py
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pipeline.engines.embedder import Embedder  # noqa: E402
from pipeline.stages.mask.config import MaskPolicy  # noqa: E402
from pipeline.stages.mask.pii import Masker  # noqa: E402


def cpu_ms_each(texts: list[str], call: Callable[[list[str]], object], warm: int = 20) -> float:
    for t in texts[:warm]:
        call([t])
    t0 = time.process_time()
    for t in texts:
        call([t])
    return (time.process_time() - t0) / len(texts) * 1000


def main() -> None:
    texts = [f"Reply yes. (product-40 {i} {os.urandom(4).hex()})" for i in range(240)]  # peer_bench's prompts
    masker = Masker(MaskPolicy())
    masker.warm()
    embedder = Embedder(threads=1)
    ner, emb = cpu_ms_each(texts, masker.mask), cpu_ms_each(texts, embedder.embed)
    print(f"mask (NER) {ner:.2f} ms, embedding {emb:.2f} ms ({embedder.backend}): CPU per request, one at a time")


if __name__ == "__main__":
    main()
