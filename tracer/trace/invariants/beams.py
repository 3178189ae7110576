"""A beam search's beams (BeamSearchParams): sequences of one request that share blocks, forked from
each other and copied on write.

A beam search starts as one sequence; after each step its beams are ranked together, and a beam
chosen twice is forked: the child (its row's `parent_id`) shares every block of its parent, so each of
those blocks gets one more holder. A beam about to write into a block another beam still holds gets
its own copy first (copy-on-write: the step's `blocks_to_copy`, copied before the forward). Three rules,
each with a planted engine bug it catches in tests/trace/test_beams_invariants.py:

    cow_copy             a copy was a free block, holds its source's K/V up to the slot the beam writes
                         next, and takes the source's place in the beam's block table
    beams_together       a beam search's running beams are scheduled together or not at all (they are
                         ranked against each other after every step)
    fork_shares_parent   a forked beam starts with its parent's block table, every block shared, and its
                         parent's counters

That a shared block is never written is kv_slots.shared_block_write's; that each block's ref count is
its holders, forks included, blocks.ref_counts'.
"""

from __future__ import annotations

from collections import Counter

from nanoengine.sequence import EventKind, FinishReason
from tracer.i18n import N_
from tracer.trace.invariants.reading import events_of, finished_with, forked, preempted, short, took_part
from tracer.trace.invariants.rule import Context, Findings, invariant
from tracer.trace.step_line import beam_width_of, blocks_to_copy_of, parent_of, request_of


@invariant(
    N_(
        "a copy-on-write copy was a free block, holds its source's KV up to the slot the beam writes next, "
        "and takes the source's place in the beam's block table"
    ),
    checks=("BlockManager.copy_on_write", "Scheduler.schedule_unit"),
    field="block_table",
)
def cow_copy(ctx: Context) -> Findings:
    copies, events = blocks_to_copy_of(ctx.step), copy_events(ctx)
    if not copies and not events:  # the common step: nothing copied
        return
    asked = {(e["detail"].get("source"), e["detail"].get("copy")): e["seq_id"] for e in events}
    for source, copy in copies:
        if (source, copy) not in asked:
            yield None, f"the step copies block {source} into block {copy}, but no copy_on_write event asks for it"
    for block, n in Counter(copy for _, copy in copies).items():
        if n > 1:
            yield None, f"block {block} is the copy of {n} blocks in one step"
    held = held_at_copy_time(ctx)
    for (source, copy), sid in asked.items():
        if sid in ctx.seqs:
            yield from check_copy(ctx, sid, source, copy, held, (source, copy) in copies)


def copy_events(ctx: Context) -> list[dict]:
    return events_of(ctx.step, EventKind.COPY_ON_WRITE)


def held_at_copy_time(ctx: Context) -> dict[int, list[int]]:
    """block -> the sequences holding it when the step's copies were taken: the previous step's holders,
    less those this step preempted or aborted before it scheduled (their blocks went back to the free list)."""
    if ctx.prev is None:
        return {}
    gone = set(preempted(ctx.step)) | {e["seq_id"] for e in finished_with(ctx.step, FinishReason.ABORT)}
    held: dict[int, list[int]] = {}
    for sid, row in ctx.prev.items():
        if sid not in gone:
            for block in row["block_table_after"]:
                held.setdefault(block, []).append(sid)
    return held


def check_copy(ctx: Context, sid: int, source: int, copy: int, held: dict[int, list[int]], listed: bool) -> Findings:
    row, bs = ctx.seqs[sid], ctx.block_size
    i = row["num_cached_tokens"] // bs  # the block it writes next
    if not listed:
        yield (
            sid,
            f"seq {sid} got block {copy} as its copy of block {source}, but the step's blocks_to_copy does not "
            f"list it: the runner never copied the K/V",
        )
    if held.get(copy):
        yield (
            sid,
            f"seq {sid}'s copy of block {source} is block {copy}, which seqs {held[copy]} held: a copy takes a free block",
        )
    table = row["block_table"]
    if not (i < len(table) and table[i] == copy):
        yield (
            sid,
            f"seq {sid} copied block {source} into block {copy} to write its block {i}, but its block table "
            f"during the step is {short(table)}",
        )
    before = (ctx.prev or {}).get(sid, {}).get("block_table_after")
    if before is not None and not (i < len(before) and before[i] == source):
        yield sid, f"seq {sid} copied block {source}, but its block {i} was {short(before[i : i + 1])} before the step"
    yield from check_copied_content(ctx, sid, source, copy, row["num_cached_tokens"] % bs)


