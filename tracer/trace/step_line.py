"""One trace step line (docs/trace-format.md): its fields, how a recorder writes one, how a reader reads one.

The shapes below are the whole step, as every reader sees it (Trace.steps). From schema version 4 a
trace holds keyframes and changes instead (tracer/trace/keyframes.py: a line lists only the
sequences the step touched, the pool only as the blocks that changed, PoolChange); the reader
rebuilds the whole step, so nothing here changes for a reader.

Every field of a step line is defined here, once; the recorders' literals are type-checked against
these shapes. schema.json's step, seq, event, inputs, pool, queues and violation definitions list
the same fields (tests/trace/test_step_line_schema.py holds them equal). Both recorders write with
the builders below (nanoengine's, tracer/trace/recorder.py, and vLLM's, tracer/vllm/record.py);
readers read what older traces lack with the read helpers at the end, each saying its default once.

    engine_row(seq_step) / seq_row(engine, texts, output_text)   one sequence's row
    idle_row(last)               the row of a sequence the step did not touch (carried unchanged)
    pool_layout(seqs, pool)      owners and fill of each block, derived from the rows
    step_line(record, ...)       a nanoengine StepRecord as a trace line; bare_line(record): without
                                 what only a recorder adds, as check_record checks it
    seq_rows(step), request_of(row), parent_of(row), beam_width_of(row), blocks_to_copy_of(step),
    queues_of(step), waiting_length(queues), scheduled_after(row), own_status_after(row),
    block_id_lists(step)                                         for readers

No torch and no engine import: vLLM's recorder runs in a venv without nanoengine's dependencies.
The module has no `from __future__ import annotations`: TypedDict reads NotRequired from live
annotations, not from strings.
"""

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from typing_extensions import NotRequired, TypedDict

if TYPE_CHECKING:
    from nanoengine.step_record import BlockPool, InputsRecord, QueueOrder, SeqStep, StepRecord


# ---- the shapes (a recorder writes tuples, a loaded trace holds lists: Sequence is either) ----------
class EngineRow(TypedDict):
    """One sequence in one step, as the engine reports it: nanoengine's SeqStep, field for field.

    The middle fields (num_tokens ... block_table) are the values the step inputs were built from;
    the *_after fields, the state at the end of the step."""

    seq_id: int
    num_prompt_tokens: int
    status_before: str  # WAITING / RUNNING at the start of the step
    status_after: str  # WAITING / RUNNING / FINISHED at its end
    num_tokens: int
    num_cached_tokens: int
    num_scheduled_tokens: int
    block_table: Sequence[int]
    num_tokens_after: int
    num_cached_tokens_after: int
    num_scheduled_tokens_after: NotRequired[int]  # absent in the first traces: read it with scheduled_after
    block_table_after: Sequence[int]
    new_token_ids: Sequence[int]  # tokens appended this step (0 or 1)
    finish_reason: str | None  # stop / length / abort / ignored / error, once FINISHED
    # the request it answers, only where that is not its own seq_id (sample i > 0 of n): read it with request_of
    request_id: NotRequired[int]
    parent_id: NotRequired[int]  # the beam it was forked from, only for a forked beam: read it with parent_of
    beam_width: NotRequired[int]  # its beam search's, only for a beam: read it with beam_width_of


class SeqRow(EngineRow):
    """A row as a trace holds it: the engine's fields, then the texts the recorder decoded."""

    new_token_texts: list[str]  # each new token's own text
    output_text: str  # the whole completion so far
    new_token_logprobs: NotRequired[list[float]]  # each new token's logprob, if its request asked for logprobs


class EventLine(TypedDict):
    kind: str
    seq_id: int
    detail: dict[str, Any]  # kind-specific: docs/trace-format.md
    where: NotRequired[list[list[Any]]]  # [qualified name, line] that emitted it, innermost first


