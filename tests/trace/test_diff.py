"""`nanoengine diff`: where two runs of one workload part ways, on real runs of nanoengine and the
committed traces of vLLM v1's scheduler."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from tracer.cli.main import main
from tracer.teach.demos import DEMOS
from tracer.teach.scenarios import load_scenario, run_scenario
from tracer.trace.diff import DiffError, diff_traces
from tracer.trace.trace_file import load_trace

ROOT = Path(__file__).parents[2]
VLLM = ROOT / "tracer" / "vllm" / "traces"


def test_a_trace_against_itself_has_no_difference(lesson10, capsys):
    trace = load_trace(lesson10)
    assert diff_traces(trace, trace).differences == []
    assert main(["diff", str(lesson10), str(lesson10)]) == 0
    assert "no difference" in capsys.readouterr().out


def test_lesson_10_schedules_like_vllm_and_the_old_rule_is_named_with_the_same_step_hit(lesson10, capsys):
    """Issue 26: nanoengine hits blocks scheduled earlier in the same step, as vLLM does, so lesson 10's
    twins agree step for step. Planted, the old rule (B computes all 16 tokens) is the first difference."""
    nano, vllm = load_trace(lesson10), load_trace(VLLM / "10_sampling.jsonl")
    assert diff_traces(nano, vllm).differences == []
    assert main(["diff", str(lesson10), str(VLLM / "10_sampling.jsonl")]) == 0
    old = copy.copy(nano)
    old.steps = copy.deepcopy(list(nano.steps))
    b = old.steps[0]["inputs"]["seq_ids"][1]
    row = next(r for r in old.steps[0]["seqs"] if r["seq_id"] == b)
    row["num_cached_tokens"], row["num_scheduled_tokens"] = 0, 16
    first = diff_traces(old, vllm).first
    assert first is not None and (first.step, first.kind, first.request) == (0, "tokens", 1)
    assert first.a.startswith("16 tokens from 0 cached") and first.b.startswith("4 tokens from 12 cached")
    assert "same-step hit: request 0 computes them in this step" in first.b


def test_the_preemption_demo_schedules_alike_and_first_differs_in_the_blocks_a_resume_takes(tmp_path):
    path = tmp_path / "preemption.jsonl"
    run_scenario(DEMOS["preemption"].build(True), path, model="tiny")
    diff = diff_traces(load_trace(path), load_trace(VLLM / "demo-preemption.jsonl"))
    assert not diff.schedule_differs()
    first = diff.first
    assert first is not None and first.kind == "blocks"
    nano = load_trace(path)
    seq_id = sorted(nano.requests)[first.request]
    admitted = [s["step"] for s in nano.steps for e in s["events"] if e["kind"] == "admitted" and e["seq_id"] == seq_id]
    resumed = admitted[-1]
    assert first.step == resumed  # where the preempted request comes back
    assert "free list before the step, head first" in first.a and "free list before the step" in first.b


def test_block_ids_are_compared_without_vllms_null_block(tmp_path):
    path = tmp_path / "08.jsonl"
    run_scenario(load_scenario(ROOT / "lessons" / "08_preemption" / "scenario.json"), path, model="tiny")
    diff = diff_traces(load_trace(path), load_trace(VLLM / "08_preemption.jsonl"))
    assert diff.steps() and diff.steps()[0] > 0  # step 0's tables agree once vLLM's block 0 is set aside


def test_a_planted_schedule_change_is_named_at_its_step_and_request(lesson10):
    trace = load_trace(lesson10)
    planted = copy.copy(trace)
    planted.steps = copy.deepcopy(list(trace.steps))
    row = next(r for r in planted.steps[3]["seqs"] if r["num_scheduled_tokens"])
    row["num_scheduled_tokens"] = 0
    first = diff_traces(trace, planted).first
    assert first is not None and (first.step, first.kind) == (3, "tokens")
    assert first.request == sorted(trace.requests).index(row["seq_id"])


def test_traces_of_different_workloads_are_refused_in_one_line(lesson10, capsys):
    other = VLLM / "08_preemption.jsonl"
    with pytest.raises(DiffError):
        diff_traces(load_trace(lesson10), load_trace(other))
    assert main(["diff", str(lesson10), str(other)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "same workload" in err
    assert main(["diff", str(lesson10), str(lesson10), "--only", "nonsense"]) == 2


def test_a_why_carries_the_numbers_the_decision_recorded(tmp_path):
    """Trace schema 3: each side's why says what its decisions were taken on (who needed the room,
    the blocks free), so a difference in a preemption or an admission is explained."""
    path = tmp_path / "preemption.jsonl"
    run_scenario(DEMOS["preemption"].build(True), path, model="tiny")
    nano = load_trace(path)
    planted = copy.copy(nano)
    planted.steps = copy.deepcopy(list(nano.steps))
    i = next(i for i, s in enumerate(planted.steps) if any(e["kind"] == "preempted" for e in s["events"]))
    event = next(e for e in planted.steps[i]["events"] if e["kind"] == "preempted")
    planted.steps[i]["events"].remove(event)
    first = diff_traces(nano, planted).first
    index = {sid: k for k, sid in enumerate(sorted(nano.requests))}
    by, free = index[event["detail"]["by"]], event["detail"]["free"]
    assert first is not None and first.kind == "preempted"
    assert f"preempted (for request {by}, {free} blocks free)" in first.a and "preempted" not in first.b
