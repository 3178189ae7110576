"""Every planted engine bug still plants into the engine as it is (tracer.teach.plant): each patch's
lines are in the engine function's current source, and the planted function differs from it. An
engine change that moves a patched line fails here, naming the function and the line."""

from __future__ import annotations

import inspect

import pytest
from engine_bugs import BUGS, DECISION_BUGS, SAMPLE_BUGS

from nanoengine.scheduler import Scheduler, SchedulerOutput
from tracer.teach.kit import make_scheduler, prefilled
from tracer.teach.lessons import all_lessons
from tracer.teach.plant import Edit, Patch, PatchDoesNotApply, engine_function, engine_source, planted, same_code

PATCHES = {
    **{f"mutation {key}": bug.patch for key, bug in BUGS.items()},
    **{f"decision {key}": patch for key, patch in DECISION_BUGS.items()},
    **{f"samples {key}": patch for key, patch in SAMPLE_BUGS.items()},
    **{f"lesson {lesson.name}": lesson.planted_bug for lesson in all_lessons() if lesson.planted_bug},
}


def test_every_bug_hunt_lesson_plants_a_patch():
    hunts = [lesson for lesson in all_lessons() if "_bughunt_" in lesson.name]
    assert len(hunts) == 4 and all(f"lesson {lesson.name}" in PATCHES for lesson in hunts)


@pytest.mark.parametrize("name", sorted(PATCHES))
def test_the_patch_applies_to_the_current_engine(name):
    patch = PATCHES[name]
    broken, own = planted(patch), engine_function(patch.target)
    assert broken.__name__ == own.__name__ and broken.__globals__ is own.__globals__
    assert list(inspect.signature(broken).parameters) == list(inspect.signature(own).parameters)
    assert not same_code(inspect.getsource(broken), engine_source(patch.target))
    # what it runs differs, not only a comment: its bytecode or the names it looks up (append for appendleft)
    assert (broken.__code__.co_code, broken.__code__.co_names) != (own.__code__.co_code, own.__code__.co_names)


LESSON_PATCHES = [patch for key, patch in PATCHES.items() if key.startswith("lesson")]


@pytest.mark.parametrize("name", sorted(key for key, patch in PATCHES.items() if patch not in LESSON_PATCHES))
def test_a_test_bug_says_what_is_missing(name):
    """A test's bug is marked `# BUG:` on its line; a lesson's is not (the student finds it)."""
    assert any("# BUG: " in edit.new for edit in PATCHES[name].edits)


@pytest.mark.parametrize("patch", LESSON_PATCHES, ids=lambda p: p.target)
def test_a_lesson_bug_is_not_marked(patch):
    assert not any("BUG" in edit.new for edit in patch.edits)


def test_a_line_gone_from_the_engine_is_named():
    gone = Patch(
        "Scheduler.recompute_later",
        (Edit("self.waiting.appendleft(seq)", "x"), Edit("seq.num_cached_tokens = 1", "")),
    )
    with pytest.raises(PatchDoesNotApply, match=r"Scheduler\.recompute_later.*'seq\.num_cached_tokens = 1' is not in"):
        planted(gone)


def test_a_line_found_twice_is_named():
    twice = Patch("Scheduler.make_room", (Edit("return ", "return not "),))
    with pytest.raises(
        PatchDoesNotApply, match=r"'return' occurs 2 times in the engine's current Scheduler\.make_room"
    ):
        planted(twice)


def test_the_planted_function_runs_in_the_engine_modules_globals(monkeypatch):
    """It calls what the engine module holds at call time, like the engine's own function."""
    tail = planted(
        Patch("Scheduler.recompute_later", (Edit("self.waiting.appendleft(seq)", "self.waiting.append(seq)"),))
    )
    monkeypatch.setattr(Scheduler, "recompute_later", tail)
    sched = make_scheduler(16)
    a, b = prefilled(sched, 9, 10)
    sched.waiting.append(object())  # someone waiting: the tail is not the head
    sched.preempt(b, SchedulerOutput(), a)
    assert sched.waiting[-1] is b and b.block_table == []


def test_same_code_ignores_layout_but_not_code_words_or_comments():
    code = 'def f(a, b):\n    """Add a to\n    b."""\n    return a + b  # the sum\n'
    assert same_code(
        code, 'def f(\n    a, b\n):\n    """Add a to b."""\n    return (\n        a + b\n    )  # the sum\n'
    )
    assert not same_code(code, code.replace("a + b", "a - b"))
    assert not same_code(code, code.replace("Add a", "Add b"))
    assert not same_code(code, code.replace("the sum", "a sum"))
