"""Lessons: the plug-in machinery, every lesson's checks (reference passes, stub fails, some
plausible mistakes fail), the scenarios' traces, and a new student's walk through lesson 1.
All on the tiny model."""

from __future__ import annotations

import ast
import functools
import re
from collections import Counter
from pathlib import Path

import pytest
from conftest import run_async

from nanoengine import BeamSearchParams, LLMEngine, SamplingParams
from tracer.cli.lesson import lesson_main
from tracer.replay.colors import seq_letter
from tracer.replay.glossary import GLOSSARY
from tracer.teach.kit import expect_engine_matches, lesson_scenario
from tracer.teach.lessons import (
    LessonError,
    all_lessons,
    find_lesson,
    lessons_root,
    reference_solution,
    run_lesson_checks,
    split_tiers,
    student_functions,
)
from tracer.teach.plant import engine_source
from tracer.teach.scenarios import load_scenario, run_scenario
from tracer.teach.swap import SWAPPABLE, original, plugged, slots_for
from tracer.trace.invariants import check_trace
from tracer.trace.trace_file import load_trace

LESSONS = [lesson for lesson in all_lessons() if lesson.number <= 10]  # 11 on: bug hunts (test_bughunt_lessons.py)


def test_ten_lessons_in_order():
    assert [l.number for l in LESSONS] == list(range(1, 11))
    for lesson in LESSONS:
        for name in ("README.md", "exercise.py", "hint.md", "check.py", "scenario.json"):
            assert (lesson.path / name).is_file(), f"{lesson.name} lacks {name}"
        assert set(lesson.targets.values()) <= set(SWAPPABLE), lesson.name


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
    with plugged({name: counting(name, counts) for name in SWAPPABLE}):
        engine = LLMEngine("tiny", block_size=4, num_kv_blocks=14, max_num_batched_tokens=8)
        for i in range(4):
            engine.add_request(
                shared + [50 + i] * 3,
                SamplingParams(max_tokens=10, ignore_eos=True, temperature=0.8 if i % 2 else 0, seed=1),
            )
        # a beam search: fork, copy_on_write (and, in this tight pool, a restart by recompute_later)
        engine.add_request([7, 8, 9], BeamSearchParams(beam_width=2, max_tokens=6, ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
    assert set(SWAPPABLE) - set(counts) == set()


def test_by_value_imports_are_patched_and_restored():
    import nanoengine.engine as engine_module
    import nanoengine.model_runner as runner_module
    import nanoengine.scheduler as scheduler_module

    def fake(*args):
        raise AssertionError("not called")

    holders = {slot.owner.__name__ for slot in slots_for("blocks_needed")}
    assert {"nanoengine.block_manager", "nanoengine.scheduler"} <= holders
    with plugged({"blocks_needed": fake, "prepare_inputs": fake, "sample": fake}):
        assert scheduler_module.blocks_needed is fake
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
def test_reference_solution_in_the_exercise_file_passes(lesson, tmp_path):
    """The engine's own code pasted into the stub file passes: the stub imports all it needs."""
    path = tmp_path / "exercise.py"
    path.write_text(reference_solution(lesson), encoding="utf-8")
    results = run_lesson_checks(lesson, student_functions(lesson, path), path)
    failed = [(r.name, r.message) for r in results if not r.passed]
    assert not failed
    assert any(r.name.startswith("engine_") for r in results), "every lesson runs the engine with the code plugged in"


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda l: l.name)
def test_untouched_stub_fails_with_a_helpful_message(lesson):
    results = run_lesson_checks(lesson, student_functions(lesson, lesson.exercise), lesson.exercise)
    assert results[0].status == "stub"
    assert "still the stub" in results[0].message and "exercise.py" in results[0].message
    assert not any(r.passed for r in results)


# A typical wrong answer per lesson: (a line of the engine's code, the student's version of it,
# the check that must fail, words its message must contain: the hint that names the real mistake).
MISTAKES = {
    "01_request_life": (
        "seq.num_completion_tokens >= seq.params.max_tokens",
        "seq.num_completion_tokens > seq.params.max_tokens",
        "check_max_tokens",
        "compare with >=, not >",
    ),
    "02_token_counters": (
        "        seq.num_scheduled_tokens = 0\n",
        "",
        "check_mid_prefill_keeps_no_token",
        "must be reset to 0",
    ),
    "03_paged_kv": (
        "+ positions % block_size",
        "+ positions",
        "check_slot_mapping_one_sequence",
        "first difference at index 4: got 8, expected 4: add the offset inside the block",
    ),
    "04_block_manager": (
        "for block_id in reversed(seq.block_table):",
        "for block_id in seq.block_table:",
        "check_free",
        "tail first",
    ),
    "05_prefix_caching": (
        "range((seq.num_tokens - 1) // self.block_size)",
        "range(seq.num_tokens // self.block_size)",
        "check_last_token_is_never_cached",
        "(16 - 1) // 4 = 3",
    ),
    "06_scheduler": (
        "seq.status != SequenceStatus.RUNNING or seq.num_scheduled_tokens",
        "seq.num_scheduled_tokens",
        "check_uses_make_room",
        "no longer RUNNING",
    ),
    "07_chunked_prefill": (
        "need = num_new_blocks + bm.num_free_in(hit_blocks)",
        "need = num_new_blocks",
        "check_cached_free_blocks_count",
        "num_free_in(hit_blocks)",
    ),
    "08_preemption": (
        "self.waiting.appendleft(seq)",
        "self.waiting.append(seq)",
        "check_recompute_later_queues_at_head",
        "HEAD of self.waiting",
    ),
    "09_flat_batch": (
        "positions = torch.arange(len(input_ids)) - query_start_loc[seq_index] + num_cached[seq_index]",
        "positions = torch.arange(len(input_ids))",
        "check_query_start_loc",
        "positions count from the start of each sequence",
    ),
    "10_sampling": (
        "manual_seed(p.seed * 1_000_003 + num_tokens)",
        "manual_seed(p.seed)",
        "check_temperature",
        "include num_tokens in the seed",
    ),
}


def write_mistake(lesson, tmp_path) -> Path:
    right, wrong, _, _ = MISTAKES[lesson.name]
    solution = reference_solution(lesson)
    assert solution.count(right) == 1, f"{lesson.name}: the engine's code changed; update MISTAKES"
    path = tmp_path / "exercise.py"
    path.write_text(solution.replace(right, wrong), encoding="utf-8")
    return path


def test_every_lesson_has_a_typical_mistake():
    assert sorted(MISTAKES) == [l.name for l in LESSONS]


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_a_typical_mistake_gets_the_hint_that_names_it(name, tmp_path):
    lesson = find_lesson(name)
    path = write_mistake(lesson, tmp_path)
    _, _, failing_check, hint = MISTAKES[name]
    results = {r.name: r for r in run_lesson_checks(lesson, student_functions(lesson, path), path)}
    assert results[failing_check].status == "failed", results[failing_check]
    assert hint in results[failing_check].message, results[failing_check].message
    first_failure = next(r for r in results.values() if not r.passed)
    assert first_failure.name == failing_check, "the first failing check is the one whose hint names the mistake"


# Issue 37: lesson 8's quieter mistakes, each caught by a direct check that says which it is.
PREEMPT_MISTAKES = {
    "no_is_prefilling_reset": (
        "    seq.is_prefilling = False\n",
        "",
        "check_recompute_later_resets_the_sequence",
        "in the middle of its prefill",
    ),
    "free_counted_after_freeing": (
        "        out.add_event(EventKind.PREEMPTED, seq, by=needed_by.seq_id, free=num_free)\n"
        "        self.recompute_later(seq, out)\n",
        "        self.recompute_later(seq, out)\n"
        "        out.add_event(EventKind.PREEMPTED, seq, by=needed_by.seq_id, free=self.block_manager.num_free_blocks)\n",
        "check_preempt_records_the_free_blocks_before",
        "only the recorded number is wrong",
    ),
}


@pytest.mark.parametrize("mistake", sorted(PREEMPT_MISTAKES))
def test_lesson_8_catches_a_missed_reset_and_a_late_free_count(mistake, tmp_path):
    lesson = find_lesson("8")
    right, wrong, failing_check, words = PREEMPT_MISTAKES[mistake]
    solution = reference_solution(lesson)
    assert solution.count(right) == 1, "the engine's preempt changed; update PREEMPT_MISTAKES"
    path = tmp_path / "exercise.py"
    path.write_text(solution.replace(right, wrong), encoding="utf-8")
    results = [r for r in run_lesson_checks(lesson, student_functions(lesson, path), path) if not r.passed]
    assert results and results[0].name == failing_check, results
    assert words in results[0].message and "seq " not in results[0].message, results[0].message


# Units (a beam search's beams go together): lessons 6 and 8 each catch the mistakes a plain request
# cannot show, with the check whose message names the mistake.
UNIT_MISTAKES = {
    "beams_scheduled_twice": (
        "6",
        " or seq.num_scheduled_tokens:",
        ":",
        "check_a_beam_search_is_one_unit",
        "already has num_scheduled_tokens",
    ),
    "part_of_a_unit": (
        "6",
        "sum(num_new) > budget or ",
        "",
        "check_a_unit_fits_whole_or_waits",
        "all its beams or none",
    ),
    "no_copy_on_write": (
        "6",
        "copied = self.block_manager.copy_on_write(seq)",
        "copied = None",
        "check_copies_a_shared_block_before_it_is_written",
        "before allocate, self.block_manager.copy_on_write(seq)",
    ),
    "copies_not_listed": (
        "6",
        "out.blocks_to_copy.append(copied)",
        "pass",
        "check_copies_a_shared_block_before_it_is_written",
        "the runner never copies the K/V",
    ),
    "copies_not_recorded": (
        "6",
        "            out.add_event(EventKind.COPY_ON_WRITE, seq, source=copied[0], copy=copied[1])\n",
        "",
        "check_copies_a_shared_block_before_it_is_written",
        "record each copy",
    ),
    "a_seat_per_request": (
        "6",
        "self.has_seq_slots(self.waiting[0])",
        "len(self.running) < self.max_num_seqs",
        "check_a_beam_search_takes_a_slot_per_beam",
        "self.has_seq_slots",
    ),
    "one_beam_preempted": (
        "8",
        "reversed(unit_of(victim))",
        "[victim]",
        "check_preempt_takes_the_whole_unit",
        "whole unit",
    ),
    "beams_not_restarted": (
        "8",
        "if seq.group and seq is not seq.group.restart():",
        "if False:",
        "check_recompute_later_restarts_a_beam_search",
        "only B may wait",
    ),
    "prune_not_recorded": (
        "8",
        "        out.add_event(EventKind.FINISHED, seq, reason=FinishReason.PRUNED.value)\n",
        "",
        "check_recompute_later_restarts_a_beam_search",
        "record each pruned beam",
    ),
    "victim_is_the_first_beam": (
        "8",
        "if victim in unit:",
        "if victim is unit[0]:",
        "check_make_room_when_the_unit_itself_goes",
        "victim in unit",
    ),
    "first_beam_counted": (
        "8",
        "sum(map(bm.blocks_to_schedule, unit, num_new))",
        "bm.blocks_to_schedule(unit[0], num_new[0])",
        "check_make_room_counts_the_whole_unit",
        "count every sequence of the unit",
    ),
}


@pytest.mark.parametrize("mistake", sorted(UNIT_MISTAKES))
def test_a_mistake_with_units_is_caught_and_named(mistake, tmp_path):
    key, right, wrong, failing_check, words = UNIT_MISTAKES[mistake]
    lesson = find_lesson(key)
    solution = reference_solution(lesson)
    assert solution.count(right) == 1, f"{lesson.name}: the engine's code changed; update UNIT_MISTAKES"
    path = tmp_path / "exercise.py"
    path.write_text(solution.replace(right, wrong), encoding="utf-8")
    results = [r for r in run_lesson_checks(lesson, student_functions(lesson, path), path) if not r.passed]
    assert results and results[0].name == failing_check, results
    assert words in results[0].message and "seq " not in results[0].message, results[0].message


def without_docstring(fn: ast.FunctionDef) -> str:
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        fn.body = body[1:]
    return ast.dump(fn)


@pytest.mark.parametrize("hint", ["hint.md", "hint.zh.md"])
@pytest.mark.parametrize("name", ["06_scheduler", "08_preemption"])
def test_the_code_in_the_last_hint_is_the_engines_own(name, hint):
    """The reference solution a stuck student reads is the engine's functions, laid out for 78
    columns (docstrings and comments left out): a change in the engine shows up here."""
    lesson = find_lesson(name)
    code = re.search(r"```python\n(.*?)```", split_tiers((lesson.path / hint).read_text(encoding="utf-8"))[-1], re.S)
    assert code, f"{lesson.name}/{hint}: the last tier shows no code"
    shown = {n.name: n for n in ast.parse(code.group(1)).body if isinstance(n, ast.FunctionDef)}
    assert sorted(shown) == sorted(lesson.targets)
    for name, target in lesson.targets.items():
        (engine,) = ast.parse(engine_source(target)).body
        assert isinstance(engine, ast.FunctionDef)
        assert without_docstring(shown[name]) == without_docstring(engine), f"{lesson.name}/{hint}: {name}"


def test_a_free_count_taken_after_freeing_is_named_as_a_wrong_number_not_a_wrong_decision():
    """The invariant preemption_need tells the two apart from the numbers (the victim's blocks)."""
    from nanoengine.scheduler import Scheduler

    engine_preempt = Scheduler.preempt

    def preempt(self, seq, out, needed_by):
        events = len(out.events)
        engine_preempt(self, seq, out, needed_by)
        event = out.events[events]
        out.events[events] = type(event)(
            event.kind, event.seq_id, {**event.detail, "free": self.block_manager.num_free_blocks}
        )

    scenario = lesson_scenario(str(find_lesson("8").path / "check.py"))
    with plugged({"Scheduler.preempt": preempt}):
        with pytest.raises(AssertionError, match="preemption_need.*the recorded number is wrong, not the decision"):
            expect_engine_matches(scenario)


def test_the_engine_run_catches_what_outputs_alone_would_not():
    """Preempting the oldest instead of the newest keeps greedy outputs the same; the checker's
    victim_policy invariant names it (before the schedule comparison would)."""
    scenario = lesson_scenario(str(find_lesson("8").path / "check.py"))
    with plugged({"choose_victim": lambda running: running[0]}):
        with pytest.raises(AssertionError, match="victim_policy"):
            expect_engine_matches(scenario)


def test_an_endless_loop_is_stopped_and_named(tmp_path):
    """A make_room that loops without preempting: the check is stopped, named, the loop's line
    quoted, and the checks after it are skipped (no freeze)."""
    lesson = find_lesson("08_preemption")
    path = tmp_path / "exercise.py"
    path.write_text(
        reference_solution(lesson).replace("        self.preempt(victim, out, needed_by=unit[0])\n", ""),
        encoding="utf-8",
    )
    # a limit that the honest checks before it meet even on a busy machine
    results = run_lesson_checks(lesson, student_functions(lesson, path), path, time_limit=4)
    stopped = [r for r in results if r.timed_out]
    assert len(stopped) == 1 and stopped[0].name == "check_make_room_preempts_newest"
    message = stopped[0].message
    assert "check_make_room_preempts_newest did not finish within 4 s" in message
    assert "loop that never ends" in message and "make_room" in message and "while not bm.can_allocate" in message
    after = results[results.index(stopped[0]) + 1 :]
    assert after and all(r.status == "skipped" and "timed out" in r.message for r in after)


def test_except_exception_cannot_swallow_the_time_limit(tmp_path):
    lesson = find_lesson("01_request_life")
    path = tmp_path / "exercise.py"
    path.write_text(
        "def check_stop(self, seq, token_id):\n    while True:\n        try:\n            pass\n"
        "        except Exception:\n            pass\n",
        encoding="utf-8",
    )
    # 3 s, not less: the limit counts from the call, and on a busy machine a child given 0.3 s was
    # asked where it was before it had reached the student's loop (no exercise.py line to name)
    results = run_lesson_checks(lesson, student_functions(lesson, path), path, time_limit=3)
    assert results[0].timed_out and "exercise.py line" in results[0].message


def test_sys_exit_is_a_failure_not_a_pass(tmp_path, capsys):
    lesson = find_lesson("01_request_life")
    path = tmp_path / "exercise.py"
    path.write_text("import sys\n\ndef check_stop(self, seq, token_id):\n    sys.exit(0)\n", encoding="utf-8")
    results = run_lesson_checks(lesson, student_functions(lesson, path), path)
    assert results[0].status == "failed" and "sys.exit(0)" in results[0].message and "line 4" in results[0].message
    assert lesson_main(["check", "1", "--file", str(path)]) == 1
    at_import = tmp_path / "exits.py"
    at_import.write_text("raise SystemExit\n", encoding="utf-8")
    with pytest.raises(LessonError, match="SystemExit"):
        student_functions(lesson, at_import)
    capsys.readouterr()
    assert lesson_main(["check", "1", "--file", str(at_import)]) == 2
    assert "SystemExit" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["notes.txt", "folder"])
