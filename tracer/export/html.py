"""A trace as ONE self-contained HTML file that replays it in a browser:
`nanoengine export FILE --html OUT.html [--steps A-B]` (docs/export.md).

    html_page(trace, indices, packed_frames, notes=None, compare=None) -> str
    write_html(trace, indices, out, size=..., code=True, notes=None, compare=None, on_frame=None) -> int
                                                                            bytes written
compare: a second run of the workload (`--compare B`): the frames show the replay's compare panel,
the subtitle names both files and their config differences.

notes: speaker notes by step number (notes.py), shown in a window of their own (`s` in the page).

The frames are the replay TUI's SVG screenshots (frames.py), packed (frame_pack.py) and embedded
as gzip + base64; the page (player.html) unpacks them with the browser's DecompressionStream.
No network, no server: it opens from disk, and mails as one attachment.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Mapping, Sequence
from importlib.resources import files
from pathlib import Path

from tracer.export.frame_pack import PackedFrames, add_frame, compress, frame_ops
from tracer.export.frames import DEFAULT_SIZE, stream_frames
from tracer.export.page_text import page_language, strings_json
from tracer.i18n import _
from tracer.replay.beams import BeamScores, has_pruning
from tracer.replay.model import ReplayModel, focus_index
from tracer.replay.narration import narrate
from tracer.replay.views.side_labels import side_labels
from tracer.trace.trace_file import Trace

PLACEHOLDER = re.compile(r"\{\{([A-Z_]+)\}\}")


def html_page(
    trace: Trace,
    indices: Sequence[int],
    packed: PackedFrames,
    notes: Mapping[int, str] | None = None,
    compare: Trace | None = None,
) -> str:
    """The page: the replay model's step numbers, narration and n / p stops for the chosen steps."""
    model = ReplayModel(trace)
    numbers = [model.step_numbers[i] for i in indices]
    notes = notes or {}
    events = set(model.event_indices)
    focus = focus_index(trace)
    scores = BeamScores()  # a pruned beam's why needs the beams' cumulative logprobs

    def narration(i: int) -> str:
        step = trace.steps[i]
        return narrate(step, model.header, scores.at(trace.steps, i) if has_pruning(step) else None)

    payload: dict[str, object] = {
        "steps": numbers,
        "narration": [narration(i) for i in indices],
        "events": [n for n, i in enumerate(indices) if i in events],
        "focus": indices.index(focus) if focus in indices else None,
        "look_for": trace.header.get("look_for") or "",
        "notes": [notes.get(n, "") for n in numbers] if notes else None,
        "pieces": packed.pieces,
        "frame_ops": frame_ops(packed.frames),
    }
    title = trace.title or trace.path.name
    if compare is not None:
        label_a, label_b, differences = side_labels(trace, compare)
        title = _("{title} · A = {a} vs B = {b} ({differences})").format(
            title=title, a=label_a, b=label_b, differences=differences
        )
    config = trace.header.get("config", {})
    budget = _("budget {budget} tokens").format(budget=config.get("max_num_batched_tokens", "?"))
    steps = _("steps {first}–{last}").format(first=numbers[0], last=numbers[-1])
    subtitle = f"· {trace.header.get('model', '?')} · block_size {config.get('block_size', '?')} · {budget} · {steps}"
    fields = {
        "LANG": page_language(),
        "TITLE": html.escape(title),
        "SUBTITLE": html.escape(subtitle),
        "FRAME_STYLE": packed.style,
        "STRINGS": strings_json(),
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
    code: bool = True,
    notes: Mapping[int, str] | None = None,
    compare: Trace | None = None,
) -> int:
    """Render, pack and write the page; returns its size in bytes. ValueError (one line) for no
    steps, or notes for a step the trace does not have."""
    if not indices:
        raise ValueError(_("no steps to export: choose a --steps range inside the trace"))
    check_notes(trace, notes or {})
    packed = PackedFrames()

    def pack(n: int, svg: str) -> None:
        add_frame(packed, svg)
        if on_frame is not None:
            on_frame(n)

    stream_frames(trace, indices, size, pack, code, compare)
    data = html_page(trace, indices, packed, notes, compare).encode("utf-8")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
    return len(data)


def check_notes(trace: Trace, notes: Mapping[int, str]) -> None:
    """Notes for a step number the trace lacks are a typo: say so (notes outside --steps are fine)."""
    numbers = {marks.step for marks in trace.marks}
    missing = sorted(set(notes) - numbers)
    if missing:
        raise ValueError(
            _("--notes: {name} has no step {step} (its steps are {first}-{last})").format(
                name=trace.path.name, step=missing[0], first=min(numbers), last=max(numbers)
            )
        )
