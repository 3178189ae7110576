"""The replay TUI's own picture of each step, as SVG: the frames of the browser replay.

    render_frames(trace, indices, size=(160, 48)) -> list[str]
    stream_frames(trace, indices, size, use)          use(n, svg) as each frame is ready

The real ReplayApp runs headless (Textual's run_test) at a fixed terminal size; for each step
index it jumps there and exports an SVG screenshot. No second set of views: what the browser
shows is what `nanoengine replay` shows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from tracer.trace.trace_file import Trace

DEFAULT_SIZE = (160, 48)  # columns, rows: the size the demos' SVG frames use


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
    from tracer.replay.app import ReplayApp

    app = ReplayApp(trace, start_step=indices[0] if indices else 0, animations=False)
    async with app.run_test(size=size) as pilot:
        app.clear_notifications()  # a frame shows the step, not a toast from opening the file
        for n, index in enumerate(indices, start=1):
            app.go_to(index)
            use(n, await settled_screenshot(app, pilot))


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
