"""Many SVG frames of the same screen, packed small enough to mail.

    pack_frames(svgs) -> PackedFrames        shared CSS + unique pieces + each frame as piece numbers
    add_frame(packed, svg)                   one more frame (render and pack one at a time: little memory)
    unpack_frame(packed, i) -> str           frame i as an SVG string (what the page rebuilds)
    frame_ops(frames) / expand_ops(ops)      each frame as edits of the one before, and back
    compress(obj) -> str                     JSON, gzip, base64 (the page undoes it with DecompressionStream)

Rich writes one SVG per screenshot with a per-file id (`terminal-<hash>`) on every class and
clip path, its own numbering of the styles it used (`.terminal-<hash>-r7 { fill: #ffd23f }`),
and @font-face rules that point at a CDN. After giving every frame the same id and one shared
numbering of styles, consecutive steps share most of their SVG elements: each distinct piece (one
`<text>`/`<rect>` element, or the text between them) is stored once and a frame is a list of
piece numbers, sent as edits of the previous frame's list (frame_ops). The font rules go (the page
works offline; the SVG falls back to a local monospace font, and textLength keeps the columns
aligned).
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
PIECE_END = re.compile(r"(?<=</text>)|(?<=/>)|(?<=\n)")  # split after each element and each line
FRAME_ID = "t"  # every frame's classes and clip paths: t-matrix, t-line-3, ...


class FrameFormatError(ValueError):
    """An SVG that is not Rich's terminal export (its format changed?)."""


@dataclass(slots=True)
class PackedFrames:
    base_style: str = ""  # the CSS rules that are not numbered styles (the same in every frame)
    pieces: list[str] = field(default_factory=list)
    frames: list[list[int]] = field(default_factory=list)
    style_classes: dict[str, str] = field(default_factory=dict)  # css -> shared class name
    piece_numbers: dict[str, int] = field(default_factory=dict)

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
    packed.frames.append([piece_number(packed, piece) for piece in PIECE_END.split(text) if piece])


def shared_class(packed: PackedFrames, css: str) -> str:
    return packed.style_classes.setdefault(css.strip(), f"s{len(packed.style_classes)}")


def piece_number(packed: PackedFrames, piece: str) -> int:
    number = packed.piece_numbers.setdefault(piece, len(packed.pieces))
    if number == len(packed.pieces):
        packed.pieces.append(piece)
    return number


def unpack_frame(packed: PackedFrames, index: int) -> str:
    return "".join(packed.pieces[n] for n in packed.frames[index])


def frame_ops(frames: list[list[int]]) -> list[list[int]]:
    """Each frame as edits of the previous one: -k copies the previous frame's next k piece
    numbers (same positions), a number >= 0 is that piece. Most of a step's screen is unchanged."""
    ops: list[list[int]] = []
    previous: list[int] = []
    for frame in frames:
        edits, i = [], 0
        while i < len(frame):
            j = i
            while j < len(frame) and j < len(previous) and previous[j] == frame[j]:
                j += 1
            if j > i:
                edits.append(i - j)
                i = j
            else:
                edits.append(frame[i])
                i += 1
        ops.append(edits)
        previous = frame
    return ops


def expand_ops(ops: list[list[int]]) -> list[list[int]]:
    """frame_ops undone (player.html does the same in JavaScript)."""
    frames: list[list[int]] = []
    previous: list[int] = []
    for edits in ops:
        frame: list[int] = []
        for op in edits:
            if op < 0:
                frame.extend(previous[len(frame) : len(frame) - op])
            else:
                frame.append(op)
        frames.append(frame)
        previous = frame
    return frames


def compress(obj: object) -> str:
    """JSON, gzip (level 9), base64: the form the page's script reads back."""
    data = json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
    return base64.b64encode(gzip.compress(data, 9, mtime=0)).decode("ascii")
