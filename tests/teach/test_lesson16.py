"""Lesson 16, one request, many sequences: the student writes BlockManager.fork and copy_on_write.
The reference passes, the stub fails, each typical mistake planted into the reference is named by
the first check that fails, the engine-level checks catch what they claim, and a scenario request
with beam_width is a beam search. All on the tiny model."""

from __future__ import annotations

import pytest

from nanoengine.beam_search import BeamSearchParams
from nanoengine.sampling_params import SamplingParams
from tracer.cli.lesson import lesson_main
from tracer.teach.kit import lesson_scenario
from tracer.teach.lessons import find_lesson, reference_solution, run_lesson_checks, student_functions
from tracer.teach.look_for import beam_search_text
from tracer.teach.scenarios import ScenarioError, scenario_arrivals, scenario_from_dict
from tracer.teach.swap import SWAPPABLE, plugged
from tracer.trace.invariants import check_trace
from tracer.trace.trace_file import load_trace

LESSON = find_lesson("16")
ARTICLES = ("SequenceGroup与SequenceGroupMetadata深度拆解", "vLLM sequence.py 源码精读")


def test_lesson_16_has_its_files_in_both_languages():
    for name in ("README.md", "README.zh.md", "exercise.py", "hint.md", "hint.zh.md", "check.py", "scenario.json"):
        assert (LESSON.path / name).is_file(), name
    assert LESSON.targets == {"fork": "BlockManager.fork", "copy_on_write": "BlockManager.copy_on_write"}
    assert set(LESSON.targets.values()) <= set(SWAPPABLE), "the lesson's targets must be swappable (decisions.py)"
    assert len(LESSON.hint_tiers()) == 3 and "```python" in LESSON.hint_tiers()[-1]


def test_the_readme_ends_with_vllm_then_further_reading_naming_both_seed_articles():
    text = LESSON.readme.read_text(encoding="utf-8")
    *_, in_vllm, further = text.split("\n## ")
    assert in_vllm.startswith("In vLLM\n") and "vllm/v1/" in in_vllm and "nanovllm/" in in_vllm
    assert further.startswith("Further reading\n") and all(title in further for title in ARTICLES)
    zh = LESSON.path.joinpath("README.zh.md").read_text(encoding="utf-8").rsplit("\n## ", 1)[1]
    assert zh.startswith("深入阅读\n") and all(title in zh for title in ARTICLES)
    for name in ("README.md", "hint.md", "exercise.py"):
        wide = [n for n, line in enumerate((LESSON.path / name).read_text().splitlines(), 1) if len(line) > 80]
        assert not wide, f"{name}: lines {wide} are wider than 80 columns"


def test_the_lessons_index_and_glossary_name_lesson_16():
    english = (LESSON.path.parent / "README.md").read_text(encoding="utf-8")
    chinese = (LESSON.path.parent / "README.zh.md").read_text(encoding="utf-8")
    for words in ("| 16 |", "BlockManager.copy_on_write", "FinishReason.PRUNED", "asserted on recompute"):
        assert words in english, words
    for words in ("| 16 |", "BlockManager.copy_on_write", "FinishReason.PRUNED", "剪枝", "断言"):
        assert words in chinese, words


# ---- the checks --------------------------------------------------------------------------------
def checks_of(source: str, tmp_path) -> list:
    path = tmp_path / "exercise.py"
    path.write_text(source, encoding="utf-8")
    return run_lesson_checks(LESSON, student_functions(LESSON, path), path)


def test_the_reference_solution_passes_every_check(tmp_path):
    results = checks_of(reference_solution(LESSON), tmp_path)
    assert [(r.name, r.status, r.message) for r in results if not r.passed] == []
    assert [r.name for r in results if r.name.startswith("engine_")] == [
        "engine_beam_search",
        "engine_beam_search_restarts",
    ]


def test_the_stub_fails_as_a_stub():
    results = run_lesson_checks(LESSON, student_functions(LESSON, LESSON.exercise), LESSON.exercise)
    assert results[0].status == "stub" and "still the stub" in results[0].message
    assert not any(r.passed for r in results)


# name -> (the engine's line, the student's, the first check that fails, words its message holds)
MISTAKES = {
    "ref count not raised on fork": (
        "        self.ref_counts[block_id] += 1\n",
        "        pass\n",
        "check_fork_shares_every_block",
        "ref count not raised on fork",
    ),
    "writing into a shared block (no copy)": (
        "    if not self.must_copy(seq):\n        return None\n",
        "    return None\n",
        "check_copy_on_write_copies_the_block_written_next",
        "writing into a shared block",
    ),
    "copying the whole block table": (
        "    i = seq.num_cached_tokens // self.block_size\n    source, copy",
        "    for j, block in enumerate(seq.block_table[:-1]):\n"
        "        seq.block_table[j] = self.take_free_block()\n"
        "        self.ref_counts[block] -= 1\n"
        "    i = seq.num_cached_tokens // self.block_size\n    source, copy",
        "check_copy_on_write_copies_the_block_written_next",
        "copied the whole block table",
    ),
    "a pruned beam's blocks leaking": (
        "    child.block_table = list(parent.block_table)\n",
        "    child.block_table = parent.block_table\n",
        "check_beams_free_every_block",
        "a pruned beam's blocks leaked",
    ),
    "the copy not released from the source": (
        "    self.ref_counts[source] -= 1\n",
        "",
        "check_copy_on_write_copies_the_block_written_next",
        "the copy not released from the source",
    ),
}


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_each_typical_mistake_is_named_by_the_first_check_that_fails(name, tmp_path):
    right, wrong, failing_check, words = MISTAKES[name]
    solution = reference_solution(LESSON)
    assert solution.count(right) == 1, f"the engine's code changed: update MISTAKES[{name!r}]"
    results = checks_of(solution.replace(right, wrong), tmp_path)
    first = next(r for r in results if not r.passed)
    assert (first.name, first.status) == (failing_check, "failed"), (first.name, first.message)
    assert words in first.message and "\n" not in first.message, first.message


