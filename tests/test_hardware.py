"""The engine dtype follows the hardware when the config says `auto` (engines/hardware.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline.config.settings import Settings
from pipeline.engines import hardware


@pytest.mark.parametrize("flags,gpu,want", [
    # AVX2 alone: bf16 is emulated, 2-3x slower (docs/decisions/0014-engine-dtype-follows-the-hardware.md)
    (frozenset({"avx2"}), False, "float32"),
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


# /proc/cpuinfo excerpts of other hosts (one processor each; the flags lines cut to the relevant part)
ZEN2_AVX2 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B12 64-Core Processor
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sse sse2 ssse3 fma cx16 sse4_1 sse4_2 avx f16c avx2 bmi2 sha_ni
bogomips\t: 4499.99
"""
SKYLAKE_AVX512 = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz
flags\t\t: fpu sse sse2 avx avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni
"""
SAPPHIRE_RAPIDS = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse avx avx2 avx512f avx512bw avx512_bf16 amx_bf16 amx_tile amx_int8
vmx flags\t: vnmi preemption_timer invvpid ept_x_only
"""
GRAVITON2 = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs
CPU implementer\t: 0x41
"""


@pytest.mark.parametrize("cpuinfo,has,lacks,want", [
    (ZEN2_AVX2, {"avx2", "fma"}, {"avx512f"}, "float32"),
    (SKYLAKE_AVX512, {"avx512f", "avx512_vnni"}, {"avx512_bf16"}, "float32"),  # AVX-512 without BF16: emulated
    (SAPPHIRE_RAPIDS, {"avx512_bf16", "amx_bf16"}, {"vnmi"}, "bfloat16"),  # `vmx flags` is another line
    (GRAVITON2, set(), {"asimd", "fp"}, "float32"),  # no x86 flags line
], ids=["avx2-only", "avx512-no-bf16", "amx", "arm"])
def test_flags_and_dtype_from_other_hosts_cpuinfo(monkeypatch, cpuinfo, has, lacks, want):
    flags = hardware.cpu_flags(cpuinfo)
    assert has <= flags and not lacks & flags, sorted(flags)
    real = hardware.cpu_flags
    monkeypatch.setattr(hardware, "cpu_flags", lambda: real(cpuinfo))
    monkeypatch.setattr(hardware, "has_gpu", lambda: False)
    assert hardware.engine_dtype("auto") == want


def _flags_by_regex(text: str) -> list[frozenset[str]]:
    """Every processor's x86 flags, read here without the module's code."""
    return [frozenset(m.split()) for m in re.findall(r"^flags\s*:\s*(.*)$", text, flags=re.MULTILINE)]


def test_the_default_config_says_auto_and_this_host_reads_its_flags():
    assert Settings().engine.dtype == "auto"
    text = Path("/proc/cpuinfo").read_text()
    per_cpu = _flags_by_regex(text)
    mine = per_cpu[0] if per_cpu else frozenset()  # ARM: no x86 flags line, nothing native
    assert hardware.cpu_flags() == mine
    assert hardware.cpu_flags() is hardware.cpu_flags()  # read once, cached
    native = bool(mine & {"avx512_bf16", "amx_bf16"})
    gpu = any(Path("/proc/driver/nvidia/gpus").glob("*"))
    assert hardware.engine_dtype("auto") == ("bfloat16" if native or gpu else "float32"), (native, gpu)
    assert hardware.hardware()["native_bf16"] == ("yes" if native or gpu else "no")
