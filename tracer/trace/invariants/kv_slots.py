"""Where each token's K/V is written (slot_mapping), and what each sequence reads back: a shadow
of every slot, kept across steps, says whose prefix a slot holds."""

from __future__ import annotations

from collections import Counter

from nanoengine.sequence import EventKind
from tracer.i18n import N_
from tracer.trace.invariants.reading import batch_tokens, events_of, short, starts, took_part
from tracer.trace.invariants.rule import Context, Findings, invariant
from tracer.trace.step_line import blocks_to_copy_of


@invariant(
    N_("slot == block_table[pos // block_size] * block_size + pos % block_size"),
    checks=("compute_slot_mapping", "prepare_inputs"),
)
def slot_mapping(ctx: Context) -> Findings:
    inp, bs = ctx.step["inputs"], ctx.block_size
    for sid, i, _ in batch_tokens(ctx):
        table, pos, slot = ctx.seqs[sid]["block_table"], inp["positions"][i], inp["slot_mapping"][i]
        want = table[pos // bs] * bs + pos % bs if 0 <= pos // bs < len(table) else None
        if slot != want:
            yield (
                sid,
                f"seq {sid}'s token at position {pos} goes to slot {slot} "
                f"but block_table[{pos} // {bs}] * {bs} + {pos} % {bs} = {want}",
            )
            return


@invariant(N_("every slot lies in a block the sequence holds"))
def slot_in_own_block(ctx: Context) -> Findings:
    slots = ctx.step["inputs"]["slot_mapping"]
    for sid, i, _ in batch_tokens(ctx):
        block = slots[i] // ctx.block_size
        if block not in ctx.seqs[sid]["block_table"]:
            yield (
                sid,
                f"seq {sid} writes slot {slots[i]} in block {block}, "
                f"which is not in its block table {short(ctx.seqs[sid]['block_table'])}",
            )
            return


@invariant(N_("no KV slot is written twice in one step"))
def slot_unique(ctx: Context) -> Findings:
    for slot, n in Counter(ctx.step["inputs"]["slot_mapping"]).items():
        if n > 1:
            yield None, f"slot {slot} (block {slot // ctx.block_size}) is written {n} times in one step"


@invariant(
    N_(
        "every scheduled sequence reads, at each position 0 .. seq_len-1 through its block table, "
        "the KV computed for its own token prefix (a shadow of each slot, set by slot_mapping)"
    )
)
def kv_content(ctx: Context) -> Findings:
    inp, bs, kv = ctx.step["inputs"], ctx.block_size, ctx.kv
    if not kv.blocks:
        kv.start(len(ctx.step["pool"]["ref_counts"]), bs, fresh_engine=ctx.step["step"] == 0)
    for source, copy in blocks_to_copy_of(ctx.step):  # copy-on-write: the runner copies before the forward
        kv.copy(source, copy)
    chains = {}
    # Writes first: attention reads the K/V the step itself just wrote (a prefill reads its own chunk).
    for sid, start in starts(ctx).items():
        tokens = ctx.tokens.get(sid)
        if tokens is None:
            continue  # its prompt is unknown: nothing to compare with
        s = ctx.seqs[sid]
        end = start + s["num_scheduled_tokens"]
        chains[sid] = chain = kv.chain(sid, tokens, s["num_cached_tokens"] + s["num_scheduled_tokens"])
        kv.write(sid, chain, inp["input_ids"][start:end], inp["positions"][start:end], inp["slot_mapping"][start:end])
    for sid, chain in chains.items():
        s = ctx.seqs[sid]
        for bad in kv.bad_reads(sid, chain, s["block_table"], s["num_cached_tokens"] + s["num_scheduled_tokens"]):
            yield (
                sid,
                f"seq {sid} reads position {bad.position} from slot {bad.slot} (block {bad.slot // bs}), "
                f"which holds {bad.holds}, not its own prefix",
            )


@invariant(
    N_(
        "KV is written only into blocks no other sequence holds (shared blocks are read-only: a beam writes into "
        "its own copy, copy-on-write), except a block others hit in this same step, written by its computing "
        "sequence at its own positions"
    ),
    checks=("BlockManager.copy_on_write", "Scheduler.schedule_unit"),
)
def shared_block_write(ctx: Context) -> Findings:
    bs, inp = ctx.block_size, ctx.step["inputs"]
    writers: dict[int, int] = {}
    misplaced: set[int] = set()  # blocks written at a position that belongs to another of the writer's blocks
    for sid, i, _ in batch_tokens(ctx):
        block, j = inp["slot_mapping"][i] // bs, inp["positions"][i] // bs
        writers.setdefault(block, sid)
        table = ctx.seqs[sid]["block_table"]
        if not (0 <= j < len(table) and table[j] == block):
            misplaced.add(block)
    if not writers:
        return
    holders: dict[int, list[int]] = {}
    for sid, s in took_part(ctx).items():  # a beam forked after the forward did not hold its blocks then
        for block in s["block_table"]:
            if block in writers:
                holders.setdefault(block, []).append(sid)
    # A request admitted after the writer in this step may hit the block it computes now (vLLM v1's rule).
    hit_now: dict[int, set[int]] = {}
    for e in events_of(ctx.step, EventKind.PREFIX_HIT):
        for block in e["detail"]["blocks"]:
            hit_now.setdefault(block, set()).add(e["seq_id"])
    for block, sids in holders.items():
        readers = set(sids) - {writers[block]}
        if len(sids) > 1 and (block in misplaced or not readers <= hit_now.get(block, set())):
            yield (
                writers[block],
                f"seq {writers[block]} writes KV into block {block}, which seqs {sids} all hold: "
                f"a shared block is read-only (a sequence about to write into one gets its own copy first)",
            )
