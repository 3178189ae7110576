"""Swap a student's function into the live engine, and put the engine's own back afterwards.

The engine's decision functions are module attributes or class methods looked up by name at
call time, so assigning a new one works. A few are also imported by value into other engine
modules (`from nanoengine.block_manager import blocks_needed`); `plugged` patches every
nanoengine module that holds the original object, so those copies are swapped too. Tracer
modules are left alone on purpose: the invariant checker must keep using the real thing.

    with plugged({"Scheduler.check_stop": my_check_stop}):
        ...run the engine...
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tracer.trace.decisions import DECISIONS

# The engine functions a lesson may swap: the name a lesson uses -> "module:qualified name", from
# the engine's table of its decision functions. (A lesson's own TARGETS maps its exercise
# functions to these names.)
SWAPPABLE: dict[str, str] = {name: f"{d.module}:{name}" for name, d in DECISIONS.items() if d.swappable}

# Imported so that every module which may hold a copy of a target is loaded before we look.
ENGINE_MODULES = (
    "nanoengine.block_manager",
    "nanoengine.scheduler",
    "nanoengine.model_runner",
    "nanoengine.sampler",
    "nanoengine.step_record",
    "nanoengine.engine",
)


@dataclass(frozen=True, slots=True)
class Slot:
    """One place that holds a target: `owner.attr` (owner is a module or a class)."""

    owner: object
    attr: str


def parse_target(name: str) -> tuple[str, str]:
    if name not in SWAPPABLE:
        raise ValueError(f"{name!r} is not a swappable engine function; known: {', '.join(SWAPPABLE)}")
    module, qualname = SWAPPABLE[name].split(":")
    return module, qualname


def lookup(name: str) -> Callable:
    """What the engine holds for a target right now (the raw function, for methods too)."""
    owner, attr = resolve_owner(*parse_target(name))
    return owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)


def original(name: str) -> Callable:
    """The engine's own implementation of a target, even while a replacement is plugged in."""
    parse_target(name)
    return originals()[name]


def resolve_owner(module: str, qualname: str) -> tuple[object, str]:
    owner: object = importlib.import_module(module)
    *path, attr = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    return owner, attr


def slots_for(name: str) -> list[Slot]:
    """Every place the engine looks the target up: its home, plus modules that imported it by value."""
    module, qualname = parse_target(name)
    home, attr = resolve_owner(module, qualname)
    found = [Slot(home, attr)]
    if isinstance(home, type):  # a method: only its class holds it
        return found
    fn = lookup(name)
    for mod_name, mod in list(sys.modules.items()):
        if mod is home or mod is None or not mod_name.startswith("nanoengine"):
            continue
        if getattr(mod, attr, None) is fn:
            found.append(Slot(mod, attr))
    return found


@contextmanager
def plugged(replacements: dict[str, Callable]) -> Iterator[None]:
    """Run the engine with replacements[name] in place of each named target; restore on exit."""
    originals()  # before anything is swapped
    saved: list[tuple[Slot, object]] = []
    try:
        for name, fn in replacements.items():
            if not callable(fn):
                raise ValueError(f"the replacement for {name} must be a function, got {type(fn).__name__}")
            for slot in slots_for(name):
                saved.append(
                    (
                        slot,
                        slot.owner.__dict__[slot.attr]
                        if isinstance(slot.owner, type)
                        else getattr(slot.owner, slot.attr),
                    )
                )
                setattr(slot.owner, slot.attr, fn)
        yield
    finally:
        for slot, value in reversed(saved):
            setattr(slot.owner, slot.attr, value)


@functools.cache
def originals() -> dict[str, Callable]:
    """The engine's own functions, taken once, before the first swap: at the first call of
    `original` or `plugged`, not at import (the engine imports torch: `lesson list` stays quick)."""
    for module in ENGINE_MODULES:
        importlib.import_module(module)
    return {name: lookup(name) for name in SWAPPABLE}


def replacements_for(targets: dict[str, str], functions: dict[str, Callable]) -> dict[str, Callable]:
    """Map a lesson's exercise names (functions) onto engine targets (targets: exercise name -> target)."""
    return {target: functions[exercise_name] for exercise_name, target in targets.items()}
