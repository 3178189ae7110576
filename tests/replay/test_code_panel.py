"""The code panel (`c`): the engine function behind the step's event, read from the trace's own
sources, the deciding line marked ▶ and scrolled into view; the student's own function in a lesson
trace; "no source recorded" on traces from before sources were recorded."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_async
from textual.containers import ScrollableContainer

from tracer.cli.main import main
from tracer.export.frames import DEFAULT_SIZE, PROJECTOR_SIZE, render_frames
from tracer.replay.app import ReplayApp
from tracer.replay.decision_code import NO_SOURCE, code_lines
from tracer.teach.demos import DEMOS, run_demo
from tracer.teach.lessons import find_lesson, load_module
from tracer.teach.scenarios import load_scenario, run_scenario
from tracer.teach.swap import plugged, replacements_for
from tracer.trace.trace_file import load_trace

DATA = Path(__file__).parents[1] / "data"
SIZE = (160, 48)  # tall: the machine keeps 9 rows, the code takes the rest
STUDENT_CHOOSE_VICTIM = '''
def choose_victim(running):
    """My own: the newest request goes first."""
    newest = running[-1]
    return newest
'''


@pytest.fixture(scope="module")
def preemption(tmp_path_factory):
    run = run_demo(DEMOS["preemption"], "tiny", tmp_path_factory.mktemp("demo"))[0]
    return load_trace(run.trace_path), run.focus_step


def shown_text(app: ReplayApp) -> str:
    return "\n".join(code_lines(app.code.code))


def deciding_line_is_visible(app: ReplayApp) -> bool:
    code = app.code.code
    index, line = code.focus
    row = sum(1 + len(s.lines) for s in code.sections[:index]) + 1 + line + (1 if code.note else 0)
    body = app.code.query_one(ScrollableContainer)
    return body.scroll_y <= row < body.scroll_y + body.size.height


@run_async
async def test_c_at_the_preemption_shows_make_room_and_preempt_with_the_deciding_line(preemption):
    trace, focus = preemption
    app = ReplayApp(trace, start_step=focus, animations=False)
    async with app.run_test(size=SIZE) as pilot:
        assert not app.code.display
        await pilot.press("c")
        await pilot.pause()
        assert app.code.display and app.machine.display  # 48 rows: both
        code = app.code.code
        names = [s.name for s in code.sections]
        assert "Scheduler.make_room" in names and "Scheduler.preempt" in names
        make_room = code.sections[names.index("Scheduler.make_room")]
        deciding = make_room.lines[make_room.deciding - make_room.first_line]
        assert "self.preempt(" in deciding
        assert code.title.startswith("PREEMPTED") and "decided in Scheduler.make_room" in code.title
        assert code.vllm.startswith("vLLM v1: ") and "_preempt_request" in code.vllm
        assert f"▶ {make_room.deciding} │ " in shown_text(app)  # a symbol, not colour alone
        await pilot.pause()
        assert deciding_line_is_visible(app)
        await pilot.press("n")  # the next event moves the panel with it
        await pilot.pause()
        assert app.step_index > focus and app.code.code.title != code.title
        await pilot.press("c")
        assert not app.code.display


@run_async
async def test_a_short_terminal_gives_the_code_the_machines_place(preemption):
    trace, focus = preemption
    app = ReplayApp(trace, start_step=focus, animations=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("c")
        await pilot.pause()
        assert app.code.display and not app.machine.display
        body = app.code.query_one(ScrollableContainer)
        assert body.size.height >= 4  # the batch and the title gave it rows: 4 lines of code, not 2
        await pilot.pause()
        assert deciding_line_is_visible(app)  # the ▶ line, not scrolled off the panel's few rows
        await pilot.press("c")
        assert app.machine.display


@run_async
async def test_lesson_8_shows_the_students_choose_victim(tmp_path):
    exercise = tmp_path / "08_preemption" / "exercise.py"
    exercise.parent.mkdir()
    exercise.write_text(STUDENT_CHOOSE_VICTIM, encoding="utf-8")
    lesson = find_lesson("8")
    functions = {"choose_victim": load_module(exercise, "student_l8").choose_victim}  # as lesson trace does
    scenario = load_scenario(lesson.scenario_file, name=lesson.name)
    with plugged(replacements_for({"choose_victim": "choose_victim"}, functions)):
        run = run_scenario(scenario, tmp_path / "l8.jsonl", model="tiny")
    trace = load_trace(run.trace_path)
    preempted = next(i for i, s in enumerate(trace.steps) if any(e["kind"] == "preempted" for e in s["events"]))
    app = ReplayApp(trace, start_step=preempted, animations=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("c")
        await pilot.pause()
        mine = [s for s in app.code.code.sections if s.name == "choose_victim"]
        assert mine and not mine[0].engine and mine[0].file == "08_preemption/exercise.py"
        assert "called by Scheduler.make_room" in mine[0].role
        text = shown_text(app)
        assert '"""My own: the newest request goes first."""' in text and "swapped in: your code" in text


VLLM_TRACE = Path(__file__).parents[2] / "tracer" / "vllm" / "traces" / "08_preemption.jsonl"


@pytest.mark.parametrize("path", [DATA / "trace_v1.jsonl", DATA / "replay_small.jsonl", VLLM_TRACE])
@run_async
async def test_old_traces_and_vllms_say_no_source_recorded(path):
    trace = load_trace(path)
    index = next(i for i, s in enumerate(trace.steps) if s["events"])
    app = ReplayApp(trace, start_step=index, animations=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("c")
        await pilot.pause()
        assert app.code.code.note == NO_SOURCE and not app.code.code.sections
        assert "no source recorded" in shown_text(app)


def test_replay_text_prints_the_code_with_its_deciding_line(preemption, capsys):
    trace, focus = preemption
    assert main(["replay", str(trace.path), "--step", str(focus), "--text"]) == 0
    out = capsys.readouterr().out
    assert "decided in Scheduler.make_room" in out and "vLLM v1: " in out
    assert any(line.startswith("▶") and "self.preempt(" in line for line in out.splitlines())
    assert main(["replay", str(DATA / "trace_v1.jsonl"), "--step", "3", "--text"]) == 0
    assert NO_SOURCE in capsys.readouterr().out


def test_the_html_export_frames_show_the_code_panel(preemption):
    trace, focus = preemption
    (frame,) = render_frames(trace, [focus], DEFAULT_SIZE)
    assert "make_room" in frame and "preempt" in frame and "▶" in frame
    (small,) = render_frames(trace, [focus], PROJECTOR_SIZE)  # too short for both: the machine stays
    assert "make_room" not in small