def test_check_file_that_is_not_python_gets_one_line(name, tmp_path, capsys):
    path = tmp_path / name
    if name == "folder":
        path.mkdir()
    else:
        path.write_text("my notes\n", encoding="utf-8")
    assert lesson_main(["check", "1", "--file", str(path)]) == 2
    out = capsys.readouterr().out
    assert out.count("\n") <= 2 and "exercise.py" in out and "Traceback" not in out


# ---- the texts ---------------------------------------------------------------------------
def too_wide(path: Path) -> list[str]:
    """Lines wider than 80 columns (78 inside a code block: rich pads those by one each side);
    markdown table rows are exempt (rich wraps their cells)."""
    wide, fence = [], False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip().startswith("```"):
            fence = not fence
            continue
        limit = 78 if fence and path.suffix == ".md" else 80
        if len(line) > limit and not line.startswith("|"):
            wide.append(f"{path.parent.name}/{path.name}:{number}: {len(line)} columns")
    return wide


def test_lesson_texts_fit_80_columns():
    paths = [lessons_root() / "README.md"]
    for lesson in LESSONS:
        paths += [lesson.readme, lesson.hint, lesson.exercise]
    assert [w for p in paths for w in too_wide(p)] == []


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda l: l.name)
def test_each_lesson_ends_with_where_vllm_does_it(lesson):
    text = lesson.readme.read_text(encoding="utf-8")
    last_section = text.rsplit("\n## ", 1)[1]
    assert last_section.startswith("In vLLM\n") and "In vLLM this is" in last_section
    assert "vllm/v1/" in last_section and "nanovllm/" in last_section


