"""The engine dtype follows the hardware when the config says `auto` (engines/hardware.py)."""

from __future__ import annotations

import pytest

from pipeline.config.settings import Settings
from pipeline.engines import hardware


@pytest.mark.parametrize("flags,gpu,want", [
    (frozenset({"avx2"}), False, "float32"),  # bf16 emulated: 2-3x slower (ARCHITECTURE.md)
    (frozenset({"avx2", "avx512f", "avx512_bf16"}), False, "bfloat16"),
    (frozenset({"amx_bf16"}), False, "bfloat16"),
    (frozenset(), True, "bfloat16"),
])
def test_auto_picks_native_bf16_or_float32(monkeypatch, flags, gpu, want):
    monkeypatch.setattr(hardware, "cpu_flags", lambda: flags)
    monkeypatch.setattr(hardware, "has_gpu", lambda: gpu)
    assert hardware.engine_dtype("auto") == want
    assert hardware.hardware()["native_bf16"] == ("yes" if want == "bfloat16" else "no")


def test_an_explicit_dtype_is_kept(monkeypatch):
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset())
    assert hardware.engine_dtype("bfloat16") == "bfloat16" and hardware.engine_dtype("float32") == "float32"


def test_the_default_config_says_auto_and_this_host_reads_its_flags():
    assert Settings().engine.dtype == "auto"
    flags = hardware.cpu_flags()
    assert flags and flags == hardware.cpu_flags.__wrapped__()  # read from /proc/cpuinfo once, cached
    assert hardware.engine_dtype("auto") == ("bfloat16" if flags & hardware.NATIVE_BF16_FLAGS or hardware.has_gpu()
                                             else "float32")
