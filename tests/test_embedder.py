"""The embedder's onnxruntime forward pass (engines/embedder.py): the same vectors as torch's,
exported once per revision, and torch again when an export does not match."""

from __future__ import annotations

import logging

import numpy as np
import orjson

from pipeline.engines import embedder as emb
from tests.support.paths import ROOT


def _texts() -> list[str]:
    pairs = [orjson.loads(line) for line in (ROOT / "tests" / "data" / "cache_pairs_holdout.jsonl").read_text().splitlines()
             if line.strip()]
    texts = [p[k] for p in pairs for k in ("a", "b") if isinstance(p.get(k), str)]
    assert len(texts) > 100, "the holdout pairs hold the texts to compare on"
    return texts + ["", "x", "  spaced  "]


def test_onnx_vectors_match_torch_and_the_export_is_reused(tmp_path):
    first = emb.Embedder(export_dir=tmp_path)
    assert first.backend == "onnx"
    (export,) = tmp_path.glob("*.onnx")
    mtime = export.stat().st_mtime_ns
    again = emb.Embedder(export_dir=tmp_path)
    assert again.backend == "onnx" and export.stat().st_mtime_ns == mtime, "exported once per revision"
    torch_ = emb.Embedder(backend="torch")
    assert torch_.backend == "torch" and torch_.revision == first.revision
    texts = _texts()
    a, b = first.embed(texts, batch_size=16), torch_.embed(texts)
    assert a.shape == b.shape == (len(texts), first.dim)
    assert float(np.abs(a - b).max()) < 1e-5
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    one = first.embed([texts[7]])
    assert float(np.abs(one[0] - a[7]).max()) < 1e-5, "alone or in a batch, the same vector"


def test_an_export_that_does_not_match_torch_is_not_used(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(emb, "MAX_EXPORT_DIFF", -1.0)  # any difference, even 0, fails the check
    with caplog.at_level(logging.WARNING, logger=emb.__name__):
        e = emb.Embedder(export_dir=tmp_path)
    assert e.backend == "torch" and "using torch" in caplog.text
    assert e.embed(["still works"]).shape == (1, e.dim)