def test_glossary_in_the_lessons_readme_matches_the_help_screen():
    readme = " ".join((lessons_root() / "README.md").read_text(encoding="utf-8").split())
    for term in GLOSSARY:
        for cell in (term.ours, term.vllm, term.nano_vllm, term.note):
            assert " ".join(cell.split()) in readme, cell


def test_lesson_8_does_not_promise_identical_outputs():
    text = " ".join(find_lesson("8").readme.read_text(encoding="utf-8").split())
    assert "do not change at all" not in text and "Can recompute change the output?" in text


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


def test_a_lesson_trace_is_titled_as_lesson_list_and_show_title_it(tmp_path, capsys):
    """Bug hunt 14's trace once had a title of its own ("reused with its old name")."""
    out = tmp_path / "t.jsonl"
    assert lesson_main(["trace", "14", "--reference", "--no-tui", "--out", str(out)]) == 0
    lesson = find_lesson("14")
    assert load_trace(out).header["title"] == lesson.title == "14. Bug hunt: a block reused under its old name"
    assert capsys.readouterr().out.startswith(lesson.title)


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda l: l.name)
def test_hints_come_in_tiers_and_only_the_last_shows_code(lesson):
    tiers = lesson.hint_tiers()
    assert len(tiers) >= 3, f"{lesson.hint}: a nudge, a closer hint, then the code"
    assert all(tier.startswith("## ") for tier in tiers)
    assert "```" in tiers[-1]
    assert all("```" not in tier for tier in tiers[:-1])


