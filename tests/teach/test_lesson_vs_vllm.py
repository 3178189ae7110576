"""Lesson 15, nanoengine vs vLLM v1: its check diffs the student's run against the committed trace
of vLLM v1's own scheduler on the lesson's scenario."""

from __future__ import annotations

import pytest

from tracer.teach.lessons import find_lesson, reference_solution, run_lesson_checks, student_functions
from tracer.teach.swap import plugged

LESSON = find_lesson("15")


def test_lesson_15_has_its_files_fits_80_columns_and_ends_with_vllm():
    for name in ("README.md", "exercise.py", "hint.md", "check.py", "scenario.json"):
        assert (LESSON.path / name).is_file(), name
    for path in (LESSON.readme, LESSON.hint, LESSON.exercise):
        wide = [n for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if len(line) > 80]
        assert not wide, f"{path}: lines {wide} are wider than 80 columns"
    last = LESSON.readme.read_text(encoding="utf-8").rsplit("\n## ", 1)[1]
    assert last.startswith("In vLLM\n") and "vllm/v1/" in last and "nanovllm/" in last


def test_the_reference_solution_matches_vllm(tmp_path):
    path = tmp_path / "exercise.py"
    path.write_text(reference_solution(LESSON), encoding="utf-8")
    results = run_lesson_checks(LESSON, student_functions(LESSON, path), path)
    assert [(r.name, r.passed) for r in results] == [("check_choose_victim", True), ("engine_matches_vllm", True)]


def test_the_stub_fails():
    results = run_lesson_checks(LESSON, student_functions(LESSON, LESSON.exercise), LESSON.exercise)
    assert results[0].status == "stub" and not any(r.passed for r in results)


def test_preempting_the_oldest_is_named_at_the_step_vllm_preempts_the_newest():
    module = LESSON.checks_module()
    with plugged({"choose_victim": lambda running: running[0]}):
        with pytest.raises(AssertionError) as failure:
            module.engine_matches_vllm(None)
    message = " ".join(str(failure.value).split())
    assert message.startswith("your run and vLLM's part ways at step 4,"), message
    assert "vllm 0.33.0" in message and "preempted" in message
