"""Violations in full (bug hunt 12, the exercise's planted bug in Scheduler.recompute_later): the bar names
how many and shows the clearest whole; `v` lists every one with its invariant's rule, its cell and
the function it checks; Enter shows that function (the student's) in the code panel; the
offending cells of the sequences table are marked ✗."""

from __future__ import annotations

import pytest
from conftest import run_async
from textual.widgets import OptionList, Static

from tracer.replay.app import ReplayApp
from tracer.replay.violations import ViolationsScreen
from tracer.teach.lessons import find_lesson, load_module
from tracer.teach.scenarios import load_scenario, run_scenario
from tracer.teach.swap import plugged
from tracer.trace.invariants.rule import rule_named
from tracer.trace.trace_file import load_trace


@pytest.fixture(scope="module")
def bug_hunt(tmp_path_factory):
    lesson = find_lesson("12")
    buggy = load_module(lesson.exercise, "bughunt_12_as_shipped").recompute_later
    with plugged({"Scheduler.recompute_later": buggy}):
        run = run_scenario(load_scenario(lesson.scenario_file), tmp_path_factory.mktemp("l12") / "t.jsonl", "tiny")
    trace = load_trace(run.trace_path)
    first = next(i for i, step in enumerate(trace.steps) if step["violations"])
    return trace, first


@run_async
async def test_v_lists_every_violation_and_enter_shows_the_students_function(bug_hunt):
    trace, first = bug_hunt
    violations = trace.steps[first]["violations"]
    assert len(violations) >= 3 and "preempt_resets" in {v["invariant"] for v in violations}
    app = ReplayApp(trace, start_step=first, animations=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        bar = str(app.query_one("#violations", Static).render())
        assert f"{len(violations)} invariant violations" in bar and "v: all" in bar
        assert "preempt_resets" in bar  # the clearest: its invariant names the function it checks
        victim = next(v["seq_id"] for v in violations if v["invariant"] == "preempt_resets")
        cached = [row[3].plain for sid, row in zip(app.seqs.row_ids, app.seqs.rows) if sid == victim]
        assert cached and cached[0].startswith("✗")  # the offending cell: a symbol, not colour alone
        await pilot.press("v")
        await pilot.pause()
        assert isinstance(app.screen, ViolationsScreen)
        options = app.screen.query_one(OptionList)
        assert options.option_count == len(violations)
        entries = [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]
        for v, entry in zip(app.screen.violations, entries):
            assert f"rule: {rule_named(v['invariant']).text}" in entry and v["message"] in entry
        assert "code: Scheduler.recompute_later" in entries[0] and "your code" in entries[0]
        await pilot.press("enter")
        await pilot.pause()
        assert not isinstance(app.screen, ViolationsScreen) and app.code.display
        (section,) = app.code.code.sections
        assert section.name == "Scheduler.recompute_later" and not section.engine
        assert section.file == "12_bughunt_stale_cached_count/exercise.py"
        # recompute_later emits no event for the sequence it keeps: no line is marked as the deciding one
        assert any("self.block_manager.free(seq)" in line for line in section.lines)
