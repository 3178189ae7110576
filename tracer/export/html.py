"""A trace as ONE self-contained HTML file that replays it in a browser:
`nanoengine export FILE --html OUT.html [--steps A-B]` (docs/export.md).

    html_page(trace, indices, packed_frames) -> str
    write_html(trace, indices, out, size=..., on_frame=None) -> int        bytes written

The frames are the replay TUI's SVG screenshots (frames.py), packed (frame_pack.py) and embedded
as gzip + base64; the page (player.html) unpacks them with the browser's DecompressionStream.
No network, no server: it opens from disk, and mails as one attachment.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Sequence
from importlib.resources import files
from pathlib import Path

from tracer.export.frame_pack import PackedFrames, add_frame, compress, frame_ops
from tracer.export.frames import DEFAULT_SIZE, stream_frames
from tracer.replay.model import ReplayModel, focus_index
from tracer.replay.narration import narrate
from tracer.trace.trace_file import Trace

PLACEHOLDER = re.compile(r"\{\{([A-Z_]+)\}\}")


def html_page(trace: Trace, indices: Sequence[int], packed: PackedFrames) -> str:
    """The page: the replay model's step numbers, narration and n / p stops for the chosen steps."""
    model = ReplayModel(trace)
    numbers = [model.step_numbers[i] for i in indices]
    events = set(model.event_indices)
    focus = focus_index(trace)
    payload: dict[str, object] = {
        "steps": numbers,
        "narration": [narrate(trace.steps[i], model.header) for i in indices],
        "events": [n for n, i in enumerate(indices) if i in events],
        "focus": indices.index(focus) if focus in indices else None,
        "look_for": trace.header.get("look_for") or "",
        "pieces": packed.pieces,
        "frame_ops": frame_ops(packed.frames),
    }
    title = trace.title or trace.path.name
    config = trace.header.get("config", {})
    subtitle = (
        f"· {trace.header.get('model', '?')} · block_size {config.get('block_size', '?')} · "
        f"budget {config.get('max_num_batched_tokens', '?')} tokens · steps {numbers[0]}–{numbers[-1]}"
    )
    fields = {
        "TITLE": html.escape(title),
        "SUBTITLE": html.escape(subtitle),
        "FRAME_STYLE": packed.style,
        "DATA": compress(payload),
    }
    template = files("tracer.export").joinpath("player.html").read_text(encoding="utf-8")
    return PLACEHOLDER.sub(lambda m: fields[m.group(1)], template)  # one pass: a title may hold "{{...}}"


def write_html(
    trace: Trace,
    indices: Sequence[int],
    out: Path,
    size: tuple[int, int] = DEFAULT_SIZE,
    on_frame: Callable[[int], None] | None = None,
) -> int:
    """Render, pack and write the page; returns its size in bytes."""
    if not indices:
        raise ValueError("no steps to export: choose a --steps range inside the trace")
    packed = PackedFrames()

    def pack(n: int, svg: str) -> None:
        add_frame(packed, svg)
        if on_frame is not None:
            on_frame(n)

    stream_frames(trace, indices, size, pack)
    data = html_page(trace, indices, packed).encode("utf-8")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
    return len(data)