def check_copied_content(ctx: Context, sid: int, source: int, copy: int, upto: int) -> Findings:
    """The copy's slots before the one the beam writes hold what the source's do (the KV shadow, after the
    step: nothing writes those slots in a correct step)."""
    blocks = ctx.kv.blocks
    if not (0 <= source < len(blocks) and 0 <= copy < len(blocks)):
        return  # outside the pool: pool_shape reports it
    for k in range(upto):
        if blocks[copy][k] != blocks[source][k]:
            position = ctx.seqs[sid]["num_cached_tokens"] - upto + k
            holds = ctx.kv.describe(blocks[copy][k], position)
            yield (
                sid,
                f"block {copy}, seq {sid}'s copy of block {source}, holds {holds} at slot {copy * ctx.block_size + k}, "
                f"not its source's KV",
            )
            return


@invariant(
    N_("a beam search's running beams are scheduled together or not at all"),
    checks=("Scheduler.schedule", "Scheduler.schedule_unit"),
    field="num_scheduled_tokens",
)
def beams_together(ctx: Context) -> Findings:
    searches: dict[int, list[int]] = {}
    for sid, row in took_part(ctx).items():
        if beam_width_of(row) and row["status_before"] == "RUNNING":
            searches.setdefault(request_of(row), []).append(sid)
    for request_id, beams in searches.items():
        ran = [sid for sid in beams if ctx.seqs[sid]["num_scheduled_tokens"] > 0]
        if ran and len(ran) < len(beams):
            idle = [sid for sid in beams if sid not in ran]
            yield (
                idle[0],
                f"request {request_id}'s beams {ran} were scheduled but {idle} were not: a beam search's beams are "
                f"ranked against each other after every step, so they run together",
            )


@invariant(
    N_(
        "a forked beam starts with its parent's block table, every block shared (its ref count up by one), "
        "and its parent's counters"
    ),
    checks=("BlockManager.fork", "LLMEngine.fork"),
    field="block_table",
)
def fork_shares_parent(ctx: Context) -> Findings:
    children = forked(ctx.step)
    forks_of = Counter(children.values())
    details = {e["seq_id"]: e["detail"] for e in events_of(ctx.step, EventKind.FORKED)}
    for child, parent in children.items():
        row, parent_row = ctx.seqs.get(child), ctx.seqs.get(parent)
        if row is None:
            continue  # status_edges names an event on a sequence the step does not list
        if parent_row is None:
            yield child, f"seq {child} was forked from seq {parent}, which is not in the step"
            continue
        yield from same_search(child, parent, row, parent_row)
        yield from same_blocks(ctx, child, parent, row, parent_row, details[child].get("blocks"), forks_of[parent])


def same_search(child: int, parent: int, row: dict, parent_row: dict) -> Findings:
    if parent_of(row) != parent:
        yield child, f"seq {child} was forked from seq {parent}, but its row names parent {parent_of(row)}"
    if not beam_width_of(row) or (request_of(row), beam_width_of(row)) != (
        request_of(parent_row),
        beam_width_of(parent_row),
    ):
        yield (
            child,
            f"seq {child} was forked from seq {parent} but is not a beam of its beam search (request "
            f"{request_of(row)}, beam_width {beam_width_of(row)}; its parent's: request {request_of(parent_row)}, "
            f"beam_width {beam_width_of(parent_row)})",
        )
    for name in ("num_prompt_tokens", "num_tokens_after", "num_cached_tokens_after"):
        if row[name] != parent_row[name]:
            yield (
                child,
                f"seq {child} was forked from seq {parent} with {name} = {row[name]}, not its parent's {parent_row[name]}",
            )


def same_blocks(
    ctx: Context, child: int, parent: int, row: dict, parent_row: dict, blocks: list[int] | None, num_forks: int
) -> Findings:
    table, theirs = list(row["block_table_after"]), list(parent_row["block_table_after"])
    if table != theirs or (blocks is not None and list(blocks) != table):
        yield (
            child,
            f"seq {child} was forked from seq {parent} with block table {short(table)} (its event says "
            f"{short(blocks or [])}), not its parent's {short(theirs)}: a fork shares every block",
        )
        return
    refs = ctx.step["pool"]["ref_counts"]
    low = [b for b in table if 0 <= b < len(refs) and refs[b] < 1 + num_forks]
    if low:
        yield (
            child,
            f"seq {child} shares seq {parent}'s blocks, but block {low[0]} has ref count {refs[low[0]]} with "
            f"{1 + num_forks} holders: each fork adds one",
        )
