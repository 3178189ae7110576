"""The bug-hunt lessons (11 on): each ships a real engine bug in exercise.py. The shipped file fails
`lesson check`, its engine check names the invariant the hint explains, `lesson trace` + `nanoengine
check` find it in the recorded trace, and the engine's own code (the fix) passes. All on the tiny model."""

from __future__ import annotations

import ast
import re

import pytest

from tracer.cli.lesson import lesson_main
from tracer.cli.main import main
from tracer.teach.lessons import (
    all_lessons,
    reference_solution,
    run_lesson_checks,
    student_functions,
)
from tracer.teach.plant import engine_source, planted_source, same_code
from tracer.teach.scenarios import load_scenario, run_scenario
from tracer.teach.swap import SWAPPABLE
from tracer.trace.invariants import INVARIANTS, check_trace
from tracer.trace.trace_file import load_trace

BUG_HUNTS = [lesson for lesson in all_lessons() if "_bughunt_" in lesson.name]
# lesson -> the invariant its planted bug breaks first, and at which step of its scenario
FIRES = {
    "11_bughunt_zero_query": ("batch_membership", 4),
    "12_bughunt_stale_cached_count": ("block_table_coverage", 3),
    "13_bughunt_duplicate_hash": ("unique_prefix_hash", 0),
    "14_bughunt_stale_hash_entry": ("kv_content", 7),
}
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_four_bug_hunts_after_the_ten_lessons():
    assert [lesson.name for lesson in BUG_HUNTS] == sorted(FIRES)
    for lesson in BUG_HUNTS:
        for name in ("README.md", "exercise.py", "hint.md", "check.py", "scenario.json"):
            assert (lesson.path / name).is_file(), f"{lesson.name} lacks {name}"
        assert set(lesson.targets.values()) <= set(SWAPPABLE), lesson.name
        text = lesson.readme.read_text(encoding="utf-8")
        story = lesson.solved.read_text(encoding="utf-8")  # told by `lesson check` once the fix passes
        assert story.startswith("## In real engines\n") and "In real engines" not in text
        for path in (lesson.readme, lesson.hint, lesson.exercise, lesson.solved):
            wide = [n for n, line in enumerate(path.read_text().splitlines(), 1) if len(line) > 80]
            assert not wide, f"{path}: lines {wide} are wider than 80 columns"


def exercise_function(lesson) -> str:
    """The source of the exercise's function (the one the lesson plugs in)."""
    source = lesson.exercise.read_text(encoding="utf-8")
    (name,) = lesson.targets
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.get_source_segment(source, node) or ""


@pytest.mark.parametrize("lesson", BUG_HUNTS, ids=lambda l: l.name)
def test_the_exercise_is_the_engines_function_with_the_planted_bug(lesson):
    """exercise.py cannot drift from the engine: its function is the engine's current one with the
    lesson's patch (planted.py) applied, laid out for 80 columns."""
    patch = lesson.planted_bug
    assert patch is not None and patch.target == lesson.targets[next(iter(lesson.targets))]
    expected = planted_source(patch)
    assert same_code(exercise_function(lesson), expected), (
        f"{lesson.exercise} no longer matches the engine's {patch.target} with its planted bug: "
        f"replace its function with this one (wrapped to 80 columns):\n{expected}"
    )


@pytest.mark.parametrize("lesson", BUG_HUNTS, ids=lambda l: l.name)
def test_the_fix_in_the_last_hint_is_the_engines_own_code(lesson):
    engine = {line.strip() for line in engine_source(lesson.planted_bug.target).splitlines()}
    code = re.search(r"```python\n(.*?)```", lesson.hint_tiers()[-1], re.S)
    assert code, f"{lesson.hint}: the last tier shows no code"
    shown = [line.strip() for line in code.group(1).splitlines() if line.strip()]
    assert [line for line in shown if line not in engine] == []


@pytest.mark.parametrize("lesson", BUG_HUNTS, ids=lambda l: l.name)
def test_the_shipped_bug_fails_and_names_its_invariant(lesson):
    invariant, step = FIRES[lesson.name]
    results = run_lesson_checks(lesson, student_functions(lesson, lesson.exercise), lesson.exercise)
    assert results[0].status == "failed", results[0]  # the direct check catches it
    assert invariant in INVARIANTS and f"`{invariant}`" in lesson.hint.read_text(encoding="utf-8")