def test_lesson_5s_first_hint_is_a_nudge_not_the_code():
    first = find_lesson("5").hint_tiers()[0]
    for code in ("hash((", "range(", "hash_to_block.get", "0x7FFF"):
        assert code not in first


def test_lesson_hint_more_walks_the_tiers_and_remembers(tmp_path, capsys):
    folder = tmp_path / "my-lessons"
    assert lesson_main(["start", "--dir", str(folder)]) == 0
    capsys.readouterr()
    tiers = find_lesson("5").hint_tiers()
    said = []
    for more in ([], ["--more"], ["--more"], ["--more"]):
        assert lesson_main(["hint", "5", "--dir", str(folder), *more]) == 0
        said.append(" ".join(capsys.readouterr().out.split()))
    assert said[0].startswith(f"Hint 1 of {len(tiers)}") and "--more" in said[0]
    assert said[1].startswith(f"Hint 2 of {len(tiers)}") and "the last one shows code" in said[1]
    assert said[2].startswith(f"Hint 3 of {len(tiers)}") and "find_cached_prefix" in said[2]
    assert said[3] == said[2].replace("Still stuck?", "") or said[3].startswith(f"Hint {len(tiers)} of")
    assert lesson_main(["hint", "5", "--dir", str(folder)]) == 0  # plain `hint` is the nudge again
    assert " ".join(capsys.readouterr().out.split()).startswith(f"Hint 1 of {len(tiers)}")
    assert lesson_main(["hint", "5", "--all", "--dir", str(tmp_path / "none")]) == 0
    assert "find_cached_prefix" in capsys.readouterr().out


