"""Plant a bug in an engine function: a few named lines of its *current* source, edited.

A planted bug is not a copy of an engine function with a line changed (a copy drifts when the
engine moves on); it is a Patch: the function's name and a few edits (old text -> new text). Each
old text must occur exactly once in the function's source as the engine has it now, so a patch
that no longer fits fails loudly instead of planting a bug into yesterday's engine.

    patch = Patch("Scheduler.preempt", (Edit("self.waiting.appendleft(seq)", "self.waiting.append(seq)  # BUG: ..."),))
    with plugged({patch.target: planted(patch)}):
        ...run the engine with the bug...

The broken function is compiled in its engine module's own globals (it sees the names the
engine's function sees) and its source is kept in linecache, so tracebacks and the trace's code
panel show the planted lines.
"""

from __future__ import annotations
import __future__

import ast
import importlib
import inspect
import io
import linecache
import textwrap
import tokenize
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tracer.teach.swap import SWAPPABLE, original
from tracer.trace.decisions import DECISIONS


class PatchDoesNotApply(ValueError):
    """The engine's function no longer holds a line the patch edits: update the patch."""


@dataclass(frozen=True, slots=True)
class Edit:
    old: str  # text of the function's current source (dedented), found exactly once
    new: str  # what replaces it


@dataclass(frozen=True, slots=True)
class Patch:
    target: str  # a name in tracer.trace.decisions ("Scheduler.preempt"), or "module:Qualified.name"
    edits: tuple[Edit, ...]


def engine_function(target: str) -> Callable:
    """The engine's own function for a target (a swappable one even while a replacement is plugged in)."""
    if target in SWAPPABLE:
        return original(target)
    if target in DECISIONS:
        module, qualname = DECISIONS[target].module, target
    else:
        module, _, qualname = target.partition(":")
    if not qualname:
        raise ValueError(
            f"{target!r} is neither an engine decision (tracer.trace.decisions) nor 'module:Qualified.name'"
        )
    owner: object = importlib.import_module(module)
    *path, attr = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    return inspect.unwrap(owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr))


def engine_source(target: str) -> str:
    """The engine function's current source, dedented (a method reads like a plain function)."""
    return textwrap.dedent(inspect.getsource(engine_function(target)))


def apply_edits(source: str, patch: Patch) -> str:
    for edit in patch.edits:
        found = source.count(edit.old)
        if found != 1:
            where = "is not in" if found == 0 else f"occurs {found} times in"
            raise PatchDoesNotApply(
                f"the patch for {patch.target} no longer applies: {edit.old.strip()!r} {where} "
                f"the engine's current {patch.target}"
            )
        source = source.replace(edit.old, edit.new)
    return source


def planted_source(patch: Patch) -> str:
    """The engine function's current source with the patch's edits applied."""
    return apply_edits(engine_source(patch.target), patch)


def planted(patch: Patch) -> Callable:
    """The engine's current function with the patch applied, ready for tracer.teach.swap.plugged."""
    fn = engine_function(patch.target)
    module = inspect.getmodule(fn)
    if module is None:
        raise ValueError(f"{patch.target}: no module holds {fn!r}")
    source = planted_source(patch)
    filename = f"<planted {patch.target}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    code = compile(source, filename, "exec", flags=future_flags(fn), dont_inherit=True)
    defined: dict[str, Any] = {}
    exec(code, vars(module), defined)  # the def lands in `defined`; the function's globals are the module's
    broken = defined.get(fn.__name__)
    if not inspect.isfunction(broken) or len(defined) != 1:
        raise PatchDoesNotApply(f"the patch for {patch.target} must leave one function named {fn.__name__}")
    broken.__qualname__ = fn.__qualname__
    return broken


def future_flags(fn: Callable) -> int:
    """The `from __future__ import ...` features (annotations) the engine function was compiled with."""
    every = sum(getattr(__future__, name).compiler_flag for name in __future__.all_feature_names)
    return int(fn.__code__.co_flags & every)


# ---- the same code, laid out differently (a lesson's copy, wrapped to 80 columns) ---------------
def same_code(a: str, b: str) -> bool:
    """True when two sources differ only in layout: the same syntax tree, the same docstring
    words, the same comments in the same order."""
    return code_shape(a) == code_shape(b)


def code_shape(source: str) -> tuple[str, list[str]]:
    tree = ast.parse(textwrap.dedent(source))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body:
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                if isinstance(first.value.value, str):
                    first.value.value = " ".join(first.value.value.split())
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    comments = [t.string for t in tokens if t.type == tokenize.COMMENT]
    return ast.dump(tree), comments
