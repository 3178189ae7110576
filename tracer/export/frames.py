"""The replay TUI's own picture of each step, as SVG: the frames of the browser replay.

    render_frames(trace, indices, size=(160, 48), on_frame=None) -> list[str]

The real ReplayApp runs headless (Textual's run_test) at a fixed terminal size; for each step
index it jumps there and exports an SVG screenshot. No second set of views: what the browser
shows is what `nanoengine replay` shows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from tracer.trace.trace_file import Trace

DEFAULT_SIZE = (160, 48)  # columns, rows: the size the demos' SVG frames use


def render_frames(
    trace: Trace,
    indices: Sequence[int],
    size: tuple[int, int] = DEFAULT_SIZE,
    on_frame: Callable[[int], None] | None = None,
) -> list[str]:
    """One SVG per step index, in order; on_frame(n) after the n-th frame (1-based)."""
    return asyncio.run(render_frames_async(trace, indices, size, on_frame))


async def render_frames_async(
    trace: Trace, indices: Sequence[int], size: tuple[int, int], on_frame: Callable[[int], None] | None
) -> list[str]:
    from tracer.replay.app import ReplayApp

    app = ReplayApp(trace, start_step=indices[0] if indices else 0, animations=False)
    frames: list[str] = []
    async with app.run_test(size=size) as pilot:
        app.clear_notifications()  # a frame shows the step, not a toast from opening the file
        for n, index in enumerate(indices, start=1):
            app.go_to(index)
            await pilot.pause()
            frames.append(app.export_screenshot(simplify=True))
            if on_frame is not None:
                on_frame(n)
    return frames
