"""The engine code behind a trace: each decision function's source, written once in the header,
and each event's `where` (the lines that emitted it, as the engine noted them on the event), so a replay shows the line that took a
decision on a machine without the engine's source (docs/trace-format.md, "Sources").

    ENGINE_FUNCTIONS: qualified name -> module, for every engine function a trace records (from
        tracer/trace/decisions.py, the engine's one table of them)
    SourceBook(): the functions as the engine holds them now (a lesson's swapped-in function is
        recorded as the student's own code, from their exercise.py)
        .entries -> {"Scheduler.preempt": {"file": ..., "line": ..., "source": ..., "engine": ...}}
        .where(frames) -> [["Scheduler.preempt", 124], ["Scheduler.make_room", 82]]
"""

from __future__ import annotations

import importlib
import inspect
import textwrap
from pathlib import Path
from types import CodeType
from typing import Any

import nanoengine
from tracer.trace.decisions import DECISIONS

# Every function that emits an event, runs a step phase or takes a decision one of them calls.
ENGINE_FUNCTIONS: dict[str, str] = {name: d.module for name, d in DECISIONS.items()}
ENGINE_ROOT = Path(nanoengine.__file__).resolve().parent.parent
ENTRIES: dict[Any, dict | None] = {}  # function -> its entry, read once per process


def bound_now(qualname: str, module: str) -> Any:
    """The function the engine calls for qualname right now (a swapped-in one too)."""
    owner: Any = importlib.import_module(module)
    *path, attr = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    return inspect.unwrap(owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr))


def shown_path(filename: str) -> str:
    """nanoengine/scheduler.py for the engine's files; the last folder and the file otherwise (a
    student's 08_preemption/exercise.py), never the folder above it (a shared trace would show it)."""
    path = Path(filename).resolve()
    if path.is_relative_to(ENGINE_ROOT / "nanoengine"):
        return path.relative_to(ENGINE_ROOT).as_posix()
    return "/".join(path.parts[-2:])


def entry_of(fn: Any) -> dict | None:
    """file, first line, source (dedented) and whether it is the engine's own; None without source."""
    if fn not in ENTRIES:
        try:
            lines, first = inspect.getsourcelines(fn)
            filename = inspect.getsourcefile(fn) or ""
        except (OSError, TypeError):
            ENTRIES[fn] = None
        else:
            file = shown_path(filename)
            source = textwrap.dedent("".join(lines))
            ENTRIES[fn] = {"file": file, "line": first, "source": source, "engine": file.startswith("nanoengine/")}
    return ENTRIES[fn]


class SourceBook:
    """The engine functions as bound when the trace's header is written, by their code objects."""

    def __init__(self) -> None:
        self.entries: dict[str, dict] = {}
        self.names: dict[CodeType, str] = {}
        for qualname, module in ENGINE_FUNCTIONS.items():
            fn = bound_now(qualname, module)
            entry = entry_of(fn)
            if entry is not None and isinstance(getattr(fn, "__code__", None), CodeType):
                self.entries[qualname] = entry
                self.names[fn.__code__] = qualname

    def where(self, frames) -> list[list[Any]]:
        """An event's emitting lines as [qualified name, line], innermost first: the frames (code,
        line) the engine took, less those of functions the book does not hold."""
        return [[self.names[code], line] for code, line in frames if code in self.names]
