"""The replay TUI's own picture of each step, as SVG: the frames of the browser replay.

    render_frames(trace, indices, size=(160, 48)) -> list[str]
    stream_frames(trace, indices, size, use)          use(n, svg) as each frame is ready

The real ReplayApp runs headless (Textual's run_test) at a fixed terminal size; for each step
index it jumps there and exports an SVG screenshot. No second set of views: what the browser
shows is what `nanoengine replay` shows. What the page shows itself is left out of the frames:
Rich's imitation of a window around the terminal (title bar and three dots), the top bar (the
page has its title), the "Look for" banner, the narration (the page shows it in large type) and
the key bindings' footer (the page has its own buttons), so the panels get every row. A frame tall
enough for the state machine and the code panel together (44 rows, as the default 160x48) shows
the code panel (`c`) too, when the trace holds the engine's sources.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from typing import Any

from tracer.trace.trace_file import Trace

DEFAULT_SIZE = (160, 48)  # columns, rows: the size the demos' SVG frames use
PROJECTOR_SIZE = (120, 26)  # text of about 25 px on a 1920x1080 projector, in the page's layout
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


def render_frames(trace: Trace, indices: Sequence[int], size: tuple[int, int] = DEFAULT_SIZE) -> list[str]:
    """One SVG per step index, in order."""
    frames: list[str] = []
    stream_frames(trace, indices, size, lambda n, svg: frames.append(svg))
    return frames


def stream_frames(trace: Trace, indices: Sequence[int], size: tuple[int, int], use: Callable[[int, str], None]) -> None:
    """use(n, svg) for each step index in order (n from 1), so a caller need not hold every frame."""
    asyncio.run(stream_frames_async(trace, indices, size, use))


async def stream_frames_async(
    trace: Trace, indices: Sequence[int], size: tuple[int, int], use: Callable[[int, str], None]
) -> None:
    from tracer.replay.app import ROOMY_ROWS, ReplayApp

    app = ReplayApp(trace, start_step=indices[0] if indices else 0, animations=False)
    async with app.run_test(size=size) as pilot:
        app.clear_notifications()  # a frame shows the step, not a toast from opening the file
        for selector in ON_THE_PAGE:
            app.query_one(selector).display = False
        if size[1] >= ROOMY_ROWS and trace.header.get("sources"):
            app.action_toggle_code()
        for n, index in enumerate(indices, start=1):
            app.go_to(index)
            use(n, without_window(await settled_screenshot(app, pilot)))


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
