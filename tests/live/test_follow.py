"""Following a trace that another writer is still appending to (`nanoengine replay --follow`): the
timeline grows, the view follows the newest step, a half-written line is waited for, and browsing
history stops following until End. The file is written by the test, line by line."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_async

from tracer.live.follow import follow_app, followed_path
from tracer.live.source import GrowingTrace
from tracer.replay.views.timeline import TimelineView
from tracer.trace.trace_file import CACHE_STEPS, TraceError

TRACE = Path(__file__).parents[1] / "data" / "replay_small.jsonl"
LINES = TRACE.read_bytes().splitlines(keepends=True)  # header + 14 steps
SIZE = (100, 30)


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def test_a_half_written_line_is_waited_for_not_damage(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"")
    source = GrowingTrace(path)
    assert source.poll() == 0 and not source.has_header
    append(path, LINES[0][:20])  # the header, half written
    assert source.poll() == 0 and not source.has_header
    append(path, LINES[0][20:] + LINES[1] + LINES[2][:-30])
    assert source.poll() == 1 and source.has_header
    assert [m.step for m in source.marks] == [0]
    append(path, LINES[2][-30:])
    assert source.poll() == 1
    assert source.steps[1]["step"] == 1 and source.requests.keys() >= {0, 1}


def test_a_damaged_complete_line_is_an_error(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"".join(LINES[:3]))
    source = GrowingTrace(path)
    assert source.poll() == 2
    append(path, b'{"type": "step", "step": 1, "oops"\n')  # a step number that does not rise, too
    with pytest.raises(TraceError, match="line 4"):
        source.poll()


def test_the_reader_survives_a_rename_and_holds_few_parsed_steps(tmp_path):
    partial = tmp_path / "served.jsonl.partial"
    partial.write_bytes(b"".join(LINES[:2]))
    assert followed_path(tmp_path / "served.jsonl") == partial  # the server still records into .partial
    source = GrowingTrace(followed_path(tmp_path / "served.jsonl"))
    source.poll()
    partial.rename(tmp_path / "served.jsonl")  # the server stopped: FILE.partial -> FILE
    append(tmp_path / "served.jsonl", b"".join(LINES[2:]))
    assert source.poll() == len(LINES) - 2
    for i in range(len(source.steps)):
        assert source.steps[i]["step"] == source.marks[i].step
    assert len(source.steps.cache) <= min(CACHE_STEPS, len(source.steps))
    source.close()


@run_async
async def test_the_view_follows_new_steps_and_browsing_stops_following(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"".join(LINES[:4]))  # header + 3 steps
    source = GrowingTrace(path)
    source.poll()
    app = follow_app(source, animations=False)
    async with app.run_test(size=SIZE) as pilot:
        assert app.step_index == 2 and app.model.following  # opens at the newest step
        append(path, b"".join(LINES[4:6]) + LINES[6][:50])  # two steps and half of a third
        app.poll()
        await pilot.pause()
        assert len(app.steps) == 5 and app.model.following and app.step_index == 4
        assert app.current_step["step"] == 4
        assert not app.model.broken
        await pilot.press("left", "left")
        assert app.step_index == 2 and not app.model.following
        append(path, LINES[6][50:] + LINES[7])
        app.poll()
        await pilot.pause()
        assert len(app.steps) == 7 and app.step_index == 2  # browsing: the view stays
        assert app.query_one(TimelineView).step_numbers[-1] == 6  # the timeline grew
        await pilot.press("end")
        assert app.model.following and app.step_index == 6
        append(path, b"".join(LINES[8:]))
        app.poll()
        await pilot.pause()
        assert app.step_index == len(LINES) - 2 and app.current_step["step"] == len(LINES) - 2


@run_async
async def test_steps_that_arrive_while_a_dialog_is_open_are_taken_behind_it(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"".join(LINES[:4]))
    source = GrowingTrace(path)
    source.poll()
    app = follow_app(source, animations=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")  # the help screen covers the views
        await pilot.pause()
        assert app.screen is not app.screen_stack[0]
        append(path, b"".join(LINES[4:7]))
        app.poll()
        await pilot.pause()
        assert app.is_running and not app.model.broken
        assert app.step_index == 5 and app.current_step["step"] == 5
        await pilot.press("escape")
        await pilot.pause()
        assert app.query_one(TimelineView).step_numbers[-1] == 5
        assert app.query_one("#narration").content.plain.startswith("Step 5")
    append(path, b"".join(LINES[7:9]))
    app.poll()  # the poll timer may fire once more while the app closes: it waits, nothing is lost
    assert not app.model.broken and len(app.steps) == 6


@run_async
async def test_an_empty_file_waits_for_its_first_step(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(LINES[0])
    source = GrowingTrace(path)
    source.poll()
    app = follow_app(source, animations=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("right", "g", "space", "end", "s")  # nothing to show yet: no crash
        assert app.is_running and not app.steps
        append(path, b"".join(LINES[1:4]))  # three steps in one read: the newest is shown
        app.poll()
        await pilot.pause()
        assert app.current_step["step"] == 2 and app.step_index == 2 and app.model.following
        assert app.query_one("#narration").content.plain.startswith("Step 2")


def test_follow_refuses_a_redirected_terminal_and_a_missing_file(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    env.pop("TEXTUAL_DRIVER", None)
    run = functools.partial(subprocess.run, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    out = run([sys.executable, "-m", "tracer.cli.main", "replay", "--follow", str(TRACE)])
    assert out.returncode == 2 and "interactive terminal" in out.stderr and "Traceback" not in out.stderr
    out = run([sys.executable, "-m", "tracer.cli.main", "replay", "--follow", "--web", str(TRACE)])
    assert out.returncode == 2 and "cannot be combined" in out.stderr
    out = run([sys.executable, "-m", "tracer.cli.main", "replay", "--follow", str(tmp_path / "nope.jsonl")])
    assert out.returncode == 2 and "no such trace file" in out.stderr and "Traceback" not in out.stderr


def test_live_refuses_a_redirected_terminal_and_no_tui_before_the_model_loads(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    env.pop("TEXTUAL_DRIVER", None)
    run = functools.partial(
        subprocess.run, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, cwd=tmp_path
    )
    out = run([sys.executable, "-m", "tracer.cli.main", "trace", "--live", "--model", "tiny", "hi"])
    assert out.returncode == 2 and "interactive terminal" in out.stderr and "Traceback" not in out.stderr
    out = run([sys.executable, "-m", "tracer.cli.main", "trace", "--live", "--no-tui", "--model", "tiny", "hi"])
    assert out.returncode == 2 and "cannot be combined" in out.stderr
    assert not (tmp_path / "traces").exists()
