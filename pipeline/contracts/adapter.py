"""An adapter's registry entry: what `control` carries and the config lists (pipeline/registries/adapters.py
holds the registry and its checks)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from pipeline.contracts.base import WireModel

AdapterState = Literal["hot", "warm", "cold", "incompatible"]
ANY_TENANT = "*"


class AdapterSpec(WireModel):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    base_model: str = Field("smollm2-135m-instruct", description="the deployment model it was trained on")
    base_revision: str = Field("", description="that model's revision ('' = not pinned)")
    revision: str = Field(min_length=1)
    path: Path = Field(description="the adapter directory (adapter_config.json + weights)")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="adapter_digest of the directory")
    rank: int = Field(ge=1)
    tenants: list[str] = Field(default_factory=list, description="who may use it; '*' = every tenant")
    state: AdapterState = "cold"
