"""The committed vLLM traces by name, so a command works from any folder.

tracer/vllm/traces/NAME.jsonl ships as package data (vLLM v1's scheduler on every lesson's and
demo's workload). Wherever a command reads a trace file, `vllm:NAME` names one of them:

    nanoengine replay vllm:08_preemption
    nanoengine diff my-lessons/traces/15_vs_vllm.jsonl vllm:15_vs_vllm

    vllm_trace_names() -> list[str]      every NAME, sorted
    vllm_trace(name) -> Path             the file; ValueError (one line, the names listed) if unknown
    resolve_trace(argument) -> Path      a command's trace argument: vllm:NAME or a path
"""

from __future__ import annotations

import atexit
import contextlib
from importlib.resources import as_file, files
from pathlib import Path

from tracer.i18n import _

PREFIX = "vllm:"
SUFFIX = ".jsonl"

# A package installed as a zip has no files on disk: as_file copies one out until the process ends.
extracted = contextlib.ExitStack()
atexit.register(extracted.close)


def traces_folder():  # a Traversable: a Path, or a place inside a zip
    return files("tracer.vllm").joinpath("traces")


def vllm_trace_names() -> list[str]:
    return sorted(f.name.removesuffix(SUFFIX) for f in traces_folder().iterdir() if f.name.endswith(SUFFIX))


def vllm_trace(name: str) -> Path:
    name = name.removesuffix(SUFFIX)
    names = vllm_trace_names()
    if name not in names:
        raise ValueError(
            _("no committed vLLM trace {name!r}; choose one of: {names}").format(name=name, names=", ".join(names))
        )
    return extracted.enter_context(as_file(traces_folder().joinpath(name + SUFFIX)))


def resolve_trace(argument: str | Path) -> Path:
    """`vllm:NAME` is the committed vLLM trace NAME (a file of that name is given as ./vllm:NAME)."""
    text = str(argument)
    return vllm_trace(text.removeprefix(PREFIX)) if text.startswith(PREFIX) else Path(text)
