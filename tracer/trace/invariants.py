"""The invariant checker: what must hold at every engine step, checked on a step dict.

A step dict is one step line of a trace (docs/trace-format.md). The same checker runs live
inside the recorder (on the dict it is about to write) and offline on a loaded trace:

    checker = InvariantChecker(config=header["config"], requests=header["requests"])
    for step in steps:
        violations = checker.check(step)          # list[Violation]

    check_trace(trace) -> list[Violation]         # a loaded trace (tracer.trace_file.Trace)
    check_record(record, block_size=16)           # a bare nanoengine StepRecord, no history

Each Violation names the step, the sequence (or None), the invariant (a key of INVARIANTS)
and says what is wrong in one plain-English sentence. The checker keeps a little history
between steps (the previous step's sequences and every sequence's tokens) so it can also
check what must carry over from one step to the next; without config or requests, the
checks that need them are skipped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from nanoengine.sequence import EventKind, FinishReason
from tracer.trace.kv_shadow import KvShadow
from tracer.trace.step_line import line_from_record

# name -> what must hold (one line each; the trace viewer and `nanoengine check` show these)
INVARIANTS: dict[str, str] = {
    "scheduled_zero_after": "num_scheduled_tokens is 0 outside a step (the *_after state)",
    "batch_membership": "the batch holds exactly the sequences with num_scheduled_tokens > 0, once each",
    "cached_le_tokens": "num_cached_tokens <= num_tokens, before and after the step",
    "scheduled_within_tokens": "num_cached_tokens + num_scheduled_tokens <= num_tokens",
    "token_count": "sum(num_scheduled_tokens) == len(input_ids) == len(positions) == len(slot_mapping)",
    "batch_shapes": "seq_lens, block_tables, logits_indices and discard have one entry per batched sequence",
    "query_start_loc": "query_start_loc starts at 0, never decreases, steps by num_scheduled_tokens, "
    "ends at the token count",
    "positions": "each position == its sequence's num_cached_tokens + offset inside the chunk",
    "seq_lens": "seq_lens == num_cached_tokens + num_scheduled_tokens",
    "logits_indices": "logits_indices == query_start_loc[1:] - 1 (each sequence's last scheduled token)",
    "input_ids": "input_ids are the sequence's tokens num_cached_tokens .. num_cached_tokens + num_scheduled_tokens",
    "block_tables_match": "the batch's block_tables row is the sequence's block_table",
    "slot_mapping": "slot == block_table[pos // block_size] * block_size + pos % block_size",
    "slot_in_own_block": "every slot lies in a block the sequence holds",
    "slot_unique": "no KV slot is written twice in one step",
    "block_table_coverage": "a block table covers every cached or scheduled token, with no block twice",
    "ref_counts": "each block's ref count == the number of sequences whose block table holds it",
    "free_blocks": "the free list holds exactly the blocks with ref count 0, once each",
    "pool_shape": "the pool has num_kv_blocks blocks and every block id is inside it",
    "unique_prefix_hash": "no two blocks share a prefix-cache hash",
    "prefix_caching_off": "with prefix caching off there are no hashes and no prefix hits",
    "prefix_hit": "a prefix hit reuses the first blocks of the table and skips exactly their tokens",
    "mid_prefill_discard": "a sequence is discarded (mid-prefill) exactly when seq_lens < num_tokens",
    "token_gain": "a mid-prefill, unscheduled or failed sequence gains no token; a finished prefill or decode "
    "gains exactly one",
    "token_growth": "num_tokens_after == num_tokens + the new tokens",
    "cached_advance": "a scheduled sequence ends the step with num_cached_tokens + num_scheduled_tokens cached "
    "(unless its step failed: finish_reason error)",
    "status_edges": "status changes only along legal edges (WAITING->RUNNING admitted, RUNNING->WAITING "
    "preempted, RUNNING->FINISHED, WAITING->FINISHED when aborted or ignored)",
    "finish_reason": "a sequence has a finish_reason exactly when it is FINISHED",
    "continuity": "each step starts where the previous one ended (status, num_tokens, num_prompt_tokens)",
    "finished_holds_no_blocks": "a FINISHED sequence holds no blocks",
    "no_leak": "when no sequence is live, every block is free (no leaked blocks)",
    "token_budget": "a step schedules at most max_num_batched_tokens tokens and max_num_seqs sequences",
    "kv_content": "every scheduled sequence reads, at each position 0 .. seq_len-1 through its block table, "
    "the KV computed for its own token prefix (a shadow of each slot, set by slot_mapping)",
    "shared_block_write": "KV is written only into blocks no other sequence holds (shared prefix blocks are read-only), "
    "except a block others hit in this same step, written by its computing sequence at its own positions",
    "preempt_resets": "a preempted sequence ends the step WAITING with no blocks and num_cached_tokens 0",
    "victim_policy": "preemption takes the newest running sequence first (the end of the running list)",
    "preempted_to_head": "preempted sequences wait at the head of the waiting queue, the last preempted first",
    "admission_order": "a step admits from the head of the waiting queue, in order (its own preempted ones first)",
    "eos_finish": "sampling an EOS id finishes the sequence with 'stop' unless ignore_eos; "
    "a 'stop' without an EOS id needs a stop string",
    "abort_step": "an abort takes effect in the step it was requested for",
}

LIVE = ("WAITING", "RUNNING")
FINISH_FROM_WAITING = (FinishReason.ABORT, FinishReason.IGNORED)


@dataclass(frozen=True, slots=True)
class Violation:
    step: int
    seq_id: int | None
    invariant: str
    message: str

    def to_dict(self) -> dict:
        return {"step": self.step, "seq_id": self.seq_id, "invariant": self.invariant, "message": self.message}

    @classmethod
    def from_dict(cls, d: dict) -> Violation:
        return cls(d["step"], d.get("seq_id"), d["invariant"], d["message"])


@dataclass(slots=True)
class Context:
    """One step, with its sequences indexed, handed to every check."""

    step: Mapping[str, Any]
    seqs: dict[int, dict]
    batch: list[int]  # seq_ids in batch order
    block_size: int
    config: dict
    prev: dict[int, dict] | None  # previous step's sequences by id
    tokens: dict[int, list[int]]  # each sequence's tokens before this step
    memo: dict  # results a check may reuse while its inputs are unchanged
    kv: KvShadow  # what each KV slot holds, across steps
    params: dict[int, dict]  # each request's sampling params, where known
    eos_token_ids: frozenset[int] | None  # None: unknown (a version-1 trace or a bare record)
    preempted_before: list[int] | None  # sequences the previous step preempted, in order; None: no previous

    def violation(self, invariant: str, seq_id: int | None, message: str) -> Violation:
        return Violation(self.step["step"], seq_id, invariant, message)


Check = Callable[[Context], Iterator[Violation]]
CHECKS: list[tuple[str, Check]] = []


def check(name: str) -> Callable[[Check], Check]:
    def register(fn: Check) -> Check:
        assert name in INVARIANTS, name
        CHECKS.append((name, fn))
        return fn

    return register


def starts(ctx: Context) -> dict[int, int]:
    """Each batched sequence's offset into the flat token arrays."""
    qsl = ctx.step["inputs"]["query_start_loc"]
    return {sid: qsl[i] for i, sid in enumerate(ctx.batch)}


