"""Build a C kernel at first use with the machine's C compiler, for this CPU, and load it.

One shared library per (source, flags, compiler, CPU): a cache key, so an edited kernel or a home
directory shared by machines with different CPUs gets its own build. Built into a temporary file
and renamed into place, so processes that build at once never load a half-written library. Linked
against libgomp, which resolves to the one torch has already loaded: the kernel's threads are
torch's threads."""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from nanoengine.loading.checkpoint import cache_dir

# -O3 and this CPU's vector instructions. No -ffast-math: it would switch the whole process to
# flush denormals, and reassociated sums would make a result depend on its buffers' alignment. No
# contraction: a * b + c rounds twice, as torch's elementwise ops do, unless a kernel asks for a
# fused multiply-add by name (fmaf). No trapping math: the kernels never read the floating-point
# exception flags, and without it gcc keeps a loop with a select (e^x's clamps) scalar on AVX2.
FLAGS = (
    "-O3",
    "-march=native",
    "-fopenmp",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-ffp-contract=off",
    "-shared",
    "-fPIC",
)
# The code an AVX2 CPU runs, built on any x86 CPU: the tests check it on CPUs with AVX-512 too.
AVX2_ONLY = (*FLAGS, "-mno-avx512f")
BUILD_TIMEOUT_S = 120
INCLUDE = re.compile(r'^#include "(\w+\.c)"', re.MULTILINE)  # another kernel's source, built in


class KernelUnavailable(RuntimeError):
    """This machine cannot build or load the kernel; the message says why, in one line."""


def compiler() -> str:
    found = shutil.which(os.environ.get("CC", "cc"))
    if found is None:
        raise KernelUnavailable(f"no C compiler ({os.environ.get('CC', 'cc')}): install gcc to use the compiled kernel")
    return found


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's line of instruction-set flags, as /proc/cpuinfo spells it (empty where unreadable)."""
    try:
        lines = cpuinfo.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return next((line for line in lines if line.startswith(("flags", "Features"))), "")


def has_avx2() -> bool:
    """Whether this CPU has AVX2 and FMA, which the kernels' AVX2 code asks for."""
    return {"avx2", "fma"} <= set(cpu_flags().split())


def library_path(source: Path, cc: str, flags: tuple[str, ...] = FLAGS) -> Path:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    headers = [header.read_text() for header in sorted(source.parent.glob("*.h"))]  # it may include
    included = [source.parent.joinpath(name).read_text() for name in INCLUDE.findall(source.read_text())]
    key = "\n".join([source.read_text(), *headers, *included, " ".join(flags), version, cpu_flags()])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_dir() / "kernels" / f"{source.stem}-{digest}.so"


def build(source: Path, flags: tuple[str, ...] = FLAGS) -> Path:
    """The kernel's shared library, compiled now unless a build of this very source is cached. The
    tests pass other flags to build the AVX2 code on a CPU with AVX-512 too."""
    cc = compiler()
    target = library_path(source, cc, flags)
    if target.exists():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, partial = tempfile.mkstemp(suffix=".so", dir=target.parent)
    except OSError as error:
        raise KernelUnavailable(f"cannot write the kernel to {target.parent}: {error.strerror}") from None
    os.close(fd)
    try:
        done = subprocess.run(
            [cc, *flags, str(source), "-o", partial, "-lm"],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
        )
        if done.returncode != 0:
            first = (done.stderr.strip().splitlines() or ["no output"])[0]
            raise KernelUnavailable(f"{Path(cc).name} could not build {source.name}: {first}")
        os.replace(partial, target)
    except subprocess.TimeoutExpired:
        raise KernelUnavailable(f"building {source.name} took over {BUILD_TIMEOUT_S} s") from None
    finally:
        Path(partial).unlink(missing_ok=True)
    return target


def load(source: Path, flags: tuple[str, ...] = FLAGS) -> ctypes.CDLL:
    path = build(source, flags)
    try:
        return ctypes.CDLL(str(path))
    except OSError as error:
        raise KernelUnavailable(f"could not load {path.name}: {error}") from None
