"""The replay TUI's own picture of each step, as SVG: the frames of the browser replay.

    render_frames(trace, indices, size=DEFAULT_SIZE, code=True, compare=None) -> list[str]
    stream_frames(trace, indices, size, use, code=True, compare=None)   use(n, svg) as each frame is ready

compare: a second run of the workload; each frame shows the replay's compare panel (A vs B).

The real ReplayApp runs headless (Textual's run_test) at a fixed terminal size; for each step
index it jumps there and exports an SVG screenshot. No second set of views: what the browser
shows is what `nanoengine replay` shows. What the page shows itself is left out of the frames:
Rich's imitation of a window around the terminal (title bar and three dots), the top bar (the
page has its title), the "Look for" banner, the narration (the page shows it in large type) and
the key bindings' footer (the page has its own buttons), so the panels get every row.

The default size, 140x33, is the largest whose text is still 14 px at 1280x720 in the page's
layout (21 px at 1920x1080). When the trace holds the engine's sources, a frame of 30 rows or more
shows the code panel (`c`) below the state machine (code=False: not): in the flat batch's place
below 44 rows, above it from 44 rows on (--size 160x48).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from typing import Any

from tracer.replay.svg_cells import fit_wide_text
from tracer.trace.trace_file import Trace

DEFAULT_SIZE = (140, 33)  # columns, rows: terminal text of 14 px at 1280x720, 21 px at 1920x1080
PROJECTOR_SIZE = (120, 26)  # text of about 25 px on a 1920x1080 projector, in the page's layout
CODE_ROWS = 30  # from this height a frame shows the code panel below the state machine
ON_THE_PAGE = ("#topbar", "#narration", "#banner", "Footer")  # widgets the page replaces

WINDOW_RECT = re.compile(r'<rect fill="#292929" stroke="[^"]*" stroke-width="1" [^>]*rx="8"/>')
WINDOW_TITLE = re.compile(r'<text class="terminal(?:-\d+)?-title"[^>]*>.*?</text>', re.S)
WINDOW_DOTS = re.compile(r'<g transform="translate\(26,22\)">\s*(?:<circle [^>]*/>\s*){3}</g>')
TERMINAL = re.compile(
    r'<g transform="translate\(([\d.]+), ([\d.]+)\)" clip-path="url\(#terminal(?:-\d+)?-clip-terminal\)">'
)
CLIP = re.compile(
    r'<clipPath id="terminal(?:-\d+)?-clip-terminal">\s*<rect x="0" y="0" width="([\d.]+)" height="([\d.]+)" />'
)
VIEW_BOX = re.compile(r'viewBox="[^"]*"')


def render_frames(
    trace: Trace,
    indices: Sequence[int],
    size: tuple[int, int] = DEFAULT_SIZE,
    code: bool = True,
    compare: Trace | None = None,
) -> list[str]:
    """One SVG per step index, in order."""
    frames: list[str] = []
    stream_frames(trace, indices, size, lambda n, svg: frames.append(svg), code, compare)
    return frames


def stream_frames(
    trace: Trace,
    indices: Sequence[int],
    size: tuple[int, int],
    use: Callable[[int, str], None],
    code: bool = True,
    compare: Trace | None = None,
) -> None:
    """use(n, svg) for each step index in order (n from 1), so a caller need not hold every frame.
    DiffError when compare is not a run of the same workload."""
    asyncio.run(stream_frames_async(trace, indices, size, use, code, compare))


async def stream_frames_async(
    trace: Trace,
    indices: Sequence[int],
    size: tuple[int, int],
    use: Callable[[int, str], None],
    code: bool = True,
    compare: Trace | None = None,
) -> None:
    from tracer.replay.app import ReplayApp

    app = ReplayApp(trace, start_step=indices[0] if indices else 0, animations=False, compare=compare)
    async with app.run_test(size=size) as pilot:
        app.clear_notifications()  # a frame shows the step, not a toast from opening the file
        for selector in ON_THE_PAGE:
            app.query_one(selector).display = False
        if code and size[1] >= CODE_ROWS and trace.header.get("sources"):
            show_code_panel(app, size[1])
        for n, index in enumerate(indices, start=1):
            app.go_to(index)
            use(n, fit_wide_text(without_window(await settled_screenshot(app, pilot))))


def show_code_panel(app: Any, rows: int) -> None:
    """The code panel below the state machine: the page gave the frame the rows of the top bar, the
    narration and the footer, so the machine keeps its place (the TUI's roomy layout) at fewer rows;
    below 44 rows the code takes the flat batch's rows, which a frame cannot scroll to."""
    from tracer.replay.app import ROOMY_ROWS

    app.screen.add_class("-roomy")  # set once: a run_test screen is not resized again
    app.action_toggle_code()
    if rows < ROOMY_ROWS:
        app.query_one("#batch").display = False


async def settled_screenshot(app: Any, pilot: Any, tries: int = 5) -> str:
    """The step's picture once it stops changing: on a busy machine one idle pause can still
    catch a frame before its layout settles (the SVG's ids are content hashes, so equal means equal)."""
    await pilot.pause()
    svg: str = app.export_screenshot(simplify=True)
    for _ in range(tries):
        await pilot.pause()
        again: str = app.export_screenshot(simplify=True)
        if again == svg:
            break
        svg = again
    return svg


def without_window(svg: str) -> str:
    """The terminal alone: Rich's window frame, title and three dots removed, the view box cropped
    to the terminal's cells. An SVG of another shape is returned unchanged."""
    terminal, clip = TERMINAL.search(svg), CLIP.search(svg)
    if terminal is None or clip is None:
        return svg
    x, y = terminal.groups()
    width, height = clip.groups()
    for pattern in (WINDOW_RECT, WINDOW_TITLE, WINDOW_DOTS):
        svg = pattern.sub("", svg, count=1)
    return VIEW_BOX.sub(f'viewBox="{x} {y} {width} {height}"', svg, count=1)
