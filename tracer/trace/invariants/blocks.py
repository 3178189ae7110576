"""The block pool: block tables, ref counts, the free list and the prefix cache's hashes."""

from __future__ import annotations

from collections import Counter
from operator import itemgetter

from nanoengine.sequence import EventKind
from tracer.i18n import N_
from tracer.trace.invariants.reading import events_of, short
from tracer.trace.invariants.rule import Context, Findings, invariant


@invariant(N_("a block table covers every cached or scheduled token, with no block twice"), field="block_table")
def block_table_coverage(ctx: Context) -> Findings:
    bs = ctx.block_size
    for sid, s in ctx.seqs.items():
        # A finished sequence has released its KV: its num_cached_tokens no longer needs blocks.
        live = s["status_after"] != "FINISHED"
        rows = [("after", s["block_table_after"], s["num_cached_tokens_after"])] if live else []
        if live or s["num_scheduled_tokens"]:
            rows.insert(0, ("during", s["block_table"], s["num_cached_tokens"] + s["num_scheduled_tokens"]))
        for when, table, need in rows:
            if len(table) * bs < need:
                yield (
                    sid,
                    f"seq {sid}'s block table {when} the step has "
                    f"{len(table)} blocks ({len(table) * bs} slots) for {need} tokens",
                )
            if len(set(table)) != len(table):
                yield sid, f"seq {sid}'s block table {when} the step {short(table)} holds a block twice"


@invariant(
    N_("each block's ref count == the number of sequences whose block table holds it"),
    checks=("BlockManager.allocate", "BlockManager.free"),
)
def ref_counts(ctx: Context) -> Findings:
    refs = ctx.step["pool"]["ref_counts"]
    expected, n = [0] * len(refs), len(refs)
    for s in ctx.seqs.values():
        for block in s["block_table_after"]:
            if 0 <= block < n:
                expected[block] += 1
    if list(refs) == expected:  # the common case, compared in C: real pools have thousands of blocks
        return
    for block, ref in enumerate(refs):
        if ref != expected[block]:
            yield None, f"block {block} has ref count {ref} but {expected[block]} sequences hold it"


@invariant(
    N_("the free list holds exactly the blocks with ref count 0, once each"),
    checks=("BlockManager.free", "BlockManager.take_free_block"),
)
def free_blocks(ctx: Context) -> Findings:
    pool = ctx.step["pool"]
    free, refs = pool["free_block_ids"], pool["ref_counts"]
    if ctx.memo.get("free_blocks") == (free, refs):  # unchanged since the last step found it exact
        return
    if free_list_is_exact(free, refs):
        ctx.memo["free_blocks"] = (free, refs)
        return
    for block, n in Counter(free).items():
        if n > 1:
            yield None, f"block {block} is on the free list {n} times"
        if 0 <= block < len(refs) and refs[block] != 0:
            yield None, f"block {block} is on the free list but has ref count {refs[block]}"
    free_set = set(free)
    for block, ref in enumerate(refs):
        if ref == 0 and block not in free_set:
            yield None, f"block {block} has ref count 0 but is not on the free list"


def free_list_is_exact(free, refs) -> bool:
    """Fast path: distinct free blocks, all with ref count 0, as many as there are ref-0 blocks."""
    if not free:
        return 0 not in refs
    if min(free) < 0 or max(free) >= len(refs) or len(set(free)) != len(free):
        return False
    on_free = itemgetter(*free)(refs)
    return not any(on_free if len(free) > 1 else (on_free,)) and list(refs).count(0) == len(free)


@invariant(N_("the pool has num_kv_blocks blocks and every block id is inside it"))
def pool_shape(ctx: Context) -> Findings:
    pool = ctx.step["pool"]
    num_blocks = ctx.config.get("num_kv_blocks", len(pool["ref_counts"]))
    if len(pool["ref_counts"]) != num_blocks or len(pool["hashes"]) != num_blocks:
        yield (
            None,
            f"the pool lists {len(pool['ref_counts'])} ref counts and "
            f"{len(pool['hashes'])} hashes for num_kv_blocks = {num_blocks}",
        )
    if pool["block_size"] != ctx.block_size:
        yield None, f"the pool's block_size {pool['block_size']} is not the config's {ctx.block_size}"
    for sid, s in ctx.seqs.items():
        tables = (*s["block_table"], *s["block_table_after"])
        if not tables or 0 <= min(tables) and max(tables) < num_blocks:  # the common case, in C
            continue
        bad = [b for b in tables if not 0 <= b < num_blocks]
        if bad:
            yield sid, f"seq {sid} holds block {bad[0]}, outside the pool of {num_blocks} blocks"
    free = pool["free_block_ids"]
    bad = [b for b in free if not 0 <= b < num_blocks] if free and (min(free) < 0 or max(free) >= num_blocks) else []
    if bad:
        yield None, f"the free list holds block {bad[0]}, outside the pool"


@invariant(N_("no two blocks share a prefix-cache hash"), checks=("BlockManager.register_full_blocks",))
def unique_prefix_hash(ctx: Context) -> Findings:
    hashes = ctx.step["pool"]["hashes"]
    if len(set(hashes)) + max(hashes.count(None) - 1, 0) == len(hashes):  # the common case, in C: no repeats
        return
    for h, n in Counter(h for h in hashes if h is not None).items():
        if n > 1:
            blocks = [b for b, x in enumerate(ctx.step["pool"]["hashes"]) if x == h]
            yield None, f"blocks {blocks} share the prefix hash {h}"


@invariant(N_("with prefix caching off there are no hashes and no prefix hits"))
def prefix_caching_off(ctx: Context) -> Findings:
    if ctx.config.get("enable_prefix_caching", True):
        return
    if any(h is not None for h in ctx.step["pool"]["hashes"]):
        yield None, "prefix caching is off but a block has a hash"
    for e in events_of(ctx.step, EventKind.PREFIX_HIT):
        yield e["seq_id"], f"prefix caching is off but seq {e['seq_id']} got a prefix hit"


@invariant(
    N_("a prefix hit reuses the first blocks of the table and skips exactly their tokens"),
    checks=("BlockManager.find_cached_prefix", "Scheduler.try_admit"),
    field="num_cached_tokens",
)
def prefix_hit(ctx: Context) -> Findings:
    for e in events_of(ctx.step, EventKind.PREFIX_HIT):
        if e["seq_id"] not in ctx.seqs:
            continue
        sid, s, blocks = e["seq_id"], ctx.seqs[e["seq_id"]], list(e["detail"]["blocks"])
        saved = e["detail"]["tokens_saved"]
        if list(s["block_table"][: len(blocks)]) != blocks:
            yield (
                sid,
                f"seq {sid} hit cached blocks {short(blocks)} but its block "
                f"table starts {short(s['block_table'][: len(blocks)])}",
            )
        if saved != len(blocks) * ctx.block_size or s["num_cached_tokens"] != saved:
            yield (
                sid,
                f"seq {sid} hit {len(blocks)} blocks, claims {saved} tokens "
                f"saved and starts with num_cached_tokens = {s['num_cached_tokens']}; all three "
                f"must agree ({len(blocks) * ctx.block_size})",
            )
