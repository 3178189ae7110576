"""Real engine bugs, each a small patch to one engine function, for the mutation tests.

Each bug is a tracer.teach.plant Patch: the engine function's name and a few edits of its lines,
applied to the engine's *current* source (tracer.teach.plant.planted), never a copy of it. The
changed line carries a `# BUG:` comment saying what is missing. A patch whose lines have left the
engine fails tests/trace/test_planted_bugs.py. The bugs that a bug-hunt lesson plants are that
lesson's own patch (lessons/NN_bughunt_*/planted.py): one bug, one place.

BUGS: each with the invariants the checker must name when it bites (test_engine_mutations.py).
DECISION_BUGS: bugs in the numbers a decision records (test_decision_invariants.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from tracer.teach.lessons import find_lesson
from tracer.teach.plant import Edit, Patch


def lesson_bug(lesson_key: str) -> Patch:
    """The patch a bug-hunt lesson plants in its exercise.py."""
    patch = find_lesson(lesson_key).planted_bug
    assert patch is not None, f"lesson {lesson_key} plants no bug"
    return patch


SLOT_OFF_BY_ONE_BLOCK = Patch(
    "compute_slot_mapping",
    (
        Edit(
            "return block_tables[seq_index, positions // block_size] * block_size + positions % block_size",
            "return block_tables[seq_index, positions // block_size - 1] * block_size + positions % block_size"
            "  # BUG: the block index is one too small (the first block wraps to the table's last column)",
        ),
    ),
)

PREEMPT_TO_THE_TAIL = Patch(  # preempt puts each sequence back in the queue through recompute_later
    "Scheduler.recompute_later",
    (
        Edit(
            "self.waiting.appendleft(seq)",
            "self.waiting.append(seq)  # BUG: behind every request that arrived after it",
        ),
    ),
)

DECODE_INTO_THE_SHARED_PREFIX = Patch(  # copy-on-write missing: the step writes into a block others read
    "nanoengine.engine:LLMEngine.run",
    (
        Edit(
            "    inputs = prepare_inputs(out.seqs, self.config.block_size)\n",
            "    inputs = prepare_inputs(out.seqs, self.config.block_size)\n"
            "    bs, start = self.config.block_size, 0\n"
            "    for seq in out.seqs:  # BUG: a decode of a sequence whose first block is shared lands in it\n"
            "        if seq.num_scheduled_tokens == 1 and self.block_manager.ref_counts[seq.block_table[0]] > 1:\n"
            "            inputs.slot_mapping[start] = seq.block_table[0] * bs + seq.num_cached_tokens % bs\n"
            "        start += seq.num_scheduled_tokens\n",
        ),
    ),
)


@dataclass(frozen=True, slots=True)
class Bug:
    name: str
    patch: Patch  # planted into the engine's current function
    invariants: tuple[str, ...]  # the checker must name one of these
    upstream: str  # where this kind of bug was seen

    @property
    def target(self) -> str:
        return self.patch.target


BUGS = {
    "stale_hash_entry": Bug(
        "reused free block not evicted from the hash lookup",
        lesson_bug("14"),
        ("kv_content",),
        "the checker's own blind spot (issue 11)",
    ),
    "stale_cached_count": Bug(
        "stale num_cached_tokens after preemption",
        lesson_bug("12"),
        ("preempt_resets",),
        "nano-vllm PR #211",
    ),
    "zero_length_query": Bug(
        "a full prefix hit leaves zero tokens to compute",
        lesson_bug("11"),
        ("batch_membership",),
        "nano-vllm #114 / #144",
    ),
    "slot_off_by_one_block": Bug(
        "slot formula off by one block",
        SLOT_OFF_BY_ONE_BLOCK,
        ("slot_mapping",),
        "a classic paged-attention indexing slip",
    ),
    "preempt_to_tail": Bug(
        "preempted sequence appended to the tail of the waiting queue",
        PREEMPT_TO_THE_TAIL,
        ("admission_order", "preempted_to_head"),
        "vLLM's scheduler keeps preempted requests at the front",
    ),
    "decode_into_shared_block": Bug(
        "a decode writes into a shared prefix block",
        DECODE_INTO_THE_SHARED_PREFIX,
        ("shared_block_write",),
        "copy-on-write missing for a shared block",
    ),
}


# ---- bugs in the numbers a decision records (tracer/trace/invariants/decisions.py) -----------------
# Planted with monkeypatch.setattr(Scheduler, name, planted(patch)) by tests/trace/test_decision_invariants.py.
budget_read_after_batching = Patch(
    "Scheduler.schedule_tokens",
    (
        Edit(
            "out.add_event(EventKind.PREFILL_CHUNK, seq, budget=budget, **chunk_span(seq))",
            "out.add_event(EventKind.PREFILL_CHUNK, seq, budget=budget - num_new, **chunk_span(seq))"
            "  # BUG: the budget left after this chunk, as if it were charged to itself",
        ),
    ),
)

admit_keeping_a_token_back = Patch(
    "Scheduler.try_admit",
    (
        Edit(
            "num_new = min(seq.num_tokens - num_cached, budget)",
            "num_new = min(seq.num_tokens - num_cached, max(budget - 1, 1))  # BUG: one budget token kept back",
        ),
    ),
)

admit_forgetting_free_hit_blocks = Patch(
    "Scheduler.try_admit",
    (
        Edit(
            "need = num_new_blocks + bm.num_free_in(hit_blocks)  # blocks it takes from the free list",
            "need = num_new_blocks  # BUG: the hit's blocks that sit free leave the free list too (lesson 7)",
        ),
    ),
)

make_room_for_a_spare_block = Patch(
    "Scheduler.make_room",
    (
        Edit(
            "while not bm.can_allocate(sum(map(bm.blocks_to_schedule, unit, num_new))):",
            "while not bm.can_allocate(sum(map(bm.blocks_to_schedule, unit, num_new)) + 1):  # BUG: keeps a block spare",
        ),
    ),
)

DECISION_BUGS = {
    "chunk_budget": budget_read_after_batching,
    "chunk_size": admit_keeping_a_token_back,
    "admission_blocks": admit_forgetting_free_hit_blocks,
    "preemption_need": make_room_for_a_spare_block,
}


# ---- bugs in the n samples of one request (tracer/trace/invariants/samples.py) ---------------------
# Planted with monkeypatch.setattr by tests/trace/test_sample_invariants.py.
samples_share_one_seed = Patch(
    "nanoengine.engine:child_params",
    (
        Edit(
            "seed = None if params.seed is None else params.seed + i",
            "seed = params.seed  # BUG: every sample draws the same numbers, so n samples are one sample n times",
        ),
    ),
)

blocks_findable_only_once_computed = Patch(
    "BlockManager.register_full_blocks",
    (
        Edit(
            "num_known = seq.num_cached_tokens + seq.num_scheduled_tokens",
            "num_known = seq.num_cached_tokens"
            "  # BUG: blocks scheduled in this step are not findable in it: each sample prefills the prompt again",
        ),
    ),
)

SAMPLE_BUGS = {
    "sample_params": samples_share_one_seed,
    "sample_prefix_share": blocks_findable_only_once_computed,
}
