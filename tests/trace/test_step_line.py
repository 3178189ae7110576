"""What tracer/trace/step_line.py derives and defaults: the pool layout, an idle row, old traces' gaps."""

from __future__ import annotations

from tracer.trace.step_line import (
    EngineRow,
    PoolLine,
    SeqRow,
    block_id_lists,
    idle_row,
    pool_layout,
    queues_of,
    scheduled_after,
    seq_row,
    waiting_length,
)


def row(seq_id: int, table: list[int], cached: int, **fields) -> SeqRow:
    engine = EngineRow(
        seq_id=seq_id,
        num_prompt_tokens=6,
        status_before="RUNNING",
        status_after="RUNNING",
        num_tokens=7,
        num_cached_tokens=cached - 1,
        num_scheduled_tokens=1,
        block_table=table,
        num_tokens_after=7,
        num_cached_tokens_after=cached,
        num_scheduled_tokens_after=0,
        block_table_after=table,
        new_token_ids=[9],
        finish_reason=None,
    )
    return {**seq_row(engine, ["x"], "x"), **fields}  # type: ignore[typeddict-item]


def pool(ref_counts: list[int], hashes: list[int | None]) -> PoolLine:
    return {"block_size": 4, "ref_counts": ref_counts, "hashes": hashes, "free_block_ids": []}


def test_owners_follow_the_tables_and_fill_the_computed_slots():
    # seqs 0 and 1 share block 0 (a prefix hit); block 3 is free but keeps its hash: cached, full
    seqs = [row(0, [0, 1], cached=6), row(1, [0, 2], cached=5)]
    layout = pool_layout(seqs, pool([2, 1, 1, 0, 0], [11, None, None, 33, None]))
    assert layout["owners"] == [[0, 1], [0], [1], [], []]
    assert layout["filled"] == [4, 2, 1, 4, 0]


def test_a_block_id_outside_the_pool_is_left_to_the_checker():
    layout = pool_layout([row(0, [0, 7], cached=8)], pool([1, 0], [None, None]))
    assert layout == {"owners": [[0], []], "filled": [4, 0]}


def test_an_idle_row_is_its_last_state_with_nothing_scheduled():
    last = row(0, [0, 1], cached=6, status_after="FINISHED", block_table_after=[])
    idle = idle_row(last)
    assert idle["status_before"] == idle["status_after"] == "FINISHED"
    assert (idle["num_tokens"], idle["num_cached_tokens"], idle["num_scheduled_tokens"]) == (7, 6, 0)
    assert idle["block_table"] == [] and not idle["new_token_ids"] and idle["new_token_texts"] == []
    assert idle["output_text"] == "x" and tuple(idle) == tuple(last)  # same fields, same order


def test_what_old_traces_lack_reads_as_its_default():
    v1_row = {"seq_id": 0}
    assert scheduled_after(v1_row) == 0 and scheduled_after({"num_scheduled_tokens_after": 3}) == 3
    assert queues_of({"seqs": []}) is None
    assert waiting_length({"running": [], "waiting": [4, 5]}) == 2  # early version 2: the listed head
    assert waiting_length({"running": [], "waiting": [4, 5], "num_waiting": 9}) == 9


def test_every_list_of_block_ids_is_named():
    step = {
        "pool": {"free_block_ids": [3]},
        "inputs": {"block_tables": [[0, 1]]},
        "seqs": [{"block_table": [0], "block_table_after": [0, 1]}],
    }
    assert list(block_id_lists(step)) == [
        ("pool/free_block_ids", [3]),
        ("inputs/block_tables", [0, 1]),
        ("seqs/0/block_table", [0]),
        ("seqs/0/block_table_after", [0, 1]),
    ]
