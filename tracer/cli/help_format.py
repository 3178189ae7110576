"""argparse for the commands: help that wraps by terminal cells, so Chinese help lines fit the
terminal too, and a bad argument said in one line.

argparse wraps with textwrap, which counts characters and breaks only at spaces: a Chinese help
text (two cells a character, few spaces) runs past the right edge. HelpFormatter counts cells and
may break between two CJK characters, never inside a word or an identifier, and never before
closing punctuation (，。：）...)."""

from __future__ import annotations

import argparse
import re
from typing import Any, NoReturn

from rich.cells import cell_len

from tracer.i18n import _

CJK = "\u2e80-\u9fff\u3000-\u303f\uff00-\uffef"
TOKEN = re.compile(rf"\s+|[{CJK}]|[^\s{CJK}]+")
NO_LINE_START = set("，。、；：！？）」』》〉】")


def wrap_cells(text: str, width: int) -> list[str]:
    """text in lines of at most width cells (a word longer than width gets a line of its own)."""
    lines: list[str] = []
    line, space = "", False
    for token in TOKEN.findall(text):
        if token.isspace():
            space = True
            continue
        piece = (" " if space and line else "") + token
        if line and cell_len(line + piece) > width and token not in NO_LINE_START:
            lines.append(line)
            piece = token
            line = ""
        line += piece
        space = False
    return lines + [line] if line else lines


def has_wide(text: str) -> bool:
    return cell_len(text) != len(text)


class HelpFormatter(argparse.HelpFormatter):
    """argparse's own wrapping for English (the same lines as ever); cells for wide text."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        if not has_wide(text):
            return super()._split_lines(text, width)
        return wrap_cells(" ".join(text.split()), width)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if not has_wide(text):
            return super()._fill_text(text, width, indent)
        return "\n".join(indent + line for line in wrap_cells(" ".join(text.split()), width - len(indent)))


class ArgumentParser(argparse.ArgumentParser):
    """The commands' parser: HelpFormatter, and a bad argument said in one line (argparse prints
    its whole usage first: twenty lines for generate; `--help` still shows it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        # argparse's own line (its message id: in the reader's language), without the usage first
        self.exit(2, _("%(prog)s: error: %(message)s\n") % {"prog": self.prog, "message": message})