class InputsLine(TypedDict):
    """The flat, unpadded batch the model ran on."""

    seq_ids: Sequence[int]  # request order inside the batch
    input_ids: Sequence[int]
    positions: Sequence[int]
    query_start_loc: Sequence[int]  # one more than seq_ids
    seq_lens: Sequence[int]
    slot_mapping: Sequence[int]
    block_tables: Sequence[Sequence[int]]
    logits_indices: Sequence[int]  # one per sequence: its last scheduled token
    discard: Sequence[bool]  # True where the sequence is mid-prefill
    input_texts: NotRequired[list[str]]  # each input token's text: a recorder's, not the engine's


class PoolLayout(TypedDict):
    """What pool_layout derives from the rows."""

    owners: list[list[int]]  # the sequences whose block_table_after holds each block
    filled: list[int]  # each block's slots holding computed KV


class PoolLine(TypedDict):
    """The physical KV blocks at the end of the step; every list but free_block_ids is indexed by block id."""

    block_size: int
    ref_counts: Sequence[int]
    hashes: Sequence[int | None]  # prefix-cache hash of full, computed blocks
    free_block_ids: Sequence[int]  # eviction order, oldest first
    owners: NotRequired[list[list[int]]]  # pool_layout's
    filled: NotRequired[list[int]]  # pool_layout's


class PoolChange(TypedDict):
    """A version-4 change line's pool: what changed since the line before (tracer/trace/keyframes.py)."""

    block_size: int
    changed: list[list[Any]]  # [block id, ref count, hash] of each block whose ref count or hash changed
    free_removed: NotRequired[list[int]]  # blocks taken off the free list, wherever they were in it
    free_added: NotRequired[list[int]]  # blocks freed onto its tail, in order
    free_block_ids: NotRequired[list[int]]  # the whole list, when it changed some other way


class QueuesLine(TypedDict):
    """The scheduler's queues at the start of the step (schema version 2 on)."""

    running: Sequence[int]  # admission order: the victim policy preempts from the end
    waiting: Sequence[int]  # head first, as much as one step can admit
    num_waiting: NotRequired[int]  # the whole queue's length: read it with waiting_length


class ViolationLine(TypedDict):
    step: int
    seq_id: int | None
    invariant: str
    message: str


class StepLine(TypedDict):
    """A step line, its fields in the order a recorder writes them: the lazy loader finds
    new_requests before the events, and the events, inputs, pool and violations last
    (trace_file.marks_from_line)."""

    type: str  # "step"
    step: int
    keyframe: NotRequired[bool]  # a version-4 line that holds the whole pool (never in a rebuilt step)
    wall_time: float
    model_time: float
    seqs: Sequence[SeqRow]  # every request seen so far, by seq_id (a version-4 line: keyframes.py)
    new_requests: NotRequired[list[dict[str, Any]]]  # requests first seen in this step (header entries)
    events: list[EventLine]
    # copy-on-write (source, copy) blocks whose K/V the runner copied before the forward, only when
    # there are any: read it with blocks_to_copy_of
    blocks_to_copy: NotRequired[Sequence[Sequence[int]]]
    inputs: InputsLine
    queues: NotRequired[QueuesLine]  # absent in version-1 traces: read it with queues_of
    pool: PoolLine  # a version-4 change line holds a PoolChange instead
    violations: list[ViolationLine]


ENGINE_FIELDS = tuple(EngineRow.__annotations__)
PER_BLOCK_FIELDS = ("ref_counts", "hashes", "owners", "filled")  # the pool's lists with one entry per block


# ---- writing --------------------------------------------------------------------------------------
def engine_row(s: "SeqStep") -> EngineRow:
    """The engine's fields of a row, read off nanoengine's SeqStep; request_id only where it is not the
    seq_id, parent_id only for a forked beam, beam_width only for a beam (a row of a plain request is
    what it was before n and beam search existed)."""
    row = {name: getattr(s, name) for name in ENGINE_FIELDS}
    if row["request_id"] == row["seq_id"]:
        del row["request_id"]
    if row["parent_id"] < 0:
        del row["parent_id"]
    if row["beam_width"] <= 0:
        del row["beam_width"]
    return row  # type: ignore[return-value]