def test_lesson_1_explains_the_chat_template_where_students_first_meet_it():
    text = find_lesson("1").readme.read_text(encoding="utf-8")
    section = text.split("## What the model reads: the chat template")[1].split("\n## ")[0]
    assert "<|im_start|>assistant" in section and "`--raw`" in section and "dimmed" in section


def test_a_students_error_text_and_folder_are_printed_as_text_not_markup(tmp_path, capsys):
    folder = tmp_path / "[red]mine"
    folder.mkdir()
    mine = folder / "exercise.py"
    mine.write_text('def check_stop(self, seq, token_id):\n    raise ValueError("[bold]boom[/bold]")\n')
    code = lesson_main(["trace", "1", "--file", str(mine), "--no-tui", "--out", str(tmp_path / "t.jsonl")])
    out = capsys.readouterr().out.replace("\n", "")
    assert code != 0 and "your code raised" in out
    assert "[bold]boom[/bold]" in out and "[red]mine" in out


# ---- issue 37, items 11 and 12: the scenario format's schema, and the teacher's tools --------
def scenario_schema():
    import json

    import jsonschema

    from tracer.teach.scenarios import SCHEMA_FILE

    schema = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_every_lessons_scenario_and_the_template_validate_against_the_published_schema():
    import json

    from tracer.teach.scenarios import template_json

    schema = scenario_schema()
    files = sorted(lessons_root().glob("*/scenario.json"))
    assert len(files) == len(all_lessons())
    for path in files:
        errors = [e.message for e in schema.iter_errors(json.loads(path.read_text(encoding="utf-8")))]
        assert not errors, f"{path.parent.name}: {errors}"
    assert not list(schema.iter_errors(json.loads(template_json())))


