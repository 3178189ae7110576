"""The replay at 80x24, a laptop's default terminal: the narration is whole, `z` fills the screen
with the focused panel (drawn at the screen's width, no hatching), the help's glossary keeps every
upstream path whole."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from rich.console import Console
from textual.geometry import Region

from tracer.replay.app import ReplayApp
from tracer.replay.narration import narrate
from tracer.trace.trace_file import load_trace

TRACE = Path(__file__).parents[1] / "data" / "replay_small.jsonl"
SIZE = (80, 24)
PATH = re.compile(r"[\w.]+/[\w./]+\.py|\w+/\w+/[\w/]*")


def lines_of(widget) -> list[str]:
    size = widget.size  # the border's title row included
    strips = widget.render_lines(Region(0, 0, size.width, max(size.height, widget.virtual_size.height + 1)))
    return ["".join(segment.text for segment in strip).rstrip() for strip in strips]


def test_the_narration_is_never_clipped_at_80x24():
    trace = load_trace(TRACE)

    async def run() -> None:
        app = ReplayApp(trace, animations=False)
        async with app.run_test(size=SIZE) as pilot:
            for index, step in enumerate(trace.steps):
                app.go_to(index)
                await pilot.pause()
                narration = app.query_one("#narration")
                console = Console(width=narration.content_size.width)
                needed = len(console.render_lines(console.render_str(narrate(step, app.header)), pad=False))
                assert narration.content_size.height >= needed, f"step {step['step']}: {needed} lines needed"
                assert app.batch.region.height >= 3 and app.batch.region.bottom <= SIZE[1] - 1

    asyncio.run(run())


def test_z_fills_the_screen_with_each_panel_at_80x24():
    trace = load_trace(TRACE)

    async def run() -> None:
        for tabs, panel in enumerate(("machine", "kv", "seqs", "batch")):
            app = ReplayApp(trace, start_step=8, animations=False)
            async with app.run_test(size=SIZE) as pilot:
                await pilot.press(*["tab"] * tabs, "z")
                await pilot.pause()
                widget = app.query_one(f"#{panel}")
                assert app.screen.maximized is widget
                assert widget.region.width == SIZE[0] and widget.region.height >= SIZE[1] - 1, panel
                if panel == "machine":  # the drawing fits: FINISHED's box closes inside the screen
                    rows = lines_of(widget)
                    assert any(row.endswith("┐") for row in rows) and "✓ FINISHED" in "".join(rows)
                if panel == "kv":  # laid out at the screen's width: 16 blocks wrap onto a second row
                    labels = [row.split("│")[0].strip() for row in lines_of(widget) if "│" in row]
                    assert labels[:2] == ["0", "12"], labels

    asyncio.run(run())


def test_the_glossary_keeps_paths_whole_at_80x24():
    trace = load_trace(TRACE)

    async def run() -> list[str]:
        app = ReplayApp(trace, animations=False)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("question_mark")
            await pilot.pause()
            return lines_of(app.screen.query_one("#glossary"))

    lines = asyncio.run(run())
    from tracer.replay.glossary import GLOSSARY

    paths = {p.rstrip(")") for term in GLOSSARY for p in PATH.findall(" ".join(term))}
    assert len(paths) > 20
    text = "\n".join(lines)
    for path in paths:
        assert path in text, f"{path} is broken across lines"
