"""The replay model without a screen (tracer/replay/model.py) on tests/data/replay_small.jsonl:
navigation, n / p stops, g's step numbers, selection, a growing source, and no Textual loaded by
the model or the HTML export."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tracer.live.source import GrowingTrace
from tracer.replay.marks import EVENT_KINDS, is_event_step
from tracer.replay.model import ReplayModel, focus_index
from tracer.trace.trace_file import TraceError, load_lazy, load_trace

TRACE = Path(__file__).parents[1] / "data" / "replay_small.jsonl"
LINES = TRACE.read_bytes().splitlines(keepends=True)  # header + 14 steps


@pytest.fixture(scope="module")
def trace():
    return load_trace(TRACE)


def test_the_model_and_the_html_export_load_no_textual():
    code = "import sys, tracer.replay.model, tracer.export.html; print(sorted(m for m in sys.modules if m.startswith('textual')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_go_to_clamps_and_says_whether_it_moved(trace):
    model = ReplayModel(trace, start=99)
    assert model.index == len(trace.steps) - 1 and model.at_newest
    assert not model.go_to(1000)
    assert model.go_to(-5) and model.index == 0
    assert model.previous is None and model.current["step"] == model.step_number == trace.steps[0]["step"]
    assert model.go_to(3) and model.previous == trace.steps[2]


def test_n_and_p_stop_at_event_steps_only(trace):
    model = ReplayModel(trace)
    stops = [i for i, s in enumerate(trace.steps) if s["violations"] or {e["kind"] for e in s["events"]} & EVENT_KINDS]
    assert model.event_indices == stops and stops
    seen = []
    while (target := model.event_from(1)) is not None:
        model.go_to(target)
        seen.append(target)
    assert seen == [i for i in stops if i > 0]
    assert model.event_from(-1) == ([i for i in stops if i < model.index] or [None])[-1]
    model.go_to(0)
    assert model.event_from(-1) is None
    assert all(is_event_step(trace.marks[i]) for i in stops)


def test_a_step_number_maps_to_its_index_or_says_where_it_went(trace):
    model = ReplayModel(trace)
    assert model.index_of_number(trace.steps[4]["step"]) == (4, "")
    index, note = model.index_of_number(10_000)
    assert index == len(trace.steps) - 1 and "past the end" in note


def test_a_step_that_cannot_be_read_keeps_the_step_shown(tmp_path):
    lines = TRACE.read_text(encoding="utf-8").splitlines()
    lines[4] = lines[4].replace('"seqs":[', '"seqs":[[[', 1)  # step index 3: broken where a lazy scan does not look
    path = tmp_path / "damaged.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    model = ReplayModel(load_lazy(path))
    assert model.go_to(2)
    with pytest.raises(TraceError, match="line 5"):
        model.go_to(3)
    with pytest.raises(TraceError, match="line 5"):  # the step before it is read too, for what changed
        model.go_to(4)
    assert model.index == 2 and model.go_to(5)


def test_selection_prefers_the_selected_owner_of_a_clicked_block(trace):
    model = ReplayModel(trace)
    assert model.owner_to_select([2, 0]) == 2
    model.select(0)
    assert model.owner_to_select([2, 0]) == 0 and model.owner_to_select([]) is None
    model.select(2, block=5)
    assert (model.selection.seq, model.selection.block) == (2, 5)


def test_a_growing_source_is_followed_until_browsed(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"".join(LINES[:3]))
    source = GrowingTrace(path)
    source.poll()
    model = ReplayModel(source, start=1)
    assert model.grows and model.following and model.step_numbers == [0, 1]
    path.write_bytes(b"".join(LINES[:6]))
    assert model.poll() == 3 and len(model.step_numbers) == len(model.marks) == 5
    model.show_newest()
    assert model.index == 4 and model.following
    model.go_to(2)
    assert not model.following
    model.go_to(4)
    assert model.following
    path.write_bytes(b"".join(LINES[:6]) + b'{"type": "step", "step": 1}\n')  # a step number that does not rise
    with pytest.raises(TraceError):
        model.poll()
    assert model.broken and model.poll() == 0
    source.close()


def test_a_static_trace_does_not_grow_and_focus_is_an_index(trace):
    model = ReplayModel(trace)
    assert not model.grows and model.poll() == 0
    assert focus_index(trace) is None
    focused = type(trace)(trace.path, dict(trace.header, focus_step=trace.steps[5]["step"]), trace.steps, trace.marks)
    assert focus_index(focused) == 5
