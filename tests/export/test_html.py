"""`nanoengine export --html`: one self-contained file holding the TUI's own frames and the narration."""

from __future__ import annotations

import base64
import dataclasses
import gzip
import html
import json
import re
from pathlib import Path

import pytest

from tracer.cli.main import main
from tracer.export.frame_pack import (
    FrameFormatError,
    compress,
    expand_ops,
    frame_ops,
    pack_frames,
    unpack_frame,
)
from tracer.export.frames import render_frames
from tracer.replay.model import viewer_header
from tracer.replay.narration import narrate

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TEXT = re.compile(r"<text[^>]*>(.*?)</text>", re.S)
TEXT_CLASS = re.compile(r'<text class="([^"]+)"')


@pytest.fixture(scope="module")
def page(tiny_trace_path, tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("html") / "replay.html"
    assert main(["export", str(tiny_trace_path), "--html", str(out)]) == 0
    return out.read_text(encoding="utf-8")


def payload(page: str) -> dict:
    data = re.search(r'<script id="frames-data" type="application/octet-stream">(.*?)</script>', page, re.S)
    assert data is not None
    unpacked = json.loads(gzip.decompress(base64.b64decode(data.group(1))))
    return unpacked | {"frames": expand_ops(unpacked["frame_ops"])}


def frame_text(svg: str) -> str:
    """The characters on the screen, row by row."""
    return html.unescape("".join(TEXT.findall(svg))).replace("\xa0", " ")


def look(name: str, rules: dict[str, str]) -> str:
    """A text's CSS: its style rule, or the class's role (t-title, terminal-123-title: 'title')."""
    return rules[name].strip() if name in rules else name.rsplit("-", 1)[-1]


def test_the_page_needs_no_network(page):
    assert "<link" not in page and " src=" not in page and "url(" not in page
    assert "@font-face" not in page
    addresses = set(re.findall(r"https?://[^\s\"'<>)]+", page))
    assert addresses <= {"http://www.w3.org/2000/svg"}  # the SVG namespace name, never fetched
    assert 'DecompressionStream("gzip")' in page


def test_one_frame_and_one_narration_per_step(tiny_trace, page):
    data = payload(page)
    header = viewer_header(tiny_trace)
    assert data["steps"] == [s["step"] for s in tiny_trace.steps]
    assert data["narration"] == [narrate(s, header) for s in tiny_trace.steps]
    assert len(data["frames"]) == len(tiny_trace.steps)
    last = tiny_trace.steps[-1]["step"]
    for number, frame in zip(data["steps"], data["frames"]):
        text = frame_text("".join(data["pieces"][n] for n in frame))
        assert f"step {number} of {tiny_trace.steps[0]['step']}–{last}" in text  # the TUI's timeline, at that step


def test_frames_keep_the_tui_picture(tiny_trace, page):
    """Packing renames classes and ids but keeps every character and every colour of the TUI's SVG."""
    indices = [0, 6, len(tiny_trace.steps) - 1]
    originals = render_frames(tiny_trace, indices)
    data = payload(page)
    style = re.search(r'<style id="frame-style">(.*?)</style>', page, re.S).group(1)
    rules = dict(re.findall(r"\.(s\d+) \{ ([^}]*) \}", style))
    for index, original in zip(indices, originals):
        packed = "".join(data["pieces"][n] for n in data["frames"][index])
        assert frame_text(packed) == frame_text(original)
        original_rules = dict(re.findall(r"\.terminal-\d+-(r\d+) \{ ([^}]*) \}", original))
        original_looks = [look(c.rsplit("-", 1)[1], original_rules) for c in TEXT_CLASS.findall(original)]
        assert [look(c, rules) for c in TEXT_CLASS.findall(packed)] == original_looks


def test_packing_shares_what_frames_repeat(tiny_trace):
    # the panels that repeat from step to step: without sources, no code panel, whose lines scroll
    # with each step's event (it costs the README example 18 KB: docs/export.md)
    trace = dataclasses.replace(tiny_trace, header={k: v for k, v in tiny_trace.header.items() if k != "sources"})
    frames = render_frames(trace, range(len(trace.steps)), (160, 48))  # the more rows, the more repeat
    packed = pack_frames(frames)
    assert [unpack_frame(packed, i).count("<text") for i in range(len(frames))] == [f.count("<text") for f in frames]
    assert sum(map(len, packed.pieces)) < sum(map(len, frames)) / 4  # most elements repeat across steps
    ops = frame_ops(packed.frames)
    assert expand_ops(ops) == packed.frames
    assert sum(map(len, ops)) < sum(map(len, packed.frames))  # a step changes part of the screen
    each_gzipped = sum(len(gzip.compress(frame.encode(), 9)) for frame in frames)
    assert len(compress({"pieces": packed.pieces, "frame_ops": ops})) < each_gzipped / 2


@pytest.mark.parametrize(
    "frames",
    [[[0, 1, 2], [0, 1, 2]], [[0, 1, 2], [0, 3, 2, 4]], [[5, 6], [], [5, 6, 7]], [[1, 2, 3], [1, 2]]],
)
def test_frame_ops_round_trip(frames):
    assert expand_ops(frame_ops(frames)) == frames


def test_a_frame_that_is_not_a_terminal_svg_is_refused():
    with pytest.raises(FrameFormatError, match="not a Rich terminal SVG"):
        pack_frames(["<svg><text>hi</text></svg>"])
    bad = '<svg><style>.terminal-1-r1 { fill: red }</style><text class="terminal-1-r2">x</text></svg>'
    with pytest.raises(FrameFormatError, match="r2 is used but not defined"):
        pack_frames([bad])


def test_steps_range_exports_only_those_steps(tiny_trace_path, tmp_path, capsys):
    out = tmp_path / "part.html"
    assert main(["export", str(tiny_trace_path), "--html", str(out), "--steps", "4-6", "--size", "120x40"]) == 0
    assert payload(out.read_text(encoding="utf-8"))["steps"] == [4, 5, 6]
    err = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
    assert "Wrote" in err and "3 steps" in err and "KB" in err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--html", "{out}", "--steps", "40-60"], "no steps in that range"),
        (["--html", "{out}", "--steps", "three"], "give step numbers as A-B"),
        (["--html", "{out}", "--steps", "6-2"], "write 2-6"),
        (["--html", "{tmp}"], "is a folder"),
        (["--html", "{out}", "--size", "10x5"], "too small for the TUI"),
        ([], "say what to write"),
    ],
)
def test_bad_arguments_get_one_line_errors(tiny_trace_path, tmp_path, capsys, args, message):
    out = tmp_path / "x.html"
    argv = ["export", str(tiny_trace_path)] + [a.format(out=out, tmp=tmp_path) for a in args]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_a_missing_trace_is_a_one_line_error(tmp_path, capsys):
    assert main(["export", str(tmp_path / "nope.jsonl"), "--html", str(tmp_path / "x.html")]) == 2
    assert "no such trace file" in capsys.readouterr().err


def test_a_trace_without_steps_is_refused(tiny_trace_path, tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text(Path(tiny_trace_path).read_text().splitlines()[0] + "\n")
    assert main(["export", str(empty), "--perfetto", str(tmp_path / "x.json")]) == 2
    assert "nothing to export" in capsys.readouterr().err
