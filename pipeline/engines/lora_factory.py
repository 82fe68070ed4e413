"""Deterministic tiny LoRA adapters for a local base model, made with peft: the adapters tests and
benchmarks serve (nothing is downloaded), and the all-zero adapter base requests run through while
LoRA is enabled (see VllmEngine)."""

from __future__ import annotations

from pathlib import Path

TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj"]


def make_adapter(base_dir: Path, out_dir: Path, *, seed: int, rank: int = 8, alpha: int = 64,
                 zero: bool = False, scale: float = 0.05) -> Path:
    """Write a LoRA adapter for `base_dir` to `out_dir` and return it.

    `seed` fixes the weights, so the same call makes byte-identical files. A non-zero adapter has
    both A and B random (peft's default leaves B at zero, which changes nothing) and a large alpha,
    so its outputs differ visibly from the base model's. `zero=True` keeps B at zero: the adapter
    adds exactly nothing."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    out_dir = Path(out_dir)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=TARGET_MODULES, lora_dropout=0.0,
                        bias="none", task_type="CAUSAL_LM", init_lora_weights=True)
    peft_model = get_peft_model(model, config)
    if not zero:
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in peft_model.named_parameters():
                if "lora_A" in name or "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=gen) * scale)
    peft_model.save_pretrained(str(out_dir))
    for extra in ("README.md",):  # peft's model card names the hub; the registry digests the directory
        (out_dir / extra).unlink(missing_ok=True)
    return out_dir


def zero_adapter(base_dir: Path, adapters_dir: Path, base_revision: str) -> Path:
    """The base model's all-zero adapter, made once per base revision under `adapters_dir`.

    While LoRA is enabled, base requests run through it: on the CPU build a batch mixing rows
    without an adapter and rows with one corrupts the adapter-less rows (measured: 0 of 8 base rows
    intact; docs/decisions/0013-lora-base-rows-through-a-zero-adapter.md). With every
    row carrying an adapter the batch is uniform, and B = 0 makes the base rows exactly the base
    model's."""
    import hashlib
    import shutil
    import uuid

    out = Path(adapters_dir) / f"_base-zero-{hashlib.sha256(base_revision.encode()).hexdigest()[:12]}"
    if (out / "adapter_config.json").is_file():
        return out
    tmp = out.with_name(f"{out.name}.tmp-{uuid.uuid4().hex[:6]}")
    make_adapter(base_dir, tmp, seed=0, rank=1, alpha=1, zero=True)
    try:
        tmp.rename(out)
    except OSError:  # another worker made it first
        shutil.rmtree(tmp, ignore_errors=True)
    return out
