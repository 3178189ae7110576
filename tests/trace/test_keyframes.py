"""Schema version 4: a trace holds keyframes and changes, a reader rebuilds the whole steps a
version-3 trace held (tracer/trace/keyframes.py).

tests/data/scenario_v3.jsonl and busy_v3.jsonl are conftest's SCENARIO and BUSY workloads recorded
as version 3, before keyframes (re-record them with a version-3 recorder if the engine's schedule
changes on purpose).
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest
from conftest import BUSY_OPTIONS, BUSY_REQUESTS, drive, make_tiny_engine, record_scenario

import nanoengine.sequence
import tracer.trace.trace_file as trace_file
from nanoengine.sampling_params import SamplingParams
from tracer.trace.invariants import check_trace
from tracer.trace.keyframes import KEYFRAME_EVERY, DeltaWriter, RebuiltSteps, free_list_change
from tracer.trace.recorder import TraceRecorder
from tracer.trace.trace_file import TraceError, load_trace

DATA = Path(__file__).parents[1] / "data"


def comparable(step: dict) -> dict:
    """A step without what differs between two recordings of one run: its times, and the engine's
    source lines behind each event (they move when the engine's code is edited)."""
    events = [{k: v for k, v in e.items() if k != "where"} for e in step["events"]]
    return {k: v for k, v in step.items() if k not in ("wall_time", "model_time")} | {"events": events}


def v3_steps(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines()[1:]]


@pytest.fixture
def fresh_seq_ids(monkeypatch):
    """seq_ids from 0, as in the process the version-3 files were recorded in."""
    monkeypatch.setattr(nanoengine.sequence, "_seq_ids", itertools.count())


def test_the_scenario_rebuilds_the_steps_its_version_3_trace_held(tmp_path, fresh_seq_ids, one_torch_thread):
    path = record_scenario(tmp_path / "v4.jsonl")
    trace = load_trace(path, validate="all")
    assert trace.header["schema_version"] == 4
    assert [comparable(s) for s in trace.steps] == [comparable(s) for s in v3_steps("scenario_v3.jsonl")]
    assert path.stat().st_size < (DATA / "scenario_v3.jsonl").stat().st_size


def test_the_busy_workload_rebuilds_its_version_3_steps(tmp_path, monkeypatch, one_torch_thread):
    monkeypatch.setattr(nanoengine.sequence, "_seq_ids", itertools.count(5))  # recorded after the scenario's 5
    engine = make_tiny_engine(**BUSY_OPTIONS)
    with TraceRecorder(engine, tmp_path / "v4.jsonl"):
        drive(engine, BUSY_REQUESTS, 200)
    trace = load_trace(tmp_path / "v4.jsonl", validate="all")
    assert [comparable(s) for s in trace.steps] == [comparable(s) for s in v3_steps("busy_v3.jsonl")]


def record_both_ways(tmp_path: Path, every: int) -> tuple[Path, Path]:
    """One run of the busy workload, recorded by two recorders: keyframes every 64 steps (one here)
    and every `every` steps."""
    engine = make_tiny_engine(**BUSY_OPTIONS)
    one, many = tmp_path / "one.jsonl", tmp_path / f"every{every}.jsonl"
    with TraceRecorder(engine, one), TraceRecorder(engine, many) as recorder:
        recorder.deltas = DeltaWriter(every=every)
        drive(engine, BUSY_REQUESTS, 200)
    return one, many


@pytest.mark.parametrize("every", [1, 2, 3])
def test_any_keyframe_interval_rebuilds_the_same_steps_in_any_order(tmp_path, every, one_torch_thread):
    one, many = record_both_ways(tmp_path, every)
    keyframes = [json.loads(line).get("keyframe", False) for line in many.read_text().splitlines()[1:]]
    assert keyframes == [i % every == 0 for i in range(len(keyframes))]
    want = [comparable(s) for s in load_trace(one).steps]
    finished = [i for i, s in enumerate(want) if any(r["finish_reason"] for r in s["seqs"])]
    assert len(want) - finished[0] > 2 * every  # later keyframes leave its row to the keyframe that listed it
    for lazy in (False, True):
        steps = load_trace(many, lazy=lazy).steps
        order = list(range(len(want)))
        random.Random(every).shuffle(order)
        assert all(comparable(steps[i]) == want[i] for i in [*order, *reversed(order)])


def test_a_change_line_lists_only_the_sequences_the_step_reported(tmp_path, one_torch_thread):
    _, many = record_both_ways(tmp_path, 64)
    lines = [json.loads(line) for line in many.read_text().splitlines()[1:]]
    whole = load_trace(many).steps
    for line, step in zip(lines[1:], whole[1:]):
        assert "keyframe" not in line and "ref_counts" not in line["pool"] and "owners" not in line["pool"]
        listed = {r["seq_id"] for r in line["seqs"]}
        assert listed <= {r["seq_id"] for r in step["seqs"]}
        idle = [r for r in step["seqs"] if r["seq_id"] not in listed]
        assert all(not r["new_token_ids"] and r["num_scheduled_tokens"] == 0 for r in idle)
    assert any(len(line["seqs"]) < len(step["seqs"]) for line, step in zip(lines, whole))


@pytest.mark.parametrize(
    "old, new, change",
    [
        ([1, 2, 3], [1, 2, 3], {}),
        ([1, 2, 3, 4], [3, 4], {"free_removed": [1, 2]}),
        ([1, 2, 3], [1, 3, 7, 5], {"free_removed": [2], "free_added": [7, 5]}),
        ([1, 2], [1, 2, 9], {"free_added": [9]}),
        ([1, 2, 3], [2, 3, 1], {"free_removed": [1], "free_added": [1]}),
        ([1, 2, 3, 4, 5], [3, 4, 5, 2], {"free_removed": [1, 2], "free_added": [2]}),
        ([1, 2, 3, 4], [4, 3, 2, 1], {"free_block_ids": [4, 3, 2, 1]}),  # shorter whole
    ],
)
def test_a_free_list_change_rebuilds_the_new_list(old, new, change):
    assert free_list_change(old, new) == change
    removed = set(change.get("free_removed", ()))
    rebuilt = change.get("free_block_ids", [b for b in old if b not in removed] + change.get("free_added", []))
    assert rebuilt == new


def short_requests(tmp_path: Path, n: int) -> Path:
    """n short requests, one joining each step, on the tiny model's default 8,192-block pool."""
    engine = make_tiny_engine(num_kv_blocks=None, max_num_seqs=8)
    path = tmp_path / f"short{n}.jsonl"
    with TraceRecorder(engine, path):
        arrivals = [(f"request {i}", 3, i) for i in range(n)]
        drive(engine, arrivals, 10 * n)
    return path


def test_a_step_line_stays_as_long_however_many_requests_came_before(tmp_path, one_torch_thread):
    """v3 listed every request seen and the whole pool in every line: 50 -> 200 requests made its
    lines 4 times longer. Here the change lines' mean stays flat; a keyframe lists the live requests
    and those finished since the keyframe before (its pool is as big as the pool, whatever ran)."""
    sizes = {}
    for n in (50, 200):
        path = short_requests(tmp_path, n)
        lines = [json.loads(line) for line in path.read_text().splitlines()[1:]]
        changes = [len(json.dumps(line)) for line in lines if "keyframe" not in line]
        keyframe_rows = [len(line["seqs"]) for line in lines if "keyframe" in line]
        sizes[n] = (sum(changes) / len(changes), max(keyframe_rows), len(lines))
        assert check_trace(load_trace(path, validate="all")) == []
    (change_50, rows_50, steps_50), (change_200, rows_200, steps_200) = sizes[50], sizes[200]
    assert steps_200 > 3.5 * steps_50
    assert change_200 < 1.3 * change_50 and change_200 < 5_000
    assert max(rows_50, rows_200) <= KEYFRAME_EVERY + 8 + 1  # finished since the last one, running, the new one


def count_lines_read(monkeypatch) -> list[int]:
    read: list[int] = []
    parse = trace_file.parse_step_line

    def counting(path, n, line, version):
        read.append(n)
        return parse(path, n, line, version)

    monkeypatch.setattr(trace_file, "parse_step_line", counting)
    return read


def test_a_jump_reads_a_keyframe_and_the_changes_after_it(tmp_path, monkeypatch, one_torch_thread):
    engine = make_tiny_engine(num_kv_blocks=600, max_num_seqs=4)
    path = tmp_path / "long.jsonl"
    with TraceRecorder(engine, path):
        engine.add_request("a long one", SamplingParams(max_tokens=2_000, ignore_eos=True))
        for i in range(3):
            engine.add_request(f"short {i}", SamplingParams(max_tokens=5, ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
    trace = load_trace(path, lazy=True, validate="none")
    assert trace.num_steps >= 2_000
    read = count_lines_read(monkeypatch)
    last = trace.steps[-1]
    keyframes = sum(m.keyframe for m in trace.marks)
    assert len(set(read)) <= KEYFRAME_EVERY + keyframes  # the finished rows' keyframes, then at most 63 changes
    assert [s["finish_reason"] for s in last["seqs"]] == ["length"] * 4
    read.clear()
    middle = trace.steps[1_000]
    assert 0 < len(read) <= KEYFRAME_EVERY and middle["step"] == trace.marks[1_000].step
    read.clear()
    trace.steps[1_001]  # the next step: one more line
    assert len(read) == 1


def test_a_change_before_any_keyframe_or_outside_the_pool_is_one_line_damage(tmp_path, one_torch_thread):
    _, many = record_both_ways(tmp_path, 64)
    lines = many.read_text().splitlines()
    header, second = lines[0], json.loads(lines[2])
    headless = tmp_path / "no_keyframe.jsonl"
    headless.write_text("\n".join([header, *lines[2:4]]) + "\n")  # the first keyframe left out
    with pytest.raises(TraceError, match="line 3 is a change to the step before it, but no keyframe comes before it"):
        load_trace(headless, validate="none").steps[1]
    second["pool"]["changed"] = [[10_000, 1, None]]
    outside = tmp_path / "outside.jsonl"
    outside.write_text("\n".join([header, lines[1], json.dumps(second)]) + "\n")
    with pytest.raises(TraceError, match="line 3 changes block 10000, outside the pool's 0 .. 9"):
        load_trace(outside, validate="none").steps[1]


@pytest.mark.parametrize("name", ["trace_v1.jsonl", "scenario_v3.jsonl", "busy_v3.jsonl"])
def test_older_traces_load_as_their_lines_and_check_clean(name):
    trace = load_trace(DATA / name, validate="all")
    assert isinstance(trace.steps, list) and not isinstance(trace.steps, RebuiltSteps)
    assert trace.header["schema_version"] < 4 and check_trace(trace) == []


def test_the_recorder_leaves_archived_sequences_out_of_its_own_lines(tmp_path, one_torch_thread):
    """Once a keyframe has listed a finished sequence, the whole lines the recorder builds (and its
    checker) leave it out, so a step costs what the live sequences cost however many the trace has
    seen; a reader still rebuilds every step with every sequence, and both checks find nothing."""
    engine = make_tiny_engine(**BUSY_OPTIONS)
    path = tmp_path / "every1.jsonl"
    with TraceRecorder(engine, path) as recorder:
        recorder.deltas = DeltaWriter(every=1)
        seen = []
        original = recorder.checker.check
        recorder.checker.check = lambda step: seen.append(len(step["seqs"])) or original(step)  # type: ignore[method-assign]
        drive(engine, BUSY_REQUESTS, 200)
    whole = load_trace(path).steps
    assert len(whole[-1]["seqs"]) == len(BUSY_REQUESTS)  # the reader: every sequence in the last step
    assert max(seen) < len(BUSY_REQUESTS) and seen[-1] <= BUSY_OPTIONS["max_num_seqs"]
    assert len(recorder.rows) <= BUSY_OPTIONS["max_num_seqs"]
    assert recorder.violations == [] and check_trace(load_trace(path)) == []


def test_a_sequence_the_checker_forgot_is_not_missing_and_may_come_back(tmp_path, one_torch_thread):
    """The checker's forget(): a finished sequence left out of later steps is not 'missing'; listed
    again, it continues from the row it had. Without forget the same steps break continuity."""
    from tracer.trace.invariants.checker import InvariantChecker

    path = record_scenario(tmp_path / "t.jsonl")
    trace = load_trace(path)
    steps = list(trace.steps)
    done = next(
        i for i, s in enumerate(steps) if any(r["status_before"] == r["status_after"] == "FINISHED" for r in s["seqs"])
    )
    gone = next(r["seq_id"] for r in steps[done]["seqs"] if r["status_after"] == "FINISHED")
    assert done + 3 < len(steps)
    later = [{**s, "seqs": [r for r in s["seqs"] if r["seq_id"] != gone]} for s in steps[done + 1 :]]

    def check(forget: bool, back: bool) -> list:
        checker = InvariantChecker(trace.header["config"], trace.header["requests"], trace.header["eos_token_ids"])
        found = [v for s in steps[: done + 1] for v in checker.check(s)]
        if forget:
            checker.forget([gone])
        tail = [*later[:-1], steps[-1]] if back else later
        return found + [v for s in tail for v in checker.check(s)]

    assert check(forget=True, back=False) == [] and check(forget=True, back=True) == []
    assert any(v.invariant == "continuity" and v.seq_id == gone for v in check(forget=False, back=False))
