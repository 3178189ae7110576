"""Command-line defaults read from the engine's own dataclasses (EngineConfig, SamplingParams), so
a default is typed once, where the engine keeps it; --help shows the value.

    add_field_arg(p, EngineConfig, "block_size", int, f"tokens per KV block {SHOWN}")   # --block-size, 16
    default_of(EngineConfig, "block_size")                                              # 16
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, fields
from typing import Any

SHOWN = "(default: %(default)s)"  # argparse fills in the flag's default


def default_of(cls: type, name: str) -> Any:
    """The default of dataclass `cls`'s field `name`."""
    for f in fields(cls):
        if f.name == name:
            if f.default is not MISSING:
                return f.default
            if f.default_factory is not MISSING:
                return f.default_factory()
    raise ValueError(f"{cls.__name__} has no field {name!r} with a default")


def add_field_arg(p: argparse.ArgumentParser, cls: type, name: str, kind: type, help: str = SHOWN) -> None:
    """--name-with-dashes for field `name` of dataclass `cls`, its default the field's own."""
    p.add_argument(f"--{name.replace('_', '-')}", type=kind, default=default_of(cls, name), help=help)
