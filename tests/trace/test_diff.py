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


def test_lesson_15_against_vllm_differs_only_in_block_ids_and_says_why(tmp_path, capsys):
    """Issue 37: the diff lesson 15 suggests exits 0; its rows are block ids under a renaming (the
    free-list order), and vLLM's null block is named, not shown as a block of its own."""
    path = tmp_path / "15.jsonl"
    run_scenario(load_scenario(ROOT / "lessons" / "15_vs_vllm" / "scenario.json"), path, model="tiny")
    vllm = VLLM / "15_vs_vllm.jsonl"
    diff = diff_traces(load_trace(path), load_trace(vllm))
    assert diff.differences and all(d.kind == "blocks" and d.ids_only for d in diff.differences)
    assert not diff.decisions_differ()
    assert main(["diff", str(path), str(vllm)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "null block 0" in out and "Only block ids differ, and only by a renaming" in out and "free-list order" in out


def test_a_table_of_another_length_is_a_decision_not_a_renaming(lesson10):
    trace = load_trace(lesson10)
    planted = copy.copy(trace)
    planted.steps = copy.deepcopy(list(trace.steps))
    row = next(r for r in planted.steps[2]["seqs"] if r["block_table_after"])
    row["block_table_after"] = row["block_table_after"][:-1]
    diff = diff_traces(trace, planted)
    assert [(d.step, d.kind, d.ids_only) for d in diff.differences][:1] == [(2, "blocks", False)]
    assert diff.decisions_differ()


def preemption_pools(tmp_path) -> tuple[Path, Path]:
    """Lesson 8's workload on 14 and on 10 blocks (budget 8, 24 tokens each): the small pool preempts more."""
    paths = []
    for blocks in (14, 10):
        scenario = load_scenario(ROOT / "lessons" / "08_preemption" / "scenario.json")
        scenario.engine = {**scenario.engine, "num_kv_blocks": blocks, "max_num_batched_tokens": 8}
        for request in scenario.requests:
            request.params = {**request.params, "max_tokens": 24}
        paths.append(tmp_path / f"{blocks}.jsonl")
        run_scenario(scenario, paths[-1], model="tiny")
    return paths[0], paths[1]


def test_a_preemption_is_one_row_and_summary_is_one_line_per_kind(tmp_path, capsys):
    a, b = preemption_pools(tmp_path)
    diff = diff_traces(load_trace(a), load_trace(b))
    both = {(d.step, d.request) for d in diff.differences if d.kind == "tokens"} & {
        (d.step, d.request) for d in diff.differences if d.kind == "preempted"
    }
    assert both, "the small pool's preemption also changes the tokens of that request at that step"
    assert main(["diff", str(a), str(b)]) == 1
    table = capsys.readouterr().out
    assert "tokens, preempted" in table
    assert main(["diff", str(a), str(b), "--summary"]) == 1
    lines = capsys.readouterr().out.splitlines()
    names = [line.strip().split(":")[0] for line in lines if line.startswith("  ")]
    assert names[:3] == ["steps", "tokens", "admitted"] and "preempted" in names and len(names) == len(set(names))
    assert len(lines) < 20
