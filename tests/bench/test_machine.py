"""The bench names the CPU it ran on and the vector instructions its kernels used."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest
from conftest import HANG_S

from tracer.bench.machine import cpu_line, cpu_model, describe_cpu, has_amx

X86 = platform.machine().lower() in ("x86_64", "amd64")


def test_the_cpu_model_is_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7763 64-Core Processor\n")
    assert cpu_model(info) == "AMD EPYC 7763 64-Core Processor"
    assert cpu_model(tmp_path / "missing") != ""  # the platform's word instead, never an error


def test_the_report_line_says_when_the_instruction_set_was_capped():
    cpu = {"model": "X", "cores": 2, "isa": "AVX2", "isa_caps": {"ONEDNN_MAX_CPU_ISA": "AVX2"}}
    assert cpu_line(cpu) == "CPU X, 2 cores, AVX2 (capped: ONEDNN_MAX_CPU_ISA=AVX2)"
    assert cpu_line({**cpu, "isa_caps": {}}) == "CPU X, 2 cores, AVX2"
    assert cpu_line(None) == ""  # a report written before the CPU was recorded
    assert cpu_line({**cpu, "isa": "AVX512", "amx": True, "isa_caps": {}}) == "CPU X, 2 cores, AVX512 with AMX"


def test_amx_is_read_from_the_cpus_flags(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx512f amx_bf16 amx_tile amx_int8\n")
    assert has_amx(info)
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16\n")
    assert not has_amx(info)
    assert not has_amx(tmp_path / "missing")


@pytest.mark.skipif(not X86, reason="AVX2 and AVX-512 are x86 instruction sets")
def test_capping_the_instruction_set_is_seen_by_torch():
    code = "import json\nfrom tracer.bench.machine import describe_cpu\nprint(json.dumps(describe_cpu()))"
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S, env=env)
    assert result.returncode == 0, result.stderr
    capped = json.loads(result.stdout)
    assert capped["isa"] == "DEFAULT"  # torch's own kernels without AVX2 or AVX-512
    assert capped["isa_caps"] == {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert describe_cpu()["isa"] != "DEFAULT" or os.environ.get("ATEN_CPU_CAPABILITY")