def test_the_leak_names_the_list_the_children_share(tmp_path):
    right, wrong, _, _ = MISTAKES["a pruned beam's blocks leaking"]
    results = checks_of(reference_solution(LESSON).replace(right, wrong), tmp_path)
    leak = next(r for r in results if r.name == "check_beams_free_every_block")
    assert "list(parent.block_table)" in leak.message and "ref count(s) 2" in leak.message


# ---- the engine checks, with a bug plugged straight into the engine ------------------------------
def no_copy(self, seq):
    return None


def aliasing_fork(self, parent, child):
    for block_id in parent.block_table:
        self.ref_counts[block_id] += 1
    child.block_table = parent.block_table
    child.block_hashes = list(parent.block_hashes)


@pytest.mark.parametrize(
    "target, bug, words",
    [
        ("BlockManager.copy_on_write", no_copy, "writing into a shared block: in step 1"),
        ("BlockManager.fork", aliasing_fork, "after the beam search: a pruned beam's blocks leaked"),
    ],
)
def test_the_engine_run_names_a_shared_write_and_a_leak(target, bug, words):
    module = LESSON.checks_module()
    with plugged({target: bug}):
        with pytest.raises(AssertionError) as failure:
            module.expect_same_beam_search(lesson_scenario(str(LESSON.path / "check.py")))
    assert words in str(failure.value), failure.value


def test_the_engine_run_compares_every_copy_with_the_engines_own():
    """A copy_on_write that takes the free list's newest block, not its oldest, copies correctly but
    elsewhere: the check names the step and both copies."""

    def newest_block(self, seq):
        if not self.must_copy(seq):
            return None
        i = seq.num_cached_tokens // self.block_size
        source, (copy, _) = seq.block_table[i], self.free_blocks.popitem(last=True)
        self.ref_counts[copy] = 1
        self.ref_counts[source] -= 1
        seq.block_table[i] = copy
        return source, copy

    module = LESSON.checks_module()
    with plugged({"BlockManager.copy_on_write": newest_block}):
        with pytest.raises(AssertionError, match=r"step 1 copied \(source, copy\) \[\(5, 31\), \(5, 30\)\]"):
            module.expect_same_beam_search(lesson_scenario(str(LESSON.path / "check.py")))


# ---- the scenario: samples and a beam search -------------------------------------------------------
def test_a_scenario_request_with_beam_width_is_a_beam_search():
    scenario = scenario_from_dict(
        {
            "params": {"ignore_eos": True, "seed": 4, "max_tokens": 5},
            "requests": ["plain", {"prompt": "beams", "beam_width": 2, "length_penalty": 0.5}],
        },
        "s",
    )
    plain, beams = scenario_arrivals(scenario)
    assert plain.params == SamplingParams(ignore_eos=True, seed=4, max_tokens=5)
    assert beams.params == BeamSearchParams(beam_width=2, max_tokens=5, ignore_eos=True, length_penalty=0.5)
    assert [r.is_beam_search for r in scenario.requests] == [False, True]


@pytest.mark.parametrize(
    "request_, words",
    [
        ({"prompt": "a", "beam_width": 2, "n": 2}, ["request 0 is a beam search", "not n"]),
        ({"prompt": "a", "beam_width": 2, "top_k": 5, "seed": 1}, ["not seed, top_k"]),
        ({"prompt": "a", "length_penalty": 2.0}, ["length_penalty is for a beam search", "beam_width"]),
    ],
)
def test_a_beam_request_with_fields_it_has_no_use_for_is_one_line(request_, words):
    with pytest.raises(ScenarioError) as e:
        scenario_from_dict({"requests": [request_]}, "s", source="s.json")
    message = str(e.value)
    assert "\n" not in message and message.startswith("s.json: ") and all(w in message for w in words), message


# ---- lesson trace ------------------------------------------------------------------------------------
def test_lesson_trace_16_records_forks_copies_and_prunes_at_its_focus(tmp_path, capsys):
    out = tmp_path / "16.jsonl"
    assert lesson_main(["trace", "16", "--reference", "--no-tui", "--out", str(out)]) == 0
    assert "Look for:" in capsys.readouterr().out
    trace = load_trace(out, validate="all")
    assert check_trace(trace) == []
    focus = trace.steps[trace.header["focus_step"]]
    assert {e["kind"] for e in focus["events"]} >= {"copy_on_write", "forked", "finished"}
    assert [tuple(pair) for pair in focus["blocks_to_copy"]] == [(5, 6), (5, 7)]  # the README's step 1
    text = beam_search_text(trace.steps)
    assert text is not None and text.startswith(f"Step {trace.header['focus_step']}: ")
    assert "forked from" in text and "is pruned" in text
