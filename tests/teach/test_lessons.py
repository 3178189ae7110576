"""Lessons: the plug-in machinery, every lesson's checks (reference passes, stub fails, some
plausible mistakes fail), the scenarios' traces, and a new student's walk through lesson 1.
All on the tiny model."""

from __future__ import annotations

import functools
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from nanoengine import LLMEngine, SamplingParams
from tracer.cli.lesson import lesson_main
from tracer.teach.lessons import (
    all_lessons,
    expect_engine_matches,
    find_lesson,
    lesson_scenario,
    reference_functions,
    reference_solution,
    run_lesson_checks,
    student_functions,
)
from tracer.teach.plugins import TARGETS, original, plugged, slots_for
from tracer.teach.scenarios import load_scenario, run_scenario
from tracer.trace.invariants import check_trace
from tracer.trace.trace_file import load_trace

LESSONS = all_lessons()


def test_ten_lessons_in_order():
    assert [l.number for l in LESSONS] == list(range(1, 11))
    for lesson in LESSONS:
        for name in ("README.md", "exercise.py", "hint.md", "check.py", "scenario.json"):
            assert (lesson.path / name).is_file(), f"{lesson.name} lacks {name}"
        assert set(lesson.targets.values()) <= set(TARGETS), lesson.name


# ---- plugging ------------------------------------------------------------------------------
def counting(name: str, counts: Counter):
    fn = original(name)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        counts[name] += 1
        return fn(*args, **kwargs)

    return wrapper


def test_every_target_is_swappable_in_the_live_engine():
    """Each replacement is really called by the engine (prefix hits, chunks, preemption, sampling)."""
    counts: Counter = Counter()
    shared = list(range(3, 23))
    with plugged({name: counting(name, counts) for name in TARGETS}):
        engine = LLMEngine("tiny", block_size=4, num_kv_blocks=14, max_num_batched_tokens=8)
        for i in range(4):
            engine.add_request(
                shared + [50 + i] * 3,
                SamplingParams(max_tokens=10, ignore_eos=True, temperature=0.8 if i % 2 else 0, seed=1),
            )
        while engine.has_unfinished():
            engine.step()
    assert set(TARGETS) - set(counts) == set()


def test_by_value_imports_are_patched_and_restored():
    import nanoengine.engine as engine_module
    import nanoengine.model_runner as runner_module
    import nanoengine.scheduler as scheduler_module

    def fake(*args):
        raise AssertionError("not called")

    holders = {slot.owner.__name__ for slot in slots_for("blocks_needed")}
    assert {"nanoengine.block_manager", "nanoengine.scheduler", "nanoengine.engine"} <= holders
    with plugged({"blocks_needed": fake, "prepare_inputs": fake, "sample": fake}):
        assert scheduler_module.blocks_needed is fake and engine_module.blocks_needed is fake
        assert engine_module.prepare_inputs is fake and runner_module.sample is fake
    assert scheduler_module.blocks_needed is original("blocks_needed")
    assert engine_module.prepare_inputs is original("prepare_inputs")
    assert runner_module.sample is original("sample")


def test_plugged_rejects_unknown_targets():
    with pytest.raises(ValueError, match="not a swappable engine function"):
        with plugged({"Scheduler.nope": print}):
            pass


# ---- every lesson's checks ---------------------------------------------------------------
@pytest.mark.parametrize("lesson", LESSONS, ids=lambda l: l.name)
def test_reference_implementation_passes(lesson):
    results = run_lesson_checks(lesson, reference_functions(lesson))
    failed = [(r.name, r.message) for r in results if not r.passed]
    assert not failed
    assert any(r.name.startswith("engine_") for r in results), "every lesson runs the engine with the code plugged in"


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda l: l.name)
def test_untouched_stub_fails_with_a_helpful_message(lesson):
    results = run_lesson_checks(lesson, student_functions(lesson, lesson.exercise), lesson.exercise)
    assert results[0].status == "stub"
    assert "still the stub" in results[0].message and "exercise.py" in results[0].message
    assert not any(r.passed for r in results)


MISTAKES = {
    "01_request_life": (
        "check_stop",
        """
        def check_stop(self, seq, token_id):
            if token_id in self.eos_token_ids:                      # forgets ignore_eos
                return FinishReason.STOP
            if seq.num_completion_tokens >= seq.params.max_tokens or seq.num_tokens >= self.max_model_len:
                return FinishReason.LENGTH
            return None
    """,
        "check_ignore_eos",
    ),
    "03_paged_kv": (
        "compute_slot_mapping",
        """
        def compute_slot_mapping(block_tables, seq_index, positions, block_size):
            return block_tables[seq_index, positions // block_size] * block_size + positions  # offset wrong
    """,
        "check_slot_mapping_one_sequence",
    ),
    "06_scheduler": (
        "schedule",
        """
        def schedule(self):
            out = SchedulerOutput()
            budget = self.max_num_batched_tokens
            while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:   # waiting first
                seq = self.waiting[0]
                if not self.try_admit(seq, budget, out):
                    break
                budget -= self.schedule_tokens(seq, seq.num_scheduled_tokens, out)
            for seq in list(self.running):
                if budget == 0 or seq.num_scheduled_tokens:
                    continue
                num_new = min(seq.num_uncomputed_tokens, budget)
                if self.make_room(seq, num_new, out):
                    self.block_manager.allocate(seq, num_new)
                    budget -= self.schedule_tokens(seq, num_new, out)
            return out
    """,
        "check_running_before_waiting",
    ),
    "09_flat_batch": (
        "prepare_inputs",
        """
        def prepare_inputs(seqs, block_size):
            inputs = ORIGINAL(seqs, block_size)
            inputs.positions = torch.arange(len(inputs.input_ids))     # flat index, not position
            return inputs
    """,
        "check_positions",
    ),
}


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_a_plausible_mistake_fails_the_right_check(name, tmp_path):
    lesson = find_lesson(name)
    function, body, failing_check = MISTAKES[name]
    path = tmp_path / "exercise.py"
    solution = reference_solution(lesson)
    path.write_text(
        solution + "\nfrom tracer.teach.plugins import original\nORIGINAL = original("
        f"{lesson.targets[function]!r})\n" + textwrap.dedent(body),
        encoding="utf-8",
    )
    results = {r.name: r for r in run_lesson_checks(lesson, student_functions(lesson, path), path)}
    assert results[failing_check].status == "failed", results[failing_check]
    assert results[failing_check].message