@pytest.mark.parametrize("lesson", BUG_HUNTS, ids=lambda l: l.name)
def test_the_engine_check_alone_names_the_invariant(lesson, tmp_path):
    """With the direct checks skipped, the engine run reports the invariant the hint names."""
    invariant, step = FIRES[lesson.name]
    module = lesson.checks_module()
    engine_check = next(getattr(module, n) for n in dir(module) if n.startswith("engine_"))
    from types import SimpleNamespace

    from tracer.teach.swap import plugged, replacements_for

    functions = student_functions(lesson, lesson.exercise)
    with plugged(replacements_for(lesson.targets, functions)):
        with pytest.raises(AssertionError, match=f"the engine broke the invariant '{invariant}' at step {step}"):
            engine_check(SimpleNamespace(**functions))


@pytest.mark.parametrize("lesson", BUG_HUNTS, ids=lambda l: l.name)
def test_the_fix_passes(lesson, tmp_path):
    path = tmp_path / "exercise.py"
    path.write_text(reference_solution(lesson), encoding="utf-8")
    results = run_lesson_checks(lesson, student_functions(lesson, path), path)
    assert [(r.name, r.message) for r in results if not r.passed] == []
    assert any(r.name.startswith("engine_") for r in results)


@pytest.mark.parametrize("lesson", BUG_HUNTS, ids=lambda l: l.name)
def test_the_scenario_is_clean_with_the_engines_own_code(lesson, tmp_path):
    path = tmp_path / "trace.jsonl"
    run = run_scenario(load_scenario(lesson.scenario_file), path)
    assert run.violations == [] and check_trace(load_trace(path, validate="all")) == []


FIXES = {  # the line each fix adds: only the last hint tier (and solved.md) may show it
    "11_bughunt_zero_query": "(seq.num_tokens - 1) //",
    "12_bughunt_stale_cached_count": "num_cached_tokens = 0",
    "13_bughunt_duplicate_hash": "not in self.hash_to_block",
    "14_bughunt_stale_hash_entry": "del self.hash_to_block",
}


@pytest.mark.parametrize("lesson", BUG_HUNTS, ids=lambda l: l.name)
def test_the_lesson_text_does_not_give_the_fix_away(lesson):
    """The README and the first hints lead to the bug; only the last hint shows the fix."""
    fix = FIXES[lesson.name]
    assert fix in reference_solution(lesson)
    assert fix not in lesson.readme.read_text(encoding="utf-8")
    tiers = lesson.hint_tiers()
    assert len(tiers) >= 3 and fix in tiers[-1]
    assert all(fix not in tier for tier in tiers[:-1]), [fix in tier for tier in tiers]
    first = tiers[0]
    assert "lesson trace" in first and f"`{FIRES[lesson.name][0]}`" in first  # where to look, by name


def test_a_student_finds_the_bug_with_trace_and_check(tmp_path, capsys):
    folder = tmp_path / "my-lessons"
    assert lesson_main(["start", "--dir", str(folder)]) == 0
    assert lesson_main(["trace", "14", "--dir", str(folder), "--no-tui"]) == 1
    assert "which holds the KV of seq" in capsys.readouterr().out  # another request's prefix, named
    trace = folder / "traces" / "14_bughunt_stale_hash_entry.jsonl"
    assert main(["check", str(trace)]) == 1
    assert "kv_content" in capsys.readouterr().out
    mine = folder / "14_bughunt_stale_hash_entry" / "exercise.py"
    assert lesson_main(["check", "14", "--dir", str(folder)]) == 1
    assert "In real engines" not in capsys.readouterr().out  # the story names the fix: not before it
    mine.write_text(reference_solution(BUG_HUNTS[-1]), encoding="utf-8")
    assert lesson_main(["check", "14", "--dir", str(folder)]) == 0
    assert "In real engines" in capsys.readouterr().out
    assert lesson_main(["trace", "14", "--dir", str(folder), "--no-tui"]) == 0
    assert main(["check", str(trace)]) == 0