def test_the_schema_and_the_loader_agree_on_the_keys():
    from dataclasses import fields

    from nanoengine.config import EngineConfig
    from tracer.teach.scenarios import FOCUS_EVENTS, FOCUS_LEAST, PARAM_FIELDS, TOP_LEVEL

    props = scenario_schema().schema["properties"]
    assert set(props) == set(TOP_LEVEL)
    assert set(props["params"]["properties"]) == PARAM_FIELDS
    request = props["requests"]["items"]["oneOf"][-1]["properties"]
    assert set(request) == PARAM_FIELDS | {"prompt", "arrive"}
    assert set(props["engine"]["properties"]) == {f.name for f in fields(EngineConfig)} - {"model"}
    assert set(props["focus"]["properties"]) == {"event", *FOCUS_LEAST}
    assert props["focus"]["properties"]["event"]["enum"] == list(FOCUS_EVENTS)


@pytest.mark.parametrize(
    "data",
    [
        {"requests": ["a"], "look-for": "x"},
        {"requests": []},
        {"requests": [{"prompt": "a", "colour": 1}]},
        {"requests": [{"prompt": "a", "arrive": -1}]},
        {"requests": ["a"], "params": {"max_token": 3}},
        {"requests": ["a"], "focus": {"evnet": "finished"}},
        {"requests": ["a"], "focus": {"step": 1, "event": "finished"}},
        {"requests": ["a"], "focus": {"event": "finished", "nth": 0}},
        {"requests": ["a"], "focus": {"event": "done"}},
        {"requests": ["a"], "max_steps": 0},
    ],
)
def test_the_schema_and_the_loader_refuse_the_same_mistakes(data):
    from tracer.teach.scenarios import ScenarioError, scenario_from_dict

    assert list(scenario_schema().iter_errors(data)), "the schema lets it through"
    with pytest.raises(ScenarioError):
        scenario_from_dict(data, "s")