def batch_tokens(ctx: Context) -> Iterator[tuple[int, int, int]]:
    """(seq_id, flat index, offset inside the chunk) for every batched token."""
    for sid, start in starts(ctx).items():
        for offset in range(ctx.seqs[sid]["num_scheduled_tokens"]):
            yield sid, start + offset, offset


# ---- per-sequence counters ----------------------------------------------------------------


@check("scheduled_zero_after")
def check_scheduled_zero_after(ctx: Context) -> Iterator[Violation]:
    for sid, s in ctx.seqs.items():
        after = s.get("num_scheduled_tokens_after", 0)
        if after != 0:
            yield ctx.violation(
                "scheduled_zero_after",
                sid,
                f"seq {sid} still has num_scheduled_tokens = "
                f"{after} after the step; it must be reset to 0 once the step is done",
            )


@check("batch_membership")
def check_batch_membership(ctx: Context) -> Iterator[Violation]:
    for sid, n in Counter(ctx.batch).items():
        if n > 1:
            yield ctx.violation("batch_membership", sid, f"seq {sid} appears {n} times in the batch")
        if sid not in ctx.seqs:
            yield ctx.violation("batch_membership", sid, f"seq {sid} is in the batch but not in the step's sequences")
    for sid, s in ctx.seqs.items():
        scheduled = s["num_scheduled_tokens"]
        if scheduled < 0 or (scheduled > 0) != (sid in ctx.batch):
            where = "is in" if sid in ctx.batch else "is not in"
            yield ctx.violation(
                "batch_membership", sid, f"seq {sid} has num_scheduled_tokens = {scheduled} but {where} the batch"
            )


@check("cached_le_tokens")
def check_cached_le_tokens(ctx: Context) -> Iterator[Violation]:
    for sid, s in ctx.seqs.items():
        for when, cached, total in (
            ("during", s["num_cached_tokens"], s["num_tokens"]),
            ("after", s["num_cached_tokens_after"], s["num_tokens_after"]),
        ):
            if not 0 <= cached <= total:
                yield ctx.violation(
                    "cached_le_tokens",
                    sid,
                    f"seq {sid} has num_cached_tokens = {cached} {when} the step but only {total} tokens",
                )


@check("scheduled_within_tokens")
def check_scheduled_within_tokens(ctx: Context) -> Iterator[Violation]:
    for sid, s in ctx.seqs.items():
        end = s["num_cached_tokens"] + s["num_scheduled_tokens"]
        if end > s["num_tokens"]:
            yield ctx.violation(
                "scheduled_within_tokens",
                sid,
                f"seq {sid} schedules tokens up to {end} but has only {s['num_tokens']} tokens",
            )


# ---- the flat batch ----------------------------------------------------------------------