def seq_row(engine: EngineRow, new_token_texts: list[str], output_text: str) -> SeqRow:
    return {**engine, "new_token_texts": new_token_texts, "output_text": output_text}


def idle_row(last: SeqRow) -> SeqRow:
    """A sequence the step did not touch (finished earlier, or waiting untouched): listed with its
    last state as both its start and its end, nothing scheduled, no new tokens."""
    row: SeqRow = {
        **last,
        "status_before": last["status_after"],
        "num_tokens": last["num_tokens_after"],
        "num_cached_tokens": last["num_cached_tokens_after"],
        "num_scheduled_tokens": 0,
        "block_table": last["block_table_after"],
        "new_token_ids": [],
        "new_token_texts": [],
    }
    if "new_token_logprobs" in last:
        row["new_token_logprobs"] = []
    return row


def free_fill(block_size: int, ref_counts: Sequence[int], hashes: Sequence[int | None]) -> list[int]:
    """Each block's computed slots before the rows are counted: a free block that keeps its hash
    (cached, not yet reused) is full; any other starts empty."""
    return [block_size if h is not None and r == 0 else 0 for h, r in zip(hashes, ref_counts)]


def pool_layout(seqs: Sequence[EngineRow], pool: PoolLine) -> PoolLayout:
    """owners[b]: the sequences whose block_table_after holds b, in the rows' order; filled[b]: b's
    slots holding computed KV."""
    bs, n = pool["block_size"], len(pool["ref_counts"])
    filled = free_fill(bs, pool["ref_counts"], pool["hashes"])
    nobody: list[int] = []
    owners = [nobody] * n  # shared and never mutated: thousands of blocks, few owned
    for s in seqs:
        sid, cached = s["seq_id"], s["num_cached_tokens_after"]
        for i, block in enumerate(s["block_table_after"]):
            if 0 <= block < n:  # a broken engine's out-of-range id is the checker's to report
                owners[block] = [sid] if owners[block] is nobody else [*owners[block], sid]
                fill_here = cached - i * bs  # this block's computed slots, capped at bs
                if fill_here > filled[block]:
                    filled[block] = min(bs, fill_here)
    return {"owners": owners, "filled": filled}


def event_line(e: Any) -> EventLine:
    """An engine event (kind, seq_id, detail), without where it was emitted (the recorder adds that)."""
    return {"kind": e.kind, "seq_id": e.seq_id, "detail": e.detail}


def inputs_line(inputs: "InputsRecord") -> InputsLine:
    return {
        "seq_ids": inputs.seq_ids,
        "input_ids": inputs.input_ids,
        "positions": inputs.positions,
        "query_start_loc": inputs.query_start_loc,
        "seq_lens": inputs.seq_lens,
        "slot_mapping": inputs.slot_mapping,
        "block_tables": inputs.block_tables,
        "logits_indices": inputs.logits_indices,
        "discard": inputs.discard,
    }


def pool_line(pool: "BlockPool") -> PoolLine:
    return {
        "block_size": pool.block_size,
        "ref_counts": pool.ref_counts,
        "hashes": pool.hashes,
        "free_block_ids": pool.free_block_ids,
    }


def queues_line(queues: "QueueOrder") -> QueuesLine:
    return {"running": queues.running, "waiting": queues.waiting, "num_waiting": queues.num_waiting}


def step_line(
    record: "StepRecord",
    seqs: list[SeqRow],
    new_requests: list[dict[str, Any]],
    input_texts: list[str],
) -> StepLine:
    """A StepRecord as a trace's step line, with the recorder's rows (texts decoded, untouched
    sequences carried) and texts. Its violations are filled in once the line is checked. The pool's
    owners and filled are left to the reader (pool_layout): no check needs them, no line holds them."""
    inputs = inputs_line(record.inputs)
    inputs["input_texts"] = input_texts
    line: StepLine = {
        "type": "step",
        "step": record.step,
        "wall_time": round(record.wall_time, 6),
        "model_time": round(record.model_time, 6),
        "seqs": seqs,
        "new_requests": new_requests,
        "events": [event_line(e) for e in record.events],
        "blocks_to_copy": copies_of(record),
        "inputs": inputs,
        "queues": queues_line(record.queues),
        "pool": pool_line(record.pool),
        "violations": [],
    }
    if not line["blocks_to_copy"]:  # a step of plain requests is what it was before beam search existed
        del line["blocks_to_copy"]
    return line