def test_the_engine_run_catches_what_outputs_alone_would_not():
    """Preempting the oldest instead of the newest keeps greedy outputs the same, but the schedule differs."""
    scenario = lesson_scenario(str(find_lesson("8").path / "check.py"))
    with plugged({"choose_victim": lambda running: running[0]}):
        with pytest.raises(AssertionError, match="differs from the engine's own code"):
            expect_engine_matches(scenario)


def test_an_endless_loop_is_stopped(tmp_path):
    lesson = find_lesson("08_preemption")
    path = tmp_path / "exercise.py"
    path.write_text(
        reference_solution(lesson).replace("return running[-1]", "while True:\n        pass"), encoding="utf-8"
    )
    results = run_lesson_checks(lesson, student_functions(lesson, path), path, time_limit=0.5)
    assert results[0].status == "failed" and "did not finish" in results[0].message


# ---- scenarios ----------------------------------------------------------------------------
@pytest.mark.parametrize("lesson", LESSONS, ids=lambda l: l.name)
def test_scenario_trace_passes_the_invariant_checker(lesson, tmp_path):
    scenario = load_scenario(lesson.scenario_file)
    path = tmp_path / "trace.jsonl"
    run = run_scenario(scenario, path)
    trace = load_trace(path, validate="all")
    assert check_trace(trace) == [] and run.violations == []
    assert trace.header["focus_step"] == run.focus_step
    assert 0 <= run.focus_step < trace.num_steps
    if scenario.focus.get("event"):
        focus = trace.steps[run.focus_step]
        assert any(e["kind"] == scenario.focus["event"] for e in focus["events"]), "the focus step shows its event"


# ---- a new student's walk through lesson 1 ------------------------------------------------
def test_new_student_walks_through_lesson_1(tmp_path, capsys):
    folder = tmp_path / "my-lessons"
    assert lesson_main(["start", "--dir", str(folder)]) == 0
    mine = folder / "01_request_life" / "exercise.py"
    assert mine.read_text() == find_lesson("1").exercise.read_text()
    assert lesson_main(["show", "1"]) == 0
    assert "check_stop" in capsys.readouterr().out

    assert lesson_main(["check", "1", "--dir", str(folder)]) == 1
    out = capsys.readouterr().out
    assert "still the stub" in out and "lesson hint 1" in out

    mine.write_text(reference_solution(find_lesson("1")), encoding="utf-8")
    assert lesson_main(["check", "1", "--dir", str(folder)]) == 0
    assert "All 9 checks passed" in capsys.readouterr().out

    assert lesson_main(["list", "--dir", str(folder)]) == 0
    assert "passed" in capsys.readouterr().out
    assert lesson_main(["trace", "1", "--dir", str(folder), "--no-tui"]) == 0
    trace = load_trace(folder / "traces" / "01_request_life.jsonl")
    assert check_trace(trace) == []
    assert lesson_main(["reset", "1", "--dir", str(folder)]) == 0
    assert mine.read_text() == find_lesson("1").exercise.read_text()
    assert (folder / "01_request_life" / "exercise.py.bak").read_text() == reference_solution(find_lesson("1"))
    assert find_lesson("1").exercise.read_text().count("NotImplementedError") >= 1  # the repo's stub is intact


def test_lesson_commands_give_one_line_errors(tmp_path, capsys):
    assert lesson_main(["check", "42", "--dir", str(tmp_path)]) == 2
    assert "no lesson '42'" in capsys.readouterr().out
    assert lesson_main(["check", "1", "--dir", str(tmp_path / "nowhere")]) == 2
    assert "lesson start" in capsys.readouterr().out
    bad = tmp_path / "bad.py"
    bad.write_text("def check_stop(self, seq, token_id)\n    return None\n")
    assert lesson_main(["check", "1", "--file", str(bad)]) == 2
    assert "line 1: syntax error" in capsys.readouterr().out
    wrong = tmp_path / "wrong.py"
    wrong.write_text("def check_stop(seq, token_id):\n    return None\n")
    assert lesson_main(["check", "1", "--file", str(wrong)]) == 2
    assert "must take (self, seq, token_id)" in capsys.readouterr().out
    assert (
        lesson_main(
            ["trace", "1", "--file", str(find_lesson("1").exercise), "--no-tui", "--out", str(tmp_path / "t.jsonl")]
        )
        == 2
    )
    assert "still the stub" in capsys.readouterr().out


def test_lesson_trace_reference_records_the_scenario(tmp_path, capsys):
    out = tmp_path / "t.jsonl"
    assert lesson_main(["trace", "prefix_caching", "--reference", "--no-tui", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Look for" in printed
    trace = load_trace(out)
    assert any(e["kind"] == "prefix_hit" for e in trace.steps[trace.header["focus_step"]]["events"])


def test_lesson_scenario_helper_overrides_fields():
    scenario = lesson_scenario(str(find_lesson("3").path / "check.py"), engine={"block_size": 1})
    assert scenario.engine == {"block_size": 1}
    assert Path(find_lesson("3").scenario_file).is_file()