@check("token_count")
def check_token_count(ctx: Context) -> Iterator[Violation]:
    inp = ctx.step["inputs"]
    total = sum(ctx.seqs[sid]["num_scheduled_tokens"] for sid in ctx.batch if sid in ctx.seqs)
    lengths = {name: len(inp[name]) for name in ("input_ids", "positions", "slot_mapping")}
    if any(n != total for n in lengths.values()):
        shown = ", ".join(f"len({k}) = {v}" for k, v in lengths.items())
        yield ctx.violation("token_count", None, f"the batch schedules {total} tokens but {shown}")


@check("batch_shapes")
def check_batch_shapes(ctx: Context) -> Iterator[Violation]:
    inp = ctx.step["inputs"]
    for name in ("seq_lens", "block_tables", "logits_indices", "discard"):
        if len(inp[name]) != len(ctx.batch):
            yield ctx.violation(
                "batch_shapes", None, f"{name} has {len(inp[name])} entries for {len(ctx.batch)} batched sequences"
            )


@check("query_start_loc")
def check_query_start_loc(ctx: Context) -> Iterator[Violation]:
    qsl = ctx.step["inputs"]["query_start_loc"]
    total = len(ctx.step["inputs"]["input_ids"])
    if len(qsl) != len(ctx.batch) + 1 or qsl[0] != 0 or qsl[-1] != total:
        yield ctx.violation(
            "query_start_loc",
            None,
            f"query_start_loc {short(qsl)} must have "
            f"{len(ctx.batch) + 1} entries, start at 0 and end at the token count {total}",
        )
        return
    for i, sid in enumerate(ctx.batch):
        length = qsl[i + 1] - qsl[i]
        if length < 0:
            yield ctx.violation("query_start_loc", sid, f"query_start_loc decreases from {qsl[i]} to {qsl[i + 1]}")
        elif sid in ctx.seqs and length != ctx.seqs[sid]["num_scheduled_tokens"]:
            yield ctx.violation(
                "query_start_loc",
                sid,
                f"query_start_loc gives seq {sid} {length} tokens but it "
                f"has num_scheduled_tokens = {ctx.seqs[sid]['num_scheduled_tokens']}",
            )


@check("positions")
def check_positions(ctx: Context) -> Iterator[Violation]:
    positions = ctx.step["inputs"]["positions"]
    for sid, i, offset in batch_tokens(ctx):
        want = ctx.seqs[sid]["num_cached_tokens"] + offset
        if positions[i] != want:
            yield ctx.violation(
                "positions",
                sid,
                f"token {i} of the batch (seq {sid}) has position "
                f"{positions[i]} but num_cached_tokens + offset = {want}",
            )
            return


@check("seq_lens")
def check_seq_lens(ctx: Context) -> Iterator[Violation]:
    for sid, got in zip(ctx.batch, ctx.step["inputs"]["seq_lens"]):
        s = ctx.seqs[sid]
        want = s["num_cached_tokens"] + s["num_scheduled_tokens"]
        if got != want:
            yield ctx.violation(
                "seq_lens", sid, f"seq {sid} has seq_len {got} but num_cached_tokens + num_scheduled_tokens = {want}"
            )


@check("logits_indices")
def check_logits_indices(ctx: Context) -> Iterator[Violation]:
    inp = ctx.step["inputs"]
    want = [q - 1 for q in inp["query_start_loc"][1:]]
    if list(inp["logits_indices"]) != want:
        yield ctx.violation(
            "logits_indices",
            None,
            f"logits_indices {short(inp['logits_indices'])} should be query_start_loc[1:] - 1 = {short(want)}",
        )


@check("input_ids")
def check_input_ids(ctx: Context) -> Iterator[Violation]:
    input_ids = ctx.step["inputs"]["input_ids"]
    for sid, start in starts(ctx).items():
        tokens = ctx.tokens.get(sid)
        if tokens is None:
            continue
        s = ctx.seqs[sid]
        want = tokens[s["num_cached_tokens"] : s["num_cached_tokens"] + s["num_scheduled_tokens"]]
        got = list(input_ids[start : start + s["num_scheduled_tokens"]])
        if got != want:
            yield ctx.violation(
                "input_ids",
                sid,
                f"seq {sid}'s input_ids {short(got)} are not its tokens "
                f"from position {s['num_cached_tokens']} on, {short(want)}",
            )


@check("block_tables_match")
def check_block_tables_match(ctx: Context) -> Iterator[Violation]:
    for sid, row in zip(ctx.batch, ctx.step["inputs"]["block_tables"]):
        if list(row) != list(ctx.seqs[sid]["block_table"]):
            yield ctx.violation(
                "block_tables_match",
                sid,
                f"the batch gives seq {sid} block table {short(row)} "
                f"but it holds {short(ctx.seqs[sid]['block_table'])}",
            )


# ---- KV slots ----------------------------------------------------------------------------


