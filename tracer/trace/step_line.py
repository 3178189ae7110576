"""One trace step line: its typed shape (mirroring schema.json) and the one function that turns
a nanoengine StepRecord into it. The recorder adds its texts and the pool layout on top; the live
checker checks the bare line."""

from __future__ import annotations

from typing import Any, TypedDict

from typing_extensions import NotRequired

from nanoengine.step_record import StepRecord


class SeqRow(TypedDict):
    seq_id: int
    num_prompt_tokens: int
    status_before: str
    status_after: str
    num_tokens: int
    num_cached_tokens: int
    num_scheduled_tokens: int
    block_table: list[int] | tuple[int, ...]
    num_tokens_after: int
    num_cached_tokens_after: int
    num_scheduled_tokens_after: int
    block_table_after: list[int] | tuple[int, ...]
    new_token_ids: list[int] | tuple[int, ...]
    finish_reason: str | None
    new_token_texts: NotRequired[list[str]]  # recorder only
    output_text: NotRequired[str]  # recorder only


class EventLine(TypedDict):
    kind: str
    seq_id: int
    detail: dict[str, Any]
    where: NotRequired[list[list[Any]]]  # recorder only: [qualified name, line] that emitted it, innermost first


class InputsLine(TypedDict):
    seq_ids: list[int] | tuple[int, ...]
    input_ids: list[int] | tuple[int, ...]
    positions: list[int] | tuple[int, ...]
    query_start_loc: list[int] | tuple[int, ...]
    seq_lens: list[int] | tuple[int, ...]
    slot_mapping: list[int] | tuple[int, ...]
    block_tables: list[list[int]] | tuple[tuple[int, ...], ...]
    logits_indices: list[int] | tuple[int, ...]
    discard: list[bool] | tuple[bool, ...]
    input_texts: NotRequired[list[str]]  # recorder only


class PoolLine(TypedDict):
    block_size: int
    ref_counts: list[int] | tuple[int, ...]
    hashes: list[int | None] | tuple[int | None, ...]
    free_block_ids: list[int] | tuple[int, ...]
    owners: NotRequired[list[list[int]]]  # recorder only: sequences holding each block
    filled: NotRequired[list[int]]  # recorder only: computed slots of each block


class PoolLayout(TypedDict):
    owners: list[list[int]]
    filled: list[int]


class QueuesLine(TypedDict):
    running: list[int] | tuple[int, ...]  # at the start of the step, admission order
    waiting: list[int] | tuple[int, ...]  # at the start of the step, head first: as much as one step can admit
    num_waiting: NotRequired[int]  # the whole queue's length (absent in early version-2 traces)


class StepLine(TypedDict):
    type: str  # "step"
    step: int
    wall_time: float
    model_time: float
    seqs: list[SeqRow]
    events: list[EventLine]
    inputs: InputsLine
    pool: PoolLine
    queues: QueuesLine  # schema version 2
    new_requests: NotRequired[list[dict[str, Any]]]
    violations: NotRequired[list[dict[str, Any]]]


def seq_row(s: Any) -> SeqRow:
    return {f: getattr(s, f) for f in type(s).__slots__}  # type: ignore[return-value]


def line_from_record(record: StepRecord) -> StepLine:
    """A StepRecord as a step line, without the recorder's decoded texts and pool layout."""
    inp, pool = record.inputs, record.pool
    return {
        "type": "step",
        "step": record.step,
        "wall_time": round(record.wall_time, 6),
        "model_time": round(record.model_time, 6),
        "seqs": [seq_row(s) for s in record.seqs],
        "events": [{"kind": e.kind, "seq_id": e.seq_id, "detail": e.detail} for e in record.events],
        "inputs": {f: getattr(inp, f) for f in type(inp).__slots__},  # type: ignore[typeddict-item]
        "pool": {f: getattr(pool, f) for f in type(pool).__slots__},  # type: ignore[typeddict-item]
        "queues": {
            "running": record.queues.running,
            "waiting": record.queues.waiting,
            "num_waiting": record.queues.num_waiting,
        },
    }
