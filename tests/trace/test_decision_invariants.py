"""The decisions' invariants (tracer/trace/invariants/decisions.py), one per number family: each
stays silent on the real engine and names its planted engine bug (tests/trace/engine_bugs.py) from
the step records alone; a recorded number edited by hand is named too."""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import pytest
from conftest import BUSY_OPTIONS, BUSY_REQUESTS, drive
from engine_bugs import (
    admit_forgetting_free_hit_blocks,
    admit_keeping_a_token_back,
    budget_read_after_batching,
    make_room_for_a_spare_block,
)

from nanoengine.engine import LLMEngine
from nanoengine.scheduler import Scheduler
from nanoengine.sequence import EventKind
from tracer.teach.plant import planted
from tracer.trace.invariants import InvariantChecker
from tracer.trace.recorder import TraceRecorder
from tracer.trace.trace_file import load_trace

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# chunks capped by the budget, a pool too small (preemptions, waits), prefix hits
TIGHT = BUSY_REQUESTS[:5]  # without the late full-prefix repeat
# a finished request's blocks sit free in the cache; a repeat hits them, admitted with another
REVIVED = (("the cat sat on a mat", 2, 0), ("the cat sat on a mat", 2, 4), ("dog", 2, 4))


def run(requests, options=BUSY_OPTIONS, tmp: Path | None = None):
    """(violations, trace path) of one tiny-model run with the live checker."""
    engine = LLMEngine("tiny", **options)
    path = (tmp or Path(tempfile.mkdtemp())) / "t.jsonl"
    with TraceRecorder(engine, path) as recorder:
        drive(engine, requests, max_steps=200)
    return recorder.violations, path


@pytest.mark.parametrize("requests", [TIGHT, REVIVED], ids=["tight", "revived"])
def test_the_real_engine_keeps_every_decision_invariant(requests, tmp_path):
    violations, path = run(requests, tmp=tmp_path)
    assert violations == []
    kinds = {e["kind"] for s in load_trace(path).steps for e in s["events"]}
    assert {EventKind.NOT_ADMITTED, EventKind.PREEMPTED, EventKind.PREFIX_HIT} <= kinds or requests is REVIVED


@pytest.mark.parametrize(
    ("method", "broken", "requests", "invariant"),
    [
        ("schedule_tokens", budget_read_after_batching, TIGHT, "chunk_budget"),
        ("try_admit", admit_keeping_a_token_back, TIGHT, "chunk_size"),
        ("try_admit", admit_forgetting_free_hit_blocks, REVIVED, "admission_blocks"),
        ("make_room", make_room_for_a_spare_block, TIGHT, "preemption_need"),
    ],
    ids=["chunk_budget", "chunk_size", "admission_blocks", "preemption_need"],
)
def test_a_planted_bug_is_named_by_its_invariant(method, broken, requests, invariant, monkeypatch, tmp_path):
    monkeypatch.setattr(Scheduler, method, planted(broken))
    violations, _ = run(requests, tmp=tmp_path)
    assert invariant in {v.invariant for v in violations}, violations[:3]


@pytest.fixture(scope="module")
def clean_trace():
    _, path = run(TIGHT)
    return load_trace(path)


def first_event(trace, kind: EventKind) -> tuple[int, dict]:
    for i, step in enumerate(trace.steps):
        for e in step["events"]:
            if e["kind"] == kind:
                return i, e
    raise AssertionError(f"no {kind} event in the trace")


def named(trace, steps: list[dict]) -> set[str]:
    checker = InvariantChecker(config=trace.header["config"], requests=trace.header["requests"])
    return {v.invariant for step in steps for v in checker.check(step)}


@pytest.mark.parametrize(
    ("kind", "field", "delta", "invariant"),
    [
        (EventKind.PREFILL_CHUNK, "budget", -1, "chunk_budget"),
        (EventKind.ADMITTED, "need", 5, "admission_blocks"),
        (EventKind.NOT_ADMITTED, "free", 9, "admission_blocks"),
        (EventKind.PREEMPTED, "free", 9, "preemption_need"),
    ],
)
def test_an_edited_number_is_named(clean_trace, kind, field, delta, invariant):
    steps = copy.deepcopy(clean_trace.steps)
    i, e = first_event(clean_trace, kind)
    for event in steps[i]["events"]:
        if event == e:
            event["detail"][field] += delta
    assert invariant not in named(clean_trace, clean_trace.steps)
    assert invariant in named(clean_trace, steps[: i + 1])
