"""Each scheduler decision records the numbers it was taken on (docs/trace-format.md, "Decisions and
their numbers"): here every recorded number is checked against what the step record's own fields
(inputs, seqs, pool, queues) imply, decision kind by decision kind, on a tiny-model run that takes
each kind of decision several times."""

from __future__ import annotations

import pytest
from conftest import BUSY_OPTIONS, BUSY_REQUESTS, drive

from nanoengine.block_manager import blocks_needed
from nanoengine.engine import LLMEngine
from nanoengine.sequence import EventKind
from nanoengine.step_record import StepRecord

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def records() -> list[StepRecord]:
    """The step records of the tiny model running BUSY_REQUESTS (tests/conftest.py)."""
    engine = LLMEngine("tiny", **BUSY_OPTIONS)
    records: list[StepRecord] = []
    engine.add_step_hook(records.append)
    drive(engine, BUSY_REQUESTS, max_steps=200)
    return records


def events(records: list[StepRecord], kind: EventKind):
    return [(r, e) for r in records for e in r.events if e.kind == kind]


def row(record: StepRecord, seq_id: int):
    return next(s for s in record.seqs if s.seq_id == seq_id)


def test_a_chunk_records_the_budget_left_before_it(records):
    """budget == max_num_batched_tokens - the tokens scheduled before it in the batch, and the chunk
    is the rest of the sequence or exactly that budget."""
    capped = 0
    for r, e in events(records, EventKind.PREFILL_CHUNK):
        before = r.inputs.query_start_loc[r.inputs.seq_ids.index(e.seq_id)]
        assert e.detail["budget"] == BUSY_OPTIONS["max_num_batched_tokens"] - before, (r.step, e)
        rest = row(r, e.seq_id).num_tokens - e.detail["start"]
        assert e.detail["end"] - e.detail["start"] == min(rest, e.detail["budget"]), (r.step, e)
        capped += e.detail["end"] < row(r, e.seq_id).num_tokens
    assert capped >= 1, "the run should chunk a prefill at the budget"


def test_an_admission_records_the_blocks_it_takes_and_the_free_blocks(records):
    """need: the new blocks of its table plus the hit blocks that sat free; free: the pool's free
    blocks when it was decided. The first admission of a fresh engine sees the whole pool, and each
    admission in a step sees what the one before it left."""
    for r, e in events(records, EventKind.ADMITTED):
        hits = [h for h in r.events if h.kind == EventKind.PREFIX_HIT and h.seq_id == e.seq_id]
        hit_blocks = len(hits[0].detail["blocks"]) if hits else 0
        table = len(row(r, e.seq_id).block_table)
        assert table - hit_blocks <= e.detail["need"] <= table, (r.step, e)
        assert e.detail["need"] <= e.detail["free"], (r.step, e)
    assert records[0].events[0].detail["free"] == BUSY_OPTIONS["num_kv_blocks"]
    pairs = 0
    for r in records:
        admitted = [e for e in r.events if e.kind == EventKind.ADMITTED]
        for a, b in zip(admitted, admitted[1:]):
            assert b.detail["free"] == a.detail["free"] - a.detail["need"], (r.step, admitted)
            pairs += 1
    assert pairs >= 1, "the run should admit two requests in one step"


def test_a_wait_for_blocks_records_the_blocks_needed_and_free(records):
    """not_admitted: the head of the waiting queue, still WAITING, needing more blocks than are free;
    in a step with no admission before it, free is the free blocks when the step started, less what
    the running sequences took in this step."""
    waits = events(records, EventKind.NOT_ADMITTED)
    assert len(waits) >= 2, "the run should leave a request waiting for blocks"
    by_step = {r.step: r for r in records}
    exact = 0
    for r, e in waits:
        assert e.detail["need"] > e.detail["free"], (r.step, e)
        assert row(r, e.seq_id).status_after == "WAITING"
        assert not any(x.kind == EventKind.PREEMPTED for x in r.events), "no admission after a preemption"
        prev = by_step.get(r.step - 1)
        admitted = any(x.kind == EventKind.ADMITTED for x in r.events)
        finished = any(x.kind == EventKind.FINISHED for x in r.events)
        if prev is None or admitted or finished:
            continue
        before = {s.seq_id: len(s.block_table_after) for s in prev.seqs}
        grown = sum(len(row(r, sid).block_table) - before[sid] for sid in r.inputs.seq_ids)
        assert e.detail["free"] == len(prev.pool.free_block_ids) - grown, (r.step, e)
        exact += 1
    assert exact >= 1


def test_a_preemption_records_who_needed_the_room_and_the_free_blocks(records):
    """by: a sequence running at the start of the step; free: fewer blocks than by took in this step;
    the victims of one step see the pool grow by what the victims before them gave back."""
    preemptions = events(records, EventKind.PREEMPTED)
    assert preemptions, "the run should preempt"
    bs = BUSY_OPTIONS["block_size"]
    for r, e in preemptions:
        assert e.detail["by"] in r.queues.running, (r.step, e)
        by = row(r, e.detail["by"])
        if by.num_scheduled_tokens:
            took = len(by.block_table) - blocks_needed(by.num_cached_tokens, bs)
            assert e.detail["free"] < took, (r.step, e)
    for r in records:
        victims = [e for e in r.events if e.kind == EventKind.PREEMPTED]
        for a, b in zip(victims, victims[1:]):
            assert b.detail["free"] >= a.detail["free"], (r.step, victims)


def test_the_numbers_are_plain_ints_in_compact_details(records):
    """Short keys, ints: the trace grows by a few bytes per decision."""
    keys = {EventKind.ADMITTED: {"need", "free"}, EventKind.NOT_ADMITTED: {"need", "free"}}
    keys[EventKind.PREEMPTED] = {"by", "free"}
    for r in records:
        for e in r.events:
            if e.kind in keys:
                assert set(e.detail) == keys[e.kind]
                assert all(type(v) is int for v in e.detail.values())
            if e.kind == EventKind.PREFILL_CHUNK:
                assert type(e.detail["budget"]) is int
