"""Checks for lesson 15: choose_victim, against vLLM v1's own scheduler."""

import tempfile
from pathlib import Path

from tracer.i18n import _
from tracer.teach.kit import expect, lesson_scenario, make_sequence
from tracer.teach.scenarios import run_scenario
from tracer.trace.diff import diff_traces, first_difference_line
from tracer.trace.trace_file import load_trace
from tracer.vllm.scenarios import TRACES_DIR

TARGETS = {"choose_victim": "choose_victim"}
VLLM_TRACE = TRACES_DIR / "15_vs_vllm.jsonl"
SCHEDULE = ("tokens", "admitted", "preempted", "finished")


def check_choose_victim(fns):
    """choose_victim picks the newest running sequence, as vLLM's FCFS scheduler does."""
    seqs = [make_sequence(1, name=name) for name in "ABCD"]
    got = fns.choose_victim(list(seqs))
    expect(
        got is seqs[-1],
        _(
            "running is [A, B, C, D] (oldest first); vLLM preempts "
            "D, the newest (self.running.pop()); you chose {got!r}"
        ).format(got='ABCD'[seqs.index(got)] if got in seqs else got),
    )
    expect(
        fns.choose_victim(seqs[:1]) is seqs[0],
        _("with one running sequence, it is the victim"),
    )


def engine_matches_vllm(fns):
    """With your choose_victim, the lesson's run schedules what vLLM v1 scheduled, step for step."""
    with tempfile.TemporaryDirectory(prefix="lesson-15-") as tmp:
        path = Path(tmp) / "trace.jsonl"
        run_scenario(lesson_scenario(__file__), path)
        diff = diff_traces(load_trace(path), load_trace(VLLM_TRACE))
    diff.differences = [d for d in diff.differences if d.kind in SCHEDULE]
    expect(
        not diff.differences and diff.num_steps[0] == diff.num_steps[1],
        _("your run and vLLM's part ways at {difference}").format(
            difference=first_difference_line(diff)
        ),
    )