@check("slot_mapping")
def check_slot_mapping(ctx: Context) -> Iterator[Violation]:
    inp, bs = ctx.step["inputs"], ctx.block_size
    for sid, i, _ in batch_tokens(ctx):
        table, pos, slot = ctx.seqs[sid]["block_table"], inp["positions"][i], inp["slot_mapping"][i]
        want = table[pos // bs] * bs + pos % bs if 0 <= pos // bs < len(table) else None
        if slot != want:
            yield ctx.violation(
                "slot_mapping",
                sid,
                f"seq {sid}'s token at position {pos} goes to slot {slot} "
                f"but block_table[{pos} // {bs}] * {bs} + {pos} % {bs} = {want}",
            )
            return


@check("slot_in_own_block")
def check_slot_in_own_block(ctx: Context) -> Iterator[Violation]:
    slots = ctx.step["inputs"]["slot_mapping"]
    for sid, i, _ in batch_tokens(ctx):
        block = slots[i] // ctx.block_size
        if block not in ctx.seqs[sid]["block_table"]:
            yield ctx.violation(
                "slot_in_own_block",
                sid,
                f"seq {sid} writes slot {slots[i]} in block {block}, "
                f"which is not in its block table {short(ctx.seqs[sid]['block_table'])}",
            )
            return


@check("slot_unique")
def check_slot_unique(ctx: Context) -> Iterator[Violation]:
    for slot, n in Counter(ctx.step["inputs"]["slot_mapping"]).items():
        if n > 1:
            yield ctx.violation(
                "slot_unique", None, f"slot {slot} (block {slot // ctx.block_size}) is written {n} times in one step"
            )


# ---- KV content ---------------------------------------------------------------------------


@check("kv_content")
def check_kv_content(ctx: Context) -> Iterator[Violation]:
    inp, bs, kv = ctx.step["inputs"], ctx.block_size, ctx.kv
    if not kv.blocks:
        kv.start(len(ctx.step["pool"]["ref_counts"]), bs, fresh_engine=ctx.step["step"] == 0)
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
            yield ctx.violation(
                "kv_content",
                sid,
                f"seq {sid} reads position {bad.position} from slot {bad.slot} (block {bad.slot // bs}), "
                f"which holds {bad.holds}, not its own prefix",
            )


@check("shared_block_write")
def check_shared_block_write(ctx: Context) -> Iterator[Violation]:
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
    for sid, s in ctx.seqs.items():
        for block in s["block_table"]:
            if block in writers:
                holders.setdefault(block, []).append(sid)
    # A request admitted after the writer in this step may hit the block it computes now (vLLM v1's rule).
    hit_now: dict[int, set[int]] = {}
    for e in ctx.step["events"]:
        if e["kind"] == EventKind.PREFIX_HIT:
            for block in e["detail"]["blocks"]:
                hit_now.setdefault(block, set()).add(e["seq_id"])
    for block, sids in holders.items():
        readers = set(sids) - {writers[block]}
        if len(sids) > 1 and (block in misplaced or not readers <= hit_now.get(block, set())):
            yield ctx.violation(
                "shared_block_write",
                writers[block],
                f"seq {writers[block]} writes KV into block {block}, which seqs {sids} all hold: "
                f"a shared block is read-only",
            )


# ---- blocks ------------------------------------------------------------------------------


@check("block_table_coverage")
def check_block_table_coverage(ctx: Context) -> Iterator[Violation]:
    bs = ctx.block_size
    for sid, s in ctx.seqs.items():
        # A finished sequence has released its KV: its num_cached_tokens no longer needs blocks.
        live = s["status_after"] != "FINISHED"
        rows = [("after", s["block_table_after"], s["num_cached_tokens_after"])] if live else []
        if live or s["num_scheduled_tokens"]:
            rows.insert(0, ("during", s["block_table"], s["num_cached_tokens"] + s["num_scheduled_tokens"]))
        for when, table, need in rows:
            if len(table) * bs < need:
                yield ctx.violation(
                    "block_table_coverage",
                    sid,
                    f"seq {sid}'s block table {when} the step has "
                    f"{len(table)} blocks ({len(table) * bs} slots) for {need} tokens",
                )
            if len(set(table)) != len(table):
                yield ctx.violation(
                    "block_table_coverage",
                    sid,
                    f"seq {sid}'s block table {when} the step {short(table)} holds a block twice",
                )


@check("ref_counts")
def check_ref_counts(ctx: Context) -> Iterator[Violation]:
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
            yield ctx.violation(
                "ref_counts", None, f"block {block} has ref count {ref} but {expected[block]} sequences hold it"
            )


@check("free_blocks")
def check_free_blocks(ctx: Context) -> Iterator[Violation]:
    pool = ctx.step["pool"]
    free, refs = pool["free_block_ids"], pool["ref_counts"]
    if ctx.memo.get("free_blocks") == (free, refs):  # unchanged since the last step found it exact
        return
    if free_list_is_exact(free, refs):
        ctx.memo["free_blocks"] = (free, refs)
        return
    for block, n in Counter(free).items():
        if n > 1:
            yield ctx.violation("free_blocks", None, f"block {block} is on the free list {n} times")
        if 0 <= block < len(refs) and refs[block] != 0:
            yield ctx.violation(
                "free_blocks", None, f"block {block} is on the free list but has ref count {refs[block]}"
            )
    free_set = set(free)
    for block, ref in enumerate(refs):
        if ref == 0 and block not in free_set:
            yield ctx.violation("free_blocks", None, f"block {block} has ref count 0 but is not on the free list")


def free_list_is_exact(free, refs) -> bool:
    """Fast path: distinct free blocks, all with ref count 0, as many as there are ref-0 blocks."""
    if not free:
        return 0 not in refs
    if min(free) < 0 or max(free) >= len(refs) or len(set(free)) != len(free):
        return False
    on_free = itemgetter(*free)(refs)
    return not any(on_free if len(free) > 1 else (on_free,)) and list(refs).count(0) == len(free)


@check("pool_shape")
def check_pool_shape(ctx: Context) -> Iterator[Violation]:
    pool = ctx.step["pool"]
    num_blocks = ctx.config.get("num_kv_blocks", len(pool["ref_counts"]))
    if len(pool["ref_counts"]) != num_blocks or len(pool["hashes"]) != num_blocks:
        yield ctx.violation(
            "pool_shape",
            None,
            f"the pool lists {len(pool['ref_counts'])} ref counts and "
            f"{len(pool['hashes'])} hashes for num_kv_blocks = {num_blocks}",
        )
    if pool["block_size"] != ctx.block_size:
        yield ctx.violation(
            "pool_shape", None, f"the pool's block_size {pool['block_size']} is not the config's {ctx.block_size}"
        )
    for sid, s in ctx.seqs.items():
        tables = (*s["block_table"], *s["block_table_after"])
        if not tables or 0 <= min(tables) and max(tables) < num_blocks:  # the common case, in C
            continue
        bad = [b for b in tables if not 0 <= b < num_blocks]
        if bad:
            yield ctx.violation(
                "pool_shape", sid, f"seq {sid} holds block {bad[0]}, outside the pool of {num_blocks} blocks"
            )
    free = pool["free_block_ids"]
    bad = [b for b in free if not 0 <= b < num_blocks] if free and (min(free) < 0 or max(free) >= num_blocks) else []
    if bad:
        yield ctx.violation("pool_shape", None, f"the free list holds block {bad[0]}, outside the pool")


@check("unique_prefix_hash")
def check_unique_prefix_hash(ctx: Context) -> Iterator[Violation]:
    hashes = ctx.step["pool"]["hashes"]
    if len(set(hashes)) + max(hashes.count(None) - 1, 0) == len(hashes):  # the common case, in C: no repeats
        return
    for h, n in Counter(h for h in hashes if h is not None).items():
        if n > 1:
            blocks = [b for b, x in enumerate(ctx.step["pool"]["hashes"]) if x == h]
            yield ctx.violation("unique_prefix_hash", None, f"blocks {blocks} share the prefix hash {h}")


@check("prefix_caching_off")
def check_prefix_caching_off(ctx: Context) -> Iterator[Violation]:
    if ctx.config.get("enable_prefix_caching", True):
        return
    if any(h is not None for h in ctx.step["pool"]["hashes"]):
        yield ctx.violation("prefix_caching_off", None, "prefix caching is off but a block has a hash")
    for e in ctx.step["events"]:
        if e["kind"] == EventKind.PREFIX_HIT:
            yield ctx.violation(
                "prefix_caching_off", e["seq_id"], f"prefix caching is off but seq {e['seq_id']} got a prefix hit"
            )


@check("prefix_hit")
def check_prefix_hit(ctx: Context) -> Iterator[Violation]:
    for e in ctx.step["events"]:
        if e["kind"] != EventKind.PREFIX_HIT or e["seq_id"] not in ctx.seqs:
            continue
        sid, s, blocks = e["seq_id"], ctx.seqs[e["seq_id"]], list(e["detail"]["blocks"])
        saved = e["detail"]["tokens_saved"]
        if list(s["block_table"][: len(blocks)]) != blocks:
            yield ctx.violation(
                "prefix_hit",
                sid,
                f"seq {sid} hit cached blocks {short(blocks)} but its block "
                f"table starts {short(s['block_table'][: len(blocks)])}",
            )
        if saved != len(blocks) * ctx.block_size or s["num_cached_tokens"] != saved:
            yield ctx.violation(
                "prefix_hit",
                sid,
                f"seq {sid} hit {len(blocks)} blocks, claims {saved} tokens "
                f"saved and starts with num_cached_tokens = {s['num_cached_tokens']}; all three "
                f"must agree ({len(blocks) * ctx.block_size})",
            )


# ---- sampling and tokens ----------------------------------------------------------------


@check("mid_prefill_discard")
def check_mid_prefill_discard(ctx: Context) -> Iterator[Violation]:
    inp = ctx.step["inputs"]
    for sid, seq_len, discard in zip(ctx.batch, inp["seq_lens"], inp["discard"]):
        mid = seq_len < ctx.seqs[sid]["num_tokens"]
        if bool(discard) != mid:
            state = "mid-prefill" if mid else "complete"
            yield ctx.violation(
                "mid_prefill_discard",
                sid,
                f"seq {sid} is {state} ({seq_len} of {ctx.seqs[sid]['num_tokens']} tokens) but discard = {discard}",
            )


@check("token_gain")
def check_token_gain(ctx: Context) -> Iterator[Violation]:
    for sid, s in ctx.seqs.items():
        gained = len(s["new_token_ids"])
        scheduled = s["num_scheduled_tokens"]
        failed = s["finish_reason"] == FinishReason.ERROR  # its step failed: nothing was sampled
        complete = scheduled > 0 and s["num_cached_tokens"] + scheduled >= s["num_tokens"] and not failed
        if gained != (1 if complete else 0):
            why = (
                "finished its prefill or decoded"
                if complete
                else "its step failed"
                if failed
                else "is mid-prefill: its logits must be discarded"
                if scheduled
                else "was not scheduled"
            )
            yield ctx.violation("token_gain", sid, f"seq {sid} gained {gained} tokens but {why}")


@check("token_growth")
def check_token_growth(ctx: Context) -> Iterator[Violation]:
    for sid, s in ctx.seqs.items():
        gained = len(s["new_token_ids"])
        if s["num_tokens_after"] != s["num_tokens"] + gained:
            yield ctx.violation(
                "token_growth",
                sid,
                f"seq {sid} went from {s['num_tokens']} to {s['num_tokens_after']} tokens but gained {gained}",
            )
        if "new_token_texts" in s and len(s["new_token_texts"]) != gained:
            yield ctx.violation(
                "token_growth",
                sid,
                f"seq {sid} has {gained} new tokens but {len(s['new_token_texts'])} new token texts",
            )


@check("cached_advance")
def check_cached_advance(ctx: Context) -> Iterator[Violation]:
    for sid, s in ctx.seqs.items():
        if s["num_scheduled_tokens"] == 0 or s["finish_reason"] == FinishReason.ERROR:  # a failed step computed nothing
            continue
        want = s["num_cached_tokens"] + s["num_scheduled_tokens"]
        if s["num_cached_tokens_after"] != want:
            yield ctx.violation(
                "cached_advance",
                sid,
                f"seq {sid} computed tokens up to {want} but ends the "
                f"step with num_cached_tokens = {s['num_cached_tokens_after']}",
            )


# ---- lifecycle ---------------------------------------------------------------------------


@check("status_edges")
def check_status_edges(ctx: Context) -> Iterator[Violation]:
    events: dict[int, list[dict]] = {}
    for e in ctx.step["events"]:
        events.setdefault(e["seq_id"], []).append(e)
    for sid in events.keys() - ctx.seqs.keys():
        yield ctx.violation("status_edges", sid, f"an event names seq {sid}, which is not in the step")
    for sid, s in ctx.seqs.items():
        status = s["status_before"]
        for e in events.get(sid, []):
            new = next_status(status, e)
            if new is None:
                reason = f" ({e['detail']['reason']})" if e["kind"] == EventKind.FINISHED else ""
                yield ctx.violation("status_edges", sid, f"seq {sid} cannot be {e['kind']}{reason} while {status}")
                break
            status = new
        else:
            if status != s["status_after"]:
                yield ctx.violation(
                    "status_edges",
                    sid,
                    f"seq {sid} went {s['status_before']} -> {s['status_after']}, but its events lead to {status}",
                )


def next_status(status: str, event: dict) -> str | None:
    """The status after an event, or None if the event is illegal in this status."""
    kind = event["kind"]
    if kind == EventKind.ADMITTED:
        return "RUNNING" if status == "WAITING" else None
    if kind == EventKind.PREEMPTED:
        return "WAITING" if status == "RUNNING" else None
    if kind == EventKind.FINISHED:
        reason = event["detail"].get("reason")
        if status == "RUNNING" or (status == "WAITING" and reason in FINISH_FROM_WAITING):
            return "FINISHED"
        return None
    return status if status != "FINISHED" else None  # prefill_chunk / prefill_done / prefix_hit


@check("finish_reason")
def check_finish_reason(ctx: Context) -> Iterator[Violation]:
    for sid, s in ctx.seqs.items():
        if (s["status_after"] == "FINISHED") != (s["finish_reason"] is not None):
            yield ctx.violation(
                "finish_reason", sid, f"seq {sid} is {s['status_after']} with finish_reason {s['finish_reason']!r}"
            )


@check("continuity")
def check_continuity(ctx: Context) -> Iterator[Violation]:
    if ctx.prev is None:
        return
    for sid, s in ctx.seqs.items():
        p = ctx.prev.get(sid)
        if p is None:
            if s["status_before"] != "WAITING":
                yield ctx.violation("continuity", sid, f"seq {sid} first appears {s['status_before']}, not WAITING")
            continue
        for now, before in (
            ("status_before", "status_after"),
            ("num_tokens", "num_tokens_after"),
            ("num_prompt_tokens", "num_prompt_tokens"),
        ):
            if s[now] != p[before]:
                yield ctx.violation(
                    "continuity",
                    sid,
                    f"seq {sid} starts the step with {now} = {s[now]!r} but ended the previous step with {p[before]!r}",
                )
    for sid in ctx.prev.keys() - ctx.seqs.keys():
        yield ctx.violation("continuity", sid, f"seq {sid} was listed in the previous step but is missing now")


@check("finished_holds_no_blocks")
def check_finished_holds_no_blocks(ctx: Context) -> Iterator[Violation]:
    for sid, s in ctx.seqs.items():
        if s["status_after"] == "FINISHED" and s["block_table_after"]:
            yield ctx.violation(
                "finished_holds_no_blocks",
                sid,
                f"seq {sid} is FINISHED but still holds blocks {short(s['block_table_after'])}",
            )


@check("no_leak")
def check_no_leak(ctx: Context) -> Iterator[Violation]:
    if any(s["status_after"] in LIVE for s in ctx.seqs.values()):
        return
    held = [b for b, ref in enumerate(ctx.step["pool"]["ref_counts"]) if ref != 0]
    if held:
        yield ctx.violation(
            "no_leak", None, f"no sequence is live but blocks {short(held)} still have non-zero ref counts (leaked)"
        )


@check("token_budget")
def check_token_budget(ctx: Context) -> Iterator[Violation]:
    total = len(ctx.step["inputs"]["input_ids"])
    budget = ctx.config.get("max_num_batched_tokens")
    if budget is not None and total > budget:
        yield ctx.violation(
            "token_budget", None, f"the step computes {total} tokens, over max_num_batched_tokens = {budget}"
        )
    max_seqs = ctx.config.get("max_num_seqs")
    running = sum(1 for s in ctx.seqs.values() if s["status_after"] == "RUNNING")
    if max_seqs is not None and max(len(ctx.batch), running) > max_seqs:
        yield ctx.violation(
            "token_budget",
            None,
            f"{len(ctx.batch)} sequences run and {running} are RUNNING, over max_num_seqs = {max_seqs}",
        )


# ---- queues, preemption, EOS and aborts (schema version 2) -----------------------------------


def preempted(step: Mapping[str, Any]) -> list[int]:
    return [e["seq_id"] for e in step["events"] if e["kind"] == EventKind.PREEMPTED]


@check("preempt_resets")
def check_preempt_resets(ctx: Context) -> Iterator[Violation]:
    for sid in preempted(ctx.step):
        s = ctx.seqs.get(sid)
        if s is None or s["status_after"] == "FINISHED" or sid in ctx.batch:
            continue  # re-admitted in the same step, or finished: other checks cover it
        if s["block_table_after"] or s["num_cached_tokens_after"] != 0:
            yield ctx.violation(
                "preempt_resets",
                sid,
                f"seq {sid} was preempted but ends the step with num_cached_tokens = "
                f"{s['num_cached_tokens_after']} and blocks {short(s['block_table_after'])}; recompute "
                f"starts from nothing",
            )


@check("victim_policy")
def check_victim_policy(ctx: Context) -> Iterator[Violation]:
    victims = preempted(ctx.step)
    queues = ctx.step.get("queues")
    if not victims or queues is None:
        return
    aborted = {
        e["seq_id"]
        for e in ctx.step["events"]
        if e["kind"] == EventKind.FINISHED and e["detail"]["reason"] == FinishReason.ABORT
    }
    running = [sid for sid in queues["running"] if sid not in aborted]  # aborts take effect before scheduling
    want = running[::-1][: len(victims)]
    if victims != want:
        yield ctx.violation(
            "victim_policy",
            victims[0],
            f"the step preempted seqs {victims} from running list {list(queues['running'])}; the newest "
            f"first would be {want}",
        )


@check("preempted_to_head")
def check_preempted_to_head(ctx: Context) -> Iterator[Violation]:
    queues = ctx.step.get("queues")
    if not ctx.preempted_before or queues is None:
        return
    want = ctx.preempted_before[::-1]
    head = list(queues["waiting"][: len(want)])
    if head != want:
        yield ctx.violation(
            "preempted_to_head",
            want[0],
            f"the previous step preempted seqs {ctx.preempted_before}, so the waiting queue must start "
            f"with {want}; it is {short(queues['waiting'])}",
        )


@check("admission_order")
def check_admission_order(ctx: Context) -> Iterator[Violation]:
    queues = ctx.step.get("queues")
    admitted = [e["seq_id"] for e in ctx.step["events"] if e["kind"] == EventKind.ADMITTED]
    if not admitted or queues is None:
        return
    # The queue as the admission loop found it: this step's preempted sequences went to the head.
    finished = {e["seq_id"] for e in ctx.step["events"] if e["kind"] == EventKind.FINISHED}
    queue = [
        sid for sid in preempted(ctx.step)[::-1] + list(queues["waiting"]) if sid in admitted or sid not in finished
    ]
    if admitted != queue[: len(admitted)]:
        yield ctx.violation(
            "admission_order",
            admitted[0],
            f"the step admitted seqs {admitted}, but the waiting queue it admitted from was {short(queue)}: "
            f"admission takes the head first",
        )


@check("eos_finish")
def check_eos_finish(ctx: Context) -> Iterator[Violation]:
    eos = ctx.eos_token_ids
    if eos is None:
        return
    stopped = {
        e["seq_id"]
        for e in ctx.step["events"]
        if e["kind"] == EventKind.FINISHED and e["detail"].get("reason") == FinishReason.STOP
    }
    for sid, s in ctx.seqs.items():
        if not s["new_token_ids"] and sid not in stopped:
            continue
        params = ctx.params.get(sid)
        if params is None or "ignore_eos" not in params:
            continue
        sampled_eos = bool(s["new_token_ids"]) and s["new_token_ids"][-1] in eos and not params["ignore_eos"]
        if sampled_eos and sid not in stopped:
            yield ctx.violation(
                "eos_finish",
                sid,
                f"seq {sid} sampled EOS id {s['new_token_ids'][-1]} without ignore_eos but did not finish "
                f"with 'stop' (it is {s['status_after']}, reason {s['finish_reason']!r})",
            )
        elif sid in stopped and not sampled_eos and not params.get("stop"):
            what = "ignores EOS" if params["ignore_eos"] and s["new_token_ids"] else "sampled no EOS id"
            yield ctx.violation(
                "eos_finish",
                sid,
                f"seq {sid} finished with 'stop' but {what} and has no stop strings",
            )


@check("abort_step")
def check_abort_step(ctx: Context) -> Iterator[Violation]:
    for e in ctx.step["events"]:
        detail = e["detail"]
        if (
            e["kind"] == EventKind.FINISHED
            and detail.get("reason") == FinishReason.ABORT
            and "requested_step" in detail
        ):
            if detail["requested_step"] != ctx.step["step"]:
                yield ctx.violation(
                    "abort_step",
                    e["seq_id"],
                    f"seq {e['seq_id']}'s abort was requested for step {detail['requested_step']} but took "
                    f"effect in step {ctx.step['step']}",
                )


# ---- driving ------------------------------------------------------------------------------


def short(values, limit: int = 8) -> str:
    """A list, cut after `limit` items (with the full length) so a message stays one line."""
    values = list(values)
    return str(values) if len(values) <= limit else f"[{', '.join(map(str, values[:limit]))}, ... ({len(values)})]"


class InvariantChecker:
    """Checks steps in order; keeps what carries over between steps."""

    def __init__(
        self,
        config: dict | None = None,
        requests: Iterable[dict] = (),
        eos_token_ids: Iterable[int] | None = None,
        checks: list[tuple[str, Check]] | None = None,  # an engine profile's (tracer.trace.profiles)
    ):
        self.config = dict(config or {})
        self.checks = CHECKS if checks is None else checks
        self.prev: dict[int, dict] | None = None
        self.tokens: dict[int, list[int]] = {}
        self.params: dict[int, dict] = {}
        self.memo: dict = {}
        self.kv = KvShadow()
        self.eos_token_ids = frozenset(eos_token_ids) if eos_token_ids is not None else None
        self.preempted: list[int] | None = None
        self.add_requests(requests)

    def add_requests(self, requests: Iterable[dict]) -> None:
        for r in requests:
            ids = r.get("prompt_token_ids")
            if ids is not None and len(ids) == r.get("num_prompt_tokens", len(ids)):  # else: prompt unknown
                self.tokens.setdefault(r["seq_id"], list(r["prompt_token_ids"]))
            if r.get("params"):
                self.params.setdefault(r["seq_id"], r["params"])

    def check(self, step: Mapping[str, Any]) -> list[Violation]:
        self.add_requests(step.get("new_requests", ()))
        ctx = Context(
            step,
            {s["seq_id"]: s for s in step["seqs"]},
            list(step["inputs"]["seq_ids"]),
            self.config.get("block_size") or step["pool"]["block_size"],
            self.config,
            self.prev,
            self.tokens,
            self.memo,
            self.kv,
            self.params,
            self.eos_token_ids,
            self.preempted,
        )
        found: list[Violation] = []
        for name, fn in self.checks:
            try:
                found.extend(fn(ctx))
            except (KeyError, IndexError, TypeError, ValueError) as e:
                found.append(
                    ctx.violation(name, None, f"the step is malformed for this check ({type(e).__name__}: {e})")
                )
        self.remember(ctx)
        return found

    def remember(self, ctx: Context) -> None:
        self.prev = ctx.seqs
        self.preempted = [sid for sid in preempted(ctx.step) if ctx.seqs.get(sid, {}).get("status_after") == "WAITING"]
        for sid, s in ctx.seqs.items():
            if sid in self.tokens and s.get("new_token_ids"):
                self.tokens[sid].extend(s["new_token_ids"])


def check_steps(
    steps: Iterable[dict],
    config: dict | None = None,
    requests: Iterable[dict] = (),
    eos_token_ids: Iterable[int] | None = None,
    checks: list[tuple[str, Check]] | None = None,
) -> list[Violation]:
    checker = InvariantChecker(config, requests, eos_token_ids, checks)
    return [v for step in steps for v in checker.check(step)]


def check_trace(trace) -> list[Violation]:
    """Every violation in a loaded trace (tracer.trace_file.Trace), by the invariants of the engine
    that wrote it (its header's `engine`: tracer.trace.profiles)."""
    from tracer.trace.profiles import profile_for  # profiles builds on this module's checks

    header = trace.header
    checks = profile_for(header).checks()
    return check_steps(
        trace.steps, header.get("config"), header.get("requests", ()), header.get("eos_token_ids"), checks
    )


def check_record(record, block_size: int | None = None) -> list[Violation]:
    """Check one bare nanoengine StepRecord (no history: cross-step checks are skipped)."""
    config = {"block_size": block_size} if block_size else None
    return InvariantChecker(config).check(line_from_record(record))