def check_json(argv: list[str], capsys) -> tuple[int, dict]:
    import json

    code = lesson_main(["check", *argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)  # one JSON object, nothing else on stdout


def test_check_json_gives_each_verdict_for_a_grading_script(tmp_path, capsys):
    lesson = find_lesson("1")
    right = tmp_path / "right.py"
    right.write_text(reference_solution(lesson).replace("    if ", '    print("All checks passed")\n    if ', 1))
    code, report = check_json(["1", "--file", str(right)], capsys)
    assert code == 0 and report["lesson"] == 1 and report["passed"] is True
    names = [c["name"] for c in report["checks"]]
    assert names[0].startswith("check_") and names[-1].startswith("engine_")
    assert all(c["passed"] and c["status"] == "passed" and c["message"] == "" for c in report["checks"])

    code, report = check_json(["1", "--file", str(lesson.exercise)], capsys)  # the stub
    assert code == 1 and report["passed"] is False
    assert [c["status"] for c in report["checks"][:2]] == ["stub", "skipped"]
    assert "still the stub" in report["checks"][0]["message"]


@pytest.mark.parametrize("argv, words", [(["99"], "no lesson '99'"), (["1", "--file", "missing.py"], "does not exist")])
def test_check_json_reports_what_kept_the_checks_from_running(tmp_path, monkeypatch, capsys, argv, words):
    monkeypatch.chdir(tmp_path)
    code, report = check_json(argv, capsys)
    assert code == 2 and report["passed"] is False and report["checks"] == [] and words in report["error"]


def test_trace_compare_reference_records_both_runs_and_names_the_first_difference(tmp_path, capsys):
    import re

    lesson = find_lesson("15")
    oldest = tmp_path / "oldest.py"  # preempts the oldest running request, not the newest
    oldest.write_text(
        "from nanoengine.sequence import Sequence\n\n\n"
        "def choose_victim(running: list[Sequence]) -> Sequence:\n    return running[0]\n"
    )
    out = tmp_path / "mine.jsonl"
    argv = ["trace", "15", "--file", str(oldest), "--no-tui", "--out", str(out), "--compare-reference"]
    assert lesson_main(argv) == 1  # its run breaks the policy invariant (the newest is preempted)
    printed = capsys.readouterr().out.replace("\n", " ")
    reference = tmp_path / "mine.reference.jsonl"
    assert check_trace(load_trace(reference)) == [] and load_trace(reference).title == lesson.title
    assert "A = your run, B = the engine's own code's run" in printed
    assert re.search(r"step \d+, \w+ of request \d", printed), printed


def test_trace_compare_vllm_sets_the_lesson_beside_vllms_committed_run(tmp_path, capsys):
    out = tmp_path / "ref.jsonl"
    assert lesson_main(["trace", "15", "--reference", "--no-tui", "--out", str(out), "--compare-vllm"]) == 0
    printed = capsys.readouterr().out.replace("\n", " ")
    assert "B = vLLM v1's run (vllm:15_vs_vllm)" in printed
    assert "--compare-reference shows" in one_lesson_error(
        ["trace", "15", "--reference", "--compare-reference"], capsys
    )


def one_lesson_error(argv: list[str], capsys) -> str:
    assert lesson_main(argv) == 2
    return capsys.readouterr().out.replace("\n", " ")


@pytest.mark.real_model
def test_lesson_trace_on_the_default_model_says_what_that_run_did(tmp_path, capsys):
    """Issue 37: lesson 1's text is about the tiny model (C stops at step 2); on SmolLM2 the banner
    is derived from the trace: what its focus step did, by name, and who still runs."""
    out = tmp_path / "01.jsonl"
    argv = ["trace", "1", "--reference", "--model", "default", "--no-tui", "--out", str(out)]
    assert lesson_main(argv) == 0
    printed = " ".join(capsys.readouterr().out.split())
    trace = load_trace(out)
    focus = trace.steps[trace.header["focus_step"]]
    running = [r["seq_id"] for r in focus["seqs"] if r["status_after"] == "RUNNING"]
    assert "Fizz buzz" not in printed and "written for the tiny model" in printed
    first = min(sid for sid in trace.requests)  # A: 0 in a fresh process, as the replay letters it
    assert f"Step {focus['step']}: seq {first} ({seq_letter(first)}) finishes with reason 'length'" in printed
    assert ("Still running after it" in printed) == bool(running)
    assert trace.header["look_for"].startswith("(on SmolLM2"), "`nanoengine replay` of the trace shows it too"


@run_async
async def test_lesson_8_predict_opens_before_the_preemption_and_keeps_the_look_for_text_until_answered(tmp_path):
    """Issue 37: --predict no longer opens on the step it should ask about, nor shows its Look-for text."""
    from tracer.replay.app import ReplayApp
    from tracer.replay.predict import PredictScreen, predict_start

    path = tmp_path / "08.jsonl"
    run = run_scenario(load_scenario(find_lesson("8").scenario_file), path)
    guide = load_scenario(find_lesson("8").scenario_file).look_for
    app = ReplayApp(load_trace(path), predict_start(run.focus_step), True, guide=guide)
    async with app.run_test(size=(160, 48)) as pilot:
        banner = str(app.query_one("#banner").render())
        assert app.step_index == run.focus_step - 1 and "preempted" not in banner and "Predict:" in banner
        await pilot.press("right")
        await pilot.pause()
        assert isinstance(app.screen, PredictScreen)
        await pilot.press("escape")
        await pilot.pause()
        assert app.step_index == run.focus_step and "Look for: A needs a 4th block" in str(
            app.query_one("#banner").render()
        )
