"""Engine profiles for the checker: which invariants hold for the engine that wrote a trace.

nanoengine's own traces get every invariant. A trace of vLLM v1's scheduler (header `engine:
vllm ...`, written by tracer/vllm/record.py) keeps every correctness invariant whose rule vLLM
shares, and gets vLLM's rule where the two engines differ on purpose:

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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from nanoengine.sequence import EventKind
from tracer.trace.invariants import CHECKS, Check, Context, Violation, batch_tokens, preempted

NULL_BLOCK = 0  # vLLM's BlockPool takes the first block off its free queue as the null block


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    replaced: dict[str, tuple[str, Check]] = field(default_factory=dict)  # name -> (this engine's rule, check)
    added: dict[str, tuple[str, Check]] = field(default_factory=dict)  # this engine's own invariants

    def checks(self) -> list[tuple[str, Check]]:
        """Every check in the checker's order, replaced ones in place, this engine's own last."""
        own = [(name, self.replaced[name][1] if name in self.replaced else fn) for name, fn in CHECKS]
        return own + [(name, fn) for name, (_, fn) in self.added.items()]

    def rules(self) -> dict[str, str]:
        from tracer.trace.invariants import INVARIANTS

        rules = {name: self.replaced[name][0] if name in self.replaced else INVARIANTS[name] for name, _ in CHECKS}
        return rules | {name: rule for name, (rule, _) in self.added.items()}


# ---- vLLM's rules -----------------------------------------------------------------------------
def check_free_blocks_vllm(ctx: Context) -> Iterator[Violation]:
    pool = ctx.step["pool"]
    free, refs = pool["free_block_ids"], pool["ref_counts"]
    for block, n in Counter(free).items():
        if n > 1:
            yield ctx.violation("free_blocks", None, f"block {block} is on the free list {n} times")
        if block == NULL_BLOCK:
            yield ctx.violation("free_blocks", None, f"the null block {NULL_BLOCK} is on the free list")
        elif 0 <= block < len(refs) and refs[block] != 0:
            yield ctx.violation(
                "free_blocks", None, f"block {block} is on the free list but has ref count {refs[block]}"
            )
    free_set = set(free)
    for block, ref in enumerate(refs):
        if ref == 0 and block not in free_set and block != NULL_BLOCK:
            yield ctx.violation("free_blocks", None, f"block {block} has ref count 0 but is not on the free list")
    for sid, s in ctx.seqs.items():
        if NULL_BLOCK in s["block_table_after"]:
            yield ctx.violation("free_blocks", sid, f"seq {sid} holds the null block {NULL_BLOCK}")


def check_shared_block_write_vllm(ctx: Context) -> Iterator[Violation]:
    bs = ctx.block_size
    writers: dict[int, int] = {}
    for sid, i, _ in batch_tokens(ctx):
        writers.setdefault(ctx.step["inputs"]["slot_mapping"][i] // bs, sid)
    hit_now = {e["seq_id"]: set(e["detail"]["blocks"]) for e in ctx.step["events"] if e["kind"] == EventKind.PREFIX_HIT}
    for block, writer in writers.items():
        others = [sid for sid, s in ctx.seqs.items() if sid != writer and block in s["block_table"]]
        strangers = [sid for sid in others if block not in hit_now.get(sid, ())]
        if strangers:
            yield ctx.violation(
                "shared_block_write",
                writer,
                f"seq {writer} writes KV into block {block}, which seqs {sorted([writer, *others])} hold, "
                f"and seqs {strangers} did not hit it in this step: a shared block is read-only",
            )


def check_equal_hash_equal_kv(ctx: Context) -> Iterator[Violation]:
    hashes = ctx.step["pool"]["hashes"]
    if not ctx.kv.blocks or len(set(hashes)) + max(hashes.count(None) - 1, 0) == len(hashes):
        return
    for h, n in Counter(h for h in hashes if h is not None).items():
        if n < 2:
            continue
        blocks = [b for b, x in enumerate(hashes) if x == h]
        contents = {tuple(map(repr, ctx.kv.blocks[b])) for b in blocks if b < len(ctx.kv.blocks)}
        if len(contents) > 1:
            yield ctx.violation(
                "unique_prefix_hash", None, f"blocks {blocks} share the prefix hash {h} but hold different KV"
            )


def check_no_admission_after_preemption(ctx: Context) -> Iterator[Violation]:
    if not preempted(ctx.step):
        return
    for e in ctx.step["events"]:
        if e["kind"] == EventKind.ADMITTED:
            yield ctx.violation(
                "no_admission_after_preemption",
                e["seq_id"],
                f"seq {e['seq_id']} is admitted in a step that preempted (vLLM skips the waiting queue then)",
            )


def check_finished_ids_next_step(ctx: Context) -> Iterator[Violation]:
    reported = (ctx.step.get("vllm") or {}).get("finished_req_ids")
    if reported is None or ctx.prev is None:
        return
    want = sorted(sid for sid, s in ctx.prev.items() if s["status_after"] == "FINISHED" != s["status_before"])
    if sorted(reported) != want:
        yield ctx.violation(
            "finished_ids_next_step",
            None,
            f"finished_req_ids is {sorted(reported)} but the previous step finished {want}",
        )


NANOENGINE = Profile("nanoengine")
VLLM = Profile(
    "vllm",
    replaced={
        "free_blocks": (
            "the free list holds exactly the ref-0 blocks but the null block (block 0), which no table holds",
            check_free_blocks_vllm,
        ),
        "shared_block_write": (
            "KV is written only into blocks no other sequence holds, or that a sequence admitted in this "
            "step hit (a same-step prefix hit: vLLM caches a block's hash when it is scheduled)",
            check_shared_block_write_vllm,
        ),
        "unique_prefix_hash": (
            "blocks sharing a prefix hash hold the same KV (vLLM keeps duplicates: a full prefix hit "
            "recomputes its last block into a new one)",
            check_equal_hash_equal_kv,
        ),
    },
    added={
        "no_admission_after_preemption": (
            "a step that preempts admits no waiting request",
            check_no_admission_after_preemption,
        ),
        "finished_ids_next_step": (
            "the scheduler output's finished_req_ids are the requests that finished in the previous step",
            check_finished_ids_next_step,
        ),
    },
)
PROFILES = {p.name: p for p in (NANOENGINE, VLLM)}


def engine_name(header: Mapping[str, Any]) -> str:
    """The engine that wrote a trace: its header's `engine` ("vllm 0.33.0"), nanoengine when absent."""
    return str(header.get("engine") or "nanoengine").split()[0]


def profile_for(header: Mapping[str, Any]) -> Profile:
    return PROFILES.get(engine_name(header), NANOENGINE)
