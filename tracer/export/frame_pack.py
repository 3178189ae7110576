"""Many SVG frames of the same screen, packed small enough to mail.

    pack_frames(svgs) -> PackedFrames        shared CSS + unique lines + each frame as line numbers
    add_frame(packed, svg)                   one more frame (render and pack one at a time: little memory)
    unpack_frame(packed, i) -> str           frame i as an SVG string (what the page rebuilds)
    compress(obj) -> str                     JSON, gzip, base64 (the page undoes it with DecompressionStream)

Rich writes one SVG per screenshot with a per-file id (`terminal-<hash>`) on every class and
clip path, its own numbering of the styles it used (`.terminal-<hash>-r7 { fill: #ffd23f }`),
@font-face rules that point at a CDN, and one line per terminal row. Consecutive steps differ in
a few rows, so after giving every frame the same id and one shared numbering of styles, most
lines repeat: each unique line is stored once and a frame is a list of line numbers. The font
rules go (the page works offline; the SVG falls back to a local monospace font, and textLength
keeps the columns aligned).
"""

from __future__ import annotations

import base64
import gzip
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

UNIQUE_ID = re.compile(r"terminal-(\d+)")
STYLE_RULE = re.compile(r"\.terminal-(\d+)-r(\d+) \{ ([^}]*) \}")
FONT_FACE = re.compile(r"@font-face\s*\{[^}]*\}")
COMMENT = re.compile(r"<!--.*?-->", re.S)
FRAME_ID = "t"  # every frame's classes and clip paths: t-matrix, t-line-3, ...


class FrameFormatError(ValueError):
    """An SVG that is not Rich's terminal export (its format changed?)."""


@dataclass(slots=True)
class PackedFrames:
    base_style: str = ""  # the CSS rules that are not numbered styles (the same in every frame)
    lines: list[str] = field(default_factory=list)
    frames: list[list[int]] = field(default_factory=list)
    style_classes: dict[str, str] = field(default_factory=dict)  # css -> shared class name
    line_numbers: dict[str, int] = field(default_factory=dict)

    @property
    def style(self) -> str:
        """The CSS all frames share."""
        rules = "\n".join(f".{name} {{ {css} }}" for css, name in self.style_classes.items())
        return self.base_style + "\n" + rules


def pack_frames(svgs: Iterable[str]) -> PackedFrames:
    packed = PackedFrames()
    for svg in svgs:
        add_frame(packed, svg)
    return packed


def add_frame(packed: PackedFrames, svg: str) -> None:
    match = UNIQUE_ID.search(svg)
    if match is None or "<style>" not in svg or "</style>" not in svg:
        raise FrameFormatError("the frame is not a Rich terminal SVG (no terminal-<id> classes or no <style>)")
    uid = match.group(1)
    head, rest = svg.split("<style>", 1)
    css, body = rest.split("</style>", 1)
    local = {number: shared_class(packed, rule) for _, number, rule in STYLE_RULE.findall(css)}
    if not packed.base_style:
        packed.base_style = FONT_FACE.sub("", STYLE_RULE.sub("", css)).replace(f"terminal-{uid}", FRAME_ID).strip()

    def rename(m: re.Match) -> str:
        if m.group(1) not in local:
            raise FrameFormatError(f"style r{m.group(1)} is used but not defined in the frame's <style>")
        return local[m.group(1)]

    text = COMMENT.sub("", head) + re.sub(rf"terminal-{uid}-r(\d+)\b", rename, body)
    text = text.replace(f"terminal-{uid}", FRAME_ID)
    packed.frames.append([line_number(packed, line) for line in text.split("\n")])


def shared_class(packed: PackedFrames, css: str) -> str:
    return packed.style_classes.setdefault(css.strip(), f"s{len(packed.style_classes)}")


def line_number(packed: PackedFrames, line: str) -> int:
    number = packed.line_numbers.setdefault(line, len(packed.lines))
    if number == len(packed.lines):
        packed.lines.append(line)
    return number


def unpack_frame(packed: PackedFrames, index: int) -> str:
    return "\n".join(packed.lines[n] for n in packed.frames[index])


def compress(obj: object) -> str:
    """JSON, gzip (level 9), base64: the form the page's script reads back."""
    data = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return base64.b64encode(gzip.compress(data, 9, mtime=0)).decode("ascii")
