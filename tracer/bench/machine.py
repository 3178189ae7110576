"""Which CPU ran the bench, and which vector instructions its kernels used.

A bench compared across machines (an AVX-512 Xeon, an AVX2-only EPYC) must say which it was, and
whether the instruction set was capped: ATEN_CPU_CAPABILITY (torch's own kernels),
ONEDNN_MAX_CPU_ISA (the oneDNN linears) and MKL_ENABLE_INSTRUCTIONS (MKL) make an AVX-512 machine
run the AVX2 code paths, e.g. `nanoengine bench` under all three set to AVX2."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from tracer.kernels.build import cpu_flags

ISA_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's marketing name ("AMD EPYC 7763 64-Core Processor"), else the platform's word."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def has_amx(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether the CPU has AMX's bf16 tiles (oneDNN's bf16 linears and tracer/kernels/amx_gemv.c use
    them; torch's capability string does not say)."""
    return "amx_bf16" in cpu_flags(cpuinfo).split()


def describe_cpu() -> dict:
    import torch

    return {
        "model": cpu_model(),
        "cores": os.cpu_count(),
        "isa": torch.backends.cpu.get_cpu_capability(),  # the widest torch's kernels use here
        "amx": has_amx(),
        "isa_caps": {name: os.environ[name] for name in ISA_CAPS if os.environ.get(name)},
    }


def cpu_line(cpu: dict | None) -> str:
    """One line for the report's header; empty for reports written before the CPU was recorded."""
    if not cpu:
        return ""
    caps = ", ".join(f"{k}={v}" for k, v in cpu.get("isa_caps", {}).items())
    capped = f" (capped: {caps})" if caps else ""
    amx = " with AMX" if cpu.get("amx") else ""
    return f"CPU {cpu['model']}, {cpu['cores']} cores, {cpu['isa']}{amx}{capped}"
