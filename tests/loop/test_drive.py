"""The workload driver: each arrival joins before its step (at once on an idle engine), an abort
lands at its step once its request has joined, the recorder hears each asked-for step, on_step
sees every step, and max_steps stops a run that does not end."""

from __future__ import annotations

import pytest
from conftest import make_tiny_engine

from nanoengine.sampling_params import SamplingParams
from tracer.loop.arrivals import Abort, Arrival, pop_due, sorted_arrivals
from tracer.loop.drive import StepLimitError, drive
from tracer.trace.invariants import check_trace
from tracer.trace.recorder import TraceRecorder
from tracer.trace.trace_file import load_trace

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def arrivals(*requests: tuple[str, int, int]) -> list[Arrival]:
    """(prompt, max_tokens, step) each, indexed in order."""
    return [
        Arrival(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True), step, i)
        for i, (prompt, max_tokens, step) in enumerate(requests)
    ]


def recorded(tmp_path, schedule: list[Arrival], **kwargs) -> tuple[dict[int, int], dict[str, tuple[int, int]]]:
    """Drive the schedule with a recorder; (ids, prompt -> (the step it joined, the step it asked for))."""
    engine = make_tiny_engine(num_kv_blocks=32)
    path = tmp_path / "drive.jsonl"
    with TraceRecorder(engine, path) as recorder:
        ids = drive(engine, schedule, recorder=recorder, **kwargs)
    trace = load_trace(path, "all")
    assert check_trace(trace) == []
    return ids, {r["prompt"]: (r["first_step"], r["arrive"]) for r in trace.requests.values()}


def test_each_arrival_joins_before_its_step(tmp_path):
    ids, steps = recorded(tmp_path, arrivals(("late", 3, 2), ("first", 4, 0), ("second", 4, 0)))
    assert steps == {"first": (0, 0), "second": (0, 0), "late": (2, 2)}
    assert sorted(ids) == [0, 1, 2] and len(set(ids.values())) == 3


def test_an_idle_engine_takes_the_next_arrival_at_once_and_the_one_after_at_its_own_step(tmp_path):
    # "a" finishes after steps 0-1; "b" (asked for 10) joins at 2 and runs to 13; "c" waits for 12
    _, steps = recorded(tmp_path, arrivals(("a", 2, 0), ("b", 12, 10), ("c", 2, 12)))
    assert steps == {"a": (0, 0), "b": (2, 10), "c": (12, 12)}


def test_an_abort_lands_at_its_step_or_once_its_request_has_joined():
    engine = make_tiny_engine(num_kv_blocks=32)
    schedule = arrivals(("kept", 6, 0), ("cut", 8, 0), ("early", 8, 2))
    aborts = [Abort(index=1, step=3), Abort(index=2, step=1)]  # "early" has not joined at step 1
    ids = drive(engine, schedule, aborts=aborts)
    outputs = [engine.collect(ids[i]) for i in range(3)]
    assert [o.finish_reason for o in outputs] == ["length", "abort", "abort"]
    assert [len(o.token_ids) for o in outputs] == [6, 3, 0]  # "cut" sampled in steps 0-2; "early" never ran


def test_on_step_sees_every_step_and_its_new_tokens():
    engine = make_tiny_engine(num_kv_blocks=32)
    seen: list[int] = []
    ids = drive(engine, arrivals(("one", 3, 0), ("two", 5, 1)), on_step=lambda appended: seen.append(len(appended)))
    assert len(seen) == engine.num_steps
    assert sum(seen) == sum(len(engine.collect(seq_id).token_ids) for seq_id in ids.values()) == 8


def test_max_steps_stops_a_run_that_has_not_finished():
    engine = make_tiny_engine(num_kv_blocks=32)
    with pytest.raises(StepLimitError, match="did not finish within 3 steps"):
        drive(engine, arrivals(("long", 10, 0)), max_steps=3)
    assert engine.num_steps == 3 and engine.has_unfinished()


def test_ids_tell_which_requests_joined_when_a_step_fails_and_the_rest_can_follow():
    """The CLI's path when the trace file cannot be written: the run goes on without the recorder."""
    engine = make_tiny_engine(num_kv_blocks=32)

    def disk_full(record) -> None:
        if record.step == 2:
            raise OSError("no space left")

    engine.add_step_hook(disk_full)
    schedule = arrivals(("a", 4, 0), ("b", 4, 1), ("c", 4, 5))
    ids: dict[int, int] = {}
    with pytest.raises(OSError):
        drive(engine, schedule, ids=ids)
    assert sorted(ids) == [0, 1]
    engine.remove_step_hook(disk_full)
    drive(engine, [a for a in schedule if a.index not in ids], ids=ids)
    assert [len(engine.collect(ids[i]).token_ids) for i in range(3)] == [4, 4, 4]


def test_pop_due_takes_one_arrival_early_on_an_idle_engine_and_none_on_a_busy_one():
    pending = sorted_arrivals(arrivals(("x", 1, 7), ("y", 1, 4), ("z", 1, 4)))
    assert pop_due(pending, num_steps=2, idle=False) == []
    assert [a.prompt for a in pop_due(pending, num_steps=2, idle=True)] == ["y"]
    assert [a.prompt for a in pop_due(pending, num_steps=4, idle=False)] == ["z"]
    assert [a.prompt for a in pending] == ["x"]