def bare_line(record: "StepRecord") -> dict[str, Any]:
    """A StepRecord as the checker reads a step, without what only a recorder adds (token texts,
    the pool layout, new requests): what check_record checks."""
    line = {
        "type": "step",
        "step": record.step,
        "seqs": [engine_row(s) for s in record.seqs],
        "events": [event_line(e) for e in record.events],
        "blocks_to_copy": copies_of(record),
        "inputs": inputs_line(record.inputs),
        "queues": queues_line(record.queues),
        "pool": pool_line(record.pool),
    }
    if not line["blocks_to_copy"]:
        del line["blocks_to_copy"]
    return line


def copies_of(record: "StepRecord") -> list[list[int]]:
    """The step's copy-on-write copies as a line holds them: [source, copy] each."""
    return [[source, copy] for source, copy in record.blocks_to_copy]


# ---- reading --------------------------------------------------------------------------------------
def seq_rows(step: Mapping[str, Any]) -> dict[int, SeqRow]:
    """The step's rows by seq_id."""
    return {row["seq_id"]: row for row in step["seqs"]}


def request_of(row: Mapping[str, Any]) -> int:
    """The request a row's sequence answers: its own seq_id unless it is sample i > 0 of an n > 1 request."""
    return row.get("request_id", row["seq_id"])


def parent_of(row: Mapping[str, Any]) -> int:
    """The beam a row's sequence was forked from (sharing its blocks); -1 if it was not forked."""
    return row.get("parent_id", -1)


def beam_width_of(row: Mapping[str, Any]) -> int:
    """The beam width of the beam search a row's sequence is a beam of; 0 if it is not a beam."""
    return row.get("beam_width", 0)


def blocks_to_copy_of(step: Mapping[str, Any]) -> list[tuple[int, int]]:
    """The step's copy-on-write copies, (source, copy) each, in the order the runner made them."""
    return [(source, copy) for source, copy in step.get("blocks_to_copy", ())]


def queues_of(step: Mapping[str, Any]) -> QueuesLine | None:
    """The queues the step started with; None in a version-1 trace, which did not record them."""
    return step.get("queues")


def waiting_length(queues: QueuesLine) -> int:
    """The whole waiting queue's length; early version-2 traces list only its head, so that is all
    that is known."""
    return queues.get("num_waiting", len(queues["waiting"]))


def scheduled_after(row: Mapping[str, Any]) -> int:
    """num_scheduled_tokens at the end of the step; the first traces left it out, when it was always 0."""
    return row.get("num_scheduled_tokens_after", 0)


def own_status_after(row: Mapping[str, Any]) -> str:
    """The status the engine itself gave the sequence at the end of the step: a vLLM trace keeps
    vLLM's own name (PREEMPTED, WAITING_FOR_REMOTE_KVS, ...) beside nanoengine's three."""
    return row.get("vllm_status_after") or row["status_after"]


def block_id_lists(step: Mapping[str, Any]) -> Iterator[tuple[str, Sequence[int]]]:
    """(where, ids) for every list of block ids in the step: the free list, the copy-on-write
    copies (sources and copies, when there are any), the batch's block tables, each row's table
    before and after."""
    yield "pool/free_block_ids", step["pool"]["free_block_ids"]
    if copies := blocks_to_copy_of(step):
        yield "blocks_to_copy", [block for pair in copies for block in pair]
    for table in step["inputs"]["block_tables"]:
        yield "inputs/block_tables", table
    for i, row in enumerate(step["seqs"]):
        yield f"seqs/{i}/block_table", row["block_table"]
        yield f"seqs/{i}/block_table_after", row["block_table_after"]
