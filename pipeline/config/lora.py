"""Multi-LoRA serving settings (the adapters themselves are in the registry)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field


class LoraSettings(BaseModel):
    """Multi-LoRA serving. Adapters load only from `allowed_roots`, after checksum verification."""

    enabled: bool = False
    max_loras: int = Field(4, ge=1, description="adapters resident in the engine at once (hot)")
    max_cpu_loras: int = Field(8, ge=1, description="adapters cached in CPU memory (warm)")
    max_lora_rank: int = Field(16, ge=1)
    allowed_roots: list[Path] = Field(default_factory=list)
