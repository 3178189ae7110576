"""vLLM v1's rules, for traces of its own scheduler (header `engine: vllm ...`, written by
tracer/vllm/record.py). The vllm profile keeps every other rule, and uses these where the two
engines differ on purpose:

    free_blocks         vLLM keeps block 0 as its null block: never free, never in a table
    shared_block_write  a same-step prefix hit: vLLM caches a full block's hash when it is
                        *scheduled*, so a request admitted later in the step shares a block that an
                        earlier one writes in that very forward pass (all K/V is written before any
                        attention reads it)
    unique_prefix_hash  vLLM keeps blocks with equal hashes: a full prefix hit stops one token short,
                        so the last block is computed again into a new block with the hash of the
                        cached one; the rule becomes "equal hashes, equal KV"

and two invariants of its own: `no_admission_after_preemption` (its scheduler skips the waiting
queue in a step that preempted) and `finished_ids_next_step` (the scheduler output's
finished_req_ids are the requests that finished in the previous step). The policy invariants
(victim_policy, preempted_to_head, admission_order, eos_finish, abort_step) are kept: vLLM's
FCFS policy is the same rule.
"""

from __future__ import annotations

from collections import Counter

from nanoengine.sequence import EventKind
from tracer.i18n import N_
from tracer.trace.invariants.reading import batch_tokens, events_of, preempted
from tracer.trace.invariants.rule import Context, Findings, invariant

NULL_BLOCK = 0  # vLLM's BlockPool takes the first block off its free queue as the null block


@invariant(
    N_("the free list holds exactly the ref-0 blocks but the null block (block 0), which no table holds"),
    name="free_blocks",
)
def free_blocks_but_the_null_block(ctx: Context) -> Findings:
    pool = ctx.step["pool"]
    free, refs = pool["free_block_ids"], pool["ref_counts"]
    for block, n in Counter(free).items():
        if n > 1:
            yield None, f"block {block} is on the free list {n} times"
        if block == NULL_BLOCK:
            yield None, f"the null block {NULL_BLOCK} is on the free list"
        elif 0 <= block < len(refs) and refs[block] != 0:
            yield None, f"block {block} is on the free list but has ref count {refs[block]}"
    free_set = set(free)
    for block, ref in enumerate(refs):
        if ref == 0 and block not in free_set and block != NULL_BLOCK:
            yield None, f"block {block} has ref count 0 but is not on the free list"
    for sid, s in ctx.seqs.items():
        if NULL_BLOCK in s["block_table_after"]:
            yield sid, f"seq {sid} holds the null block {NULL_BLOCK}"


@invariant(
    N_(
        "KV is written only into blocks no other sequence holds, or that a sequence admitted in this "
        "step hit (a same-step prefix hit: vLLM caches a block's hash when it is scheduled)"
    ),
    name="shared_block_write",
)
def shared_block_write_but_same_step_hits(ctx: Context) -> Findings:
    bs = ctx.block_size
    writers: dict[int, int] = {}
    for sid, i, _ in batch_tokens(ctx):
        writers.setdefault(ctx.step["inputs"]["slot_mapping"][i] // bs, sid)
    hit_now = {e["seq_id"]: set(e["detail"]["blocks"]) for e in events_of(ctx.step, EventKind.PREFIX_HIT)}
    for block, writer in writers.items():
        others = [sid for sid, s in ctx.seqs.items() if sid != writer and block in s["block_table"]]
        strangers = [sid for sid in others if block not in hit_now.get(sid, ())]
        if strangers:
            yield (
                writer,
                f"seq {writer} writes KV into block {block}, which seqs {sorted([writer, *others])} hold, "
                f"and seqs {strangers} did not hit it in this step: a shared block is read-only",
            )


@invariant(
    N_(
        "blocks sharing a prefix hash hold the same KV (vLLM keeps duplicates: a full prefix hit "
        "recomputes its last block into a new one)"
    ),
    name="unique_prefix_hash",
)
def equal_hash_equal_kv(ctx: Context) -> Findings:
    hashes = ctx.step["pool"]["hashes"]
    if not ctx.kv.blocks or len(set(hashes)) + max(hashes.count(None) - 1, 0) == len(hashes):
        return
    for h, n in Counter(h for h in hashes if h is not None).items():
        if n < 2:
            continue
        blocks = [b for b, x in enumerate(hashes) if x == h]
        contents = {tuple(map(repr, ctx.kv.blocks[b])) for b in blocks if b < len(ctx.kv.blocks)}
        if len(contents) > 1:
            yield None, f"blocks {blocks} share the prefix hash {h} but hold different KV"


@invariant(N_("a step that preempts admits no waiting request"))
def no_admission_after_preemption(ctx: Context) -> Findings:
    if not preempted(ctx.step):
        return
    for e in events_of(ctx.step, EventKind.ADMITTED):
        yield (
            e["seq_id"],
            f"seq {e['seq_id']} is admitted in a step that preempted (vLLM skips the waiting queue then)",
        )


@invariant(N_("the scheduler output's finished_req_ids are the requests that finished in the previous step"))
def finished_ids_next_step(ctx: Context) -> Findings:
    reported = (ctx.step.get("vllm") or {}).get("finished_req_ids")
    if reported is None or ctx.prev is None:
        return
    want = sorted(sid for sid, s in ctx.prev.items() if s["status_after"] == "FINISHED" != s["status_before"])
    if sorted(reported) != want:
        yield None, f"finished_req_ids is {sorted(reported)} but the previous step finished {want}"
