"""Command-line defaults read from the engine's own dataclasses (EngineConfig, SamplingParams), so
a default is typed once, where the engine keeps it; --help shows the value.

    add_field_arg(p, EngineConfig, "block_size", int, _("tokens per KV block {shown}"))   # --block-size, 16
    default_of(EngineConfig, "block_size")                                                # 16

A help text names where the default goes with {shown}; add_field_arg puts the translated
"(default: %(default)s)" there, and argparse the value.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, fields
from typing import Any

from tracer.i18n import LANGUAGES, N_, _, set_language

SHOWN = N_("(default: %(default)s)")  # argparse fills in the flag's default


def shown() -> str:
    """SHOWN in the reader's language."""
    return _(SHOWN)


def with_default(help: str) -> str:
    """A (translated) help text with its {shown} filled in."""
    return help.replace("{shown}", shown())


def default_of(cls: type, name: str) -> Any:
    """The default of dataclass `cls`'s field `name`."""
    for f in fields(cls):
        if f.name == name:
            if f.default is not MISSING:
                return f.default
            if f.default_factory is not MISSING:
                return f.default_factory()
    raise ValueError(f"{cls.__name__} has no field {name!r} with a default")  # a programming error


def add_field_arg(p: argparse.ArgumentParser, cls: type, name: str, kind: type, help: str = "{shown}") -> None:
    """--name-with-dashes for field `name` of dataclass `cls`, its default the field's own."""
    p.add_argument(f"--{name.replace('_', '-')}", type=kind, default=default_of(cls, name), help=with_default(help))


class SetLanguage(argparse.Action):
    """--lang given to a command's own parser (a command run as `python -m tracer.cli.lesson`): the
    language from here on (`nanoengine` itself takes --lang out before any command builds its help)."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: str | None = None
    ) -> None:
        set_language(str(values))
        setattr(namespace, self.dest, values)


def add_lang_arg(p: argparse.ArgumentParser) -> None:
    """--lang, listed in a command's help."""
    p.add_argument(
        "--lang",
        choices=LANGUAGES,
        default=None,
        action=SetLanguage,
        help=_("the language to print in: zh (Chinese) or en (default: $NANOENGINE_LANG, else the locale)"),
    )
