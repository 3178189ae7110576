"""The numbers each scheduler decision records (trace schema 3) agree with the step's own fields.

A decision's event carries what only the engine knew when it took it (docs/trace-format.md,
"Decisions and their numbers"); these rules check each number family against what the step line
implies, so a wrong why cannot hide behind a right schedule. An event without the numbers (an older
trace, vLLM's, a student's own function) is skipped.
"""

from __future__ import annotations

from nanoengine.block_manager import blocks_needed
from nanoengine.sequence import EventKind
from tracer.i18n import N_
from tracer.trace.invariants.reading import events_of, starts
from tracer.trace.invariants.rule import Context, Findings, invariant
from tracer.trace.step_line import beam_width_of, queues_of, request_of


def number(detail: object, key: str) -> int | None:
    value = detail.get(key) if isinstance(detail, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def chunks(ctx: Context) -> list[tuple[dict, int]]:
    """The step's prefill chunks that record their budget, each with that budget."""
    found = []
    for e in events_of(ctx.step, EventKind.PREFILL_CHUNK):
        budget = number(e.get("detail"), "budget")
        if budget is not None and e["seq_id"] in ctx.seqs:
            found.append((e, budget))
    return found


@invariant(
    N_("a prefill chunk's budget is max_num_batched_tokens less the tokens batched before it"),
    checks=("Scheduler.schedule_tokens",),
)
def chunk_budget(ctx: Context) -> Findings:
    limit = ctx.config.get("max_num_batched_tokens")
    if not isinstance(limit, int):
        return
    offsets = starts(ctx)
    for e, budget in chunks(ctx):
        sid = e["seq_id"]
        if sid in offsets and budget != limit - offsets[sid]:
            yield (
                sid,
                f"seq {sid}'s chunk records a budget of {budget} tokens, but {offsets[sid]} of the "
                f"{limit} were batched before it: {limit - offsets[sid]} were left",
            )


@invariant(
    N_("a prefill chunk is the rest of the sequence or exactly the budget left, whichever is less"),
    checks=("Scheduler.schedule", "Scheduler.try_admit"),
)
def chunk_size(ctx: Context) -> Findings:
    for e, budget in chunks(ctx):
        sid, detail = e["seq_id"], e["detail"]
        start, end, num_tokens = number(detail, "start"), number(detail, "end"), ctx.seqs[sid]["num_tokens"]
        if start is None or end is None or not isinstance(num_tokens, int):
            continue
        want = min(num_tokens - start, budget)
        if end - start != want:
            yield (
                sid,
                f"seq {sid}'s chunk computes {end - start} tokens ({start}..{end}) with {num_tokens - start} "
                f"to go and a budget of {budget}: it should be {want}",
            )


@invariant(
    N_("an admission takes the blocks its table gained (at most its table), and no more than are free"),
    checks=("Scheduler.try_admit",),
)
def admission_blocks(ctx: Context) -> Findings:
    """A wait (not_admitted) needs more than are free; each admission or wait of a step sees the
    free blocks the one before it left."""
    hits = {e["seq_id"]: e["detail"].get("blocks") or [] for e in events_of(ctx.step, EventKind.PREFIX_HIT)}
    previous: tuple[int, int, int] | None = None  # (seq_id, need, free) of the step's last admission
    for e in ctx.step["events"]:
        if e["kind"] not in (EventKind.ADMITTED, EventKind.NOT_ADMITTED):
            continue
        sid, need, free = e["seq_id"], number(e.get("detail"), "need"), number(e.get("detail"), "free")
        if need is None or free is None:
            continue
        if previous is not None and free != previous[2] - previous[1]:
            yield (
                sid,
                f"seq {sid}'s {e['kind']} saw {free} free blocks, but seq {previous[0]}'s admission just "
                f"before it saw {previous[2]} and took {previous[1]}: {previous[2] - previous[1]} were left",
            )
        if e["kind"] == EventKind.NOT_ADMITTED:
            if need <= free:
                yield sid, f"seq {sid} was not admitted, yet it needs {need} blocks and {free} are free"
            continue
        previous = (sid, need, free)
        table = ctx.seqs.get(sid, {}).get("block_table")
        if not isinstance(table, (list, tuple)):
            continue
        gained = len(table) - len(hits.get(sid, []))
        if not gained <= need <= len(table) or need > free:
            yield (
                sid,
                f"seq {sid}'s admission records that it takes {need} blocks of {free} free, but its table "
                f"has {len(table)} blocks, {gained} of them new: it takes {gained} to {len(table)}, at most "
                f"{free}",
            )


@invariant(
    N_("a preemption leaves fewer free blocks than the sequence that needed the room takes"),
    checks=("Scheduler.make_room", "Scheduler.preempt"),
)
def preemption_need(ctx: Context) -> Findings:
    queues = queues_of(ctx.step)
    for e in events_of(ctx.step, EventKind.PREEMPTED):
        sid, by, free = e["seq_id"], number(e.get("detail"), "by"), number(e.get("detail"), "free")
        if by is None or free is None:
            continue
        if queues is not None and by not in queues["running"]:
            yield sid, f"seq {sid} was preempted for seq {by}, which was not running when the step started"
            continue
        row = ctx.seqs.get(by)
        if row is None or by not in ctx.batch or ctx.block_size <= 0 or not isinstance(row["num_cached_tokens"], int):
            continue  # not scheduled: it gave up its own place and took nothing
        took = sum(blocks_taken(ctx, unit_row) for unit_row in unit_rows(ctx, row))
        if free >= took:
            yield sid, preemption_need_message(ctx, sid, by, free, took)


def unit_rows(ctx: Context, row: dict) -> list[dict]:
    """The batched rows scheduled as a whole with row: its beam search's beams, else row alone."""
    if not beam_width_of(row):
        return [row]
    return [
        r for sid, r in ctx.seqs.items() if sid in ctx.batch and beam_width_of(r) and request_of(r) == request_of(row)
    ]


def blocks_taken(ctx: Context, row: dict) -> int:
    """The free blocks make_room counted for a scheduled sequence: its table's new blocks, and one for
    the shared block it writes next. That is its copy, or, for the last beam writing a block its
    siblings copied away from in this step, a block it did not need after all: the engine counts
    every beam's next shared block before any copy is made (vLLM v0 asked for a free block per beam)."""
    cows = list(events_of(ctx.step, EventKind.COPY_ON_WRITE))
    copies = sum(1 for e in cows if e["seq_id"] == row["seq_id"])
    i, table = row["num_cached_tokens"] // ctx.block_size, row["block_table"]
    kept = not copies and i < len(table) and table[i] in {(e.get("detail") or {}).get("source") for e in cows}
    return len(table) - blocks_needed(row["num_cached_tokens"], ctx.block_size) + copies + kept


def preemption_need_message(ctx: Context, sid: int, by: int, free: int, took: int) -> str:
    """Which is wrong: the recorded number (counted after the victim's blocks came back) or the
    decision (the room was there before)."""
    said = f"seq {sid} was preempted for seq {by} with {free} blocks free, but seq {by} took only {took} new block{'s' if took != 1 else ''}"
    gave = len((ctx.prev or {}).get(sid, {}).get("block_table_after") or [])
    if gave and free - gave < took:
        return (
            f"{said}: {free} looks like the count after seq {sid}'s {gave} blocks were given back ({free - gave} "
            f"before, too few): the recorded number is wrong, not the decision (count the free blocks before freeing)"
        )
    return f"{said} in this step: the room was there, so the preemption was not needed"
