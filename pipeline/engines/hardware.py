"""What this host computes well: the CPU's flags, whether it has native bfloat16, and so the dtype
an engine should run in when the config says `auto`.

Measured (docs/decisions/0014-engine-dtype-follows-the-hardware.md): on an AVX2-only EPYC, vLLM's CPU
build runs SmolLM2-135M in bfloat16 at ~19 tok/s whatever the batch (bf16 matmuls are emulated), and
in float32 at ~53 tok/s with 16 requests in flight; on a host with native bf16, bf16 is the faster."""

from __future__ import annotations

import os
import platform
from functools import cache
from pathlib import Path

NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The x86 flags of /proc/cpuinfo's text: `cpuinfo` when given (tests feed other hosts'), else
    this host's, read once. Empty on a CPU whose cpuinfo has no `flags` line (ARM says `Features`)."""
    if cpuinfo is None:
        return _host_flags()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


@cache
def _host_flags() -> frozenset[str]:
    try:
        return cpu_flags(Path("/proc/cpuinfo").read_text())
    except OSError:
        return frozenset()


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def has_gpu() -> bool:
    gpus = Path("/proc/driver/nvidia/gpus")
    return gpus.is_dir() and any(gpus.iterdir())


def engine_dtype(configured: str) -> str:
    """`auto`: bfloat16 where it is native (a GPU, or a CPU with AVX512-BF16/AMX), else float32."""
    if configured != "auto":
        return configured
    return "bfloat16" if has_gpu() or NATIVE_BF16_FLAGS & cpu_flags() else "float32"


def hardware() -> dict[str, str]:
    import psutil

    return {"cpu": cpu_model(), "cores": str(os.cpu_count() or 0),
            "memory_gib": f"{psutil.virtual_memory().total / 2**30:.1f}", "machine": platform.machine(),
            "gpu": "present" if has_gpu() else "none",
            "native_bf16": "yes" if has_gpu() or NATIVE_BF16_FLAGS & cpu_flags() else "no"}
