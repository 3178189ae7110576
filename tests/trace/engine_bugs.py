"""Real engine bugs, each a small change to one engine function, for the mutation tests.

Each BUG names the engine function it replaces (a tracer.teach.swap target, or a module
attribute), the broken function, and the invariant the checker must name when the bug bites.
The broken functions are copies of the engine's own with one or two lines changed; the comment
on the changed line says what is missing. Bugs that a bug-hunt lesson ships are taken from that
lesson's exercise.py (the student's copy is the only one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from nanoengine.block_manager import BlockManager, blocks_needed
from nanoengine.engine import LLMEngine
from nanoengine.model_runner import StepInputs, prepare_inputs
from nanoengine.scheduler import Scheduler, SchedulerOutput, choose_victim, chunk_span
from nanoengine.sequence import EventKind, Sequence, SequenceStatus
from tracer.teach.lessons import find_lesson, student_functions


def slot_mapping_one_block_off(
    block_tables: torch.Tensor, seq_index: torch.Tensor, positions: torch.Tensor, block_size: int
) -> torch.Tensor:
    # BUG: the block index is one too small (for the first block it wraps to the table's last column)
    return block_tables[seq_index, positions // block_size - 1] * block_size + positions % block_size


def preempt_to_the_tail(self: Scheduler, seq: Sequence, out: SchedulerOutput, needed_by: Sequence) -> None:
    self.block_manager.free(seq)
    seq.num_cached_tokens = 0
    seq.prefill_chunk = 0
    seq.status = SequenceStatus.WAITING
    self.running.remove(seq)
    self.waiting.append(seq)  # BUG: behind every request that arrived after it
    out.add_event(EventKind.PREEMPTED, seq, reason="KV cache full")


def decoding_into_the_shared_prefix(bm: BlockManager) -> Callable[[list[Sequence], int], StepInputs]:
    """prepare_inputs where a decode of a sequence whose first block is shared lands in that block."""

    def broken(seqs: list[Sequence], block_size: int) -> StepInputs:
        inputs = prepare_inputs(seqs, block_size)
        start = 0
        for seq in seqs:
            n = seq.num_scheduled_tokens
            if n == 1 and seq.block_table and bm.ref_counts[seq.block_table[0]] > 1:
                # BUG: the slot is computed from the sequence's first block, which others share
                pos = int(inputs.positions[start])
                inputs.slot_mapping[start] = seq.block_table[0] * block_size + pos % block_size
            start += n
        return inputs

    return broken


@dataclass(frozen=True, slots=True)
class Bug:
    name: str
    target: str  # the tracer.teach.swap target the bug replaces
    make: Callable[[LLMEngine], Callable]  # the broken function for this engine
    invariants: tuple[str, ...]  # the checker must name one of these
    upstream: str  # where this kind of bug was seen


def same(fn: Callable) -> Callable[[LLMEngine], Callable]:
    return lambda engine: fn


def lesson_bug(lesson_key: str, name: str) -> Callable[[LLMEngine], Callable]:
    """The buggy function a bug-hunt lesson ships in its exercise.py."""
    lesson = find_lesson(lesson_key)
    return same(student_functions(lesson, lesson.exercise)[name])


BUGS = {
    "stale_hash_entry": Bug(
        "reused free block not evicted from the hash lookup",
        "BlockManager.take_free_block",
        lesson_bug("14", "take_free_block"),
        ("kv_content",),
        "the checker's own blind spot (issue 11)",
    ),
    "stale_cached_count": Bug(
        "stale num_cached_tokens after preemption",
        "Scheduler.preempt",
        lesson_bug("12", "preempt"),
        ("preempt_resets",),
        "nano-vllm PR #211",
    ),
    "zero_length_query": Bug(
        "a full prefix hit leaves zero tokens to compute",
        "BlockManager.find_cached_prefix",
        lesson_bug("11", "find_cached_prefix"),
        ("batch_membership",),
        "nano-vllm #114 / #144",
    ),
    "slot_off_by_one_block": Bug(
        "slot formula off by one block",
        "compute_slot_mapping",
        same(slot_mapping_one_block_off),
        ("slot_mapping",),
        "a classic paged-attention indexing slip",
    ),
    "preempt_to_tail": Bug(
        "preempted sequence appended to the tail of the waiting queue",
        "Scheduler.preempt",
        same(preempt_to_the_tail),
        ("admission_order", "preempted_to_head"),
        "vLLM's scheduler keeps preempted requests at the front",
    ),
    "decode_into_shared_block": Bug(
        "a decode writes into a shared prefix block",
        "prepare_inputs",
        lambda engine: decoding_into_the_shared_prefix(engine.block_manager),
        ("shared_block_write",),
        "copy-on-write missing for a shared block",
    ),
}


# ---- bugs in the numbers a decision records (tracer/trace/invariants/decisions.py) -----------------
# Plugged with monkeypatch.setattr(Scheduler, name, fn) by tests/trace/test_decision_invariants.py.
def budget_read_after_batching(self: Scheduler, seq: Sequence, num_new: int, out: SchedulerOutput) -> int:
    seq.num_scheduled_tokens = num_new
    out.seqs.append(seq)  # BUG: batched before its budget is read, so the chunk is charged to itself
    if seq.prefill_chunk:
        budget = self.max_num_batched_tokens - sum(s.num_scheduled_tokens for s in out.seqs)
        out.add_event(EventKind.PREFILL_CHUNK, seq, budget=budget, **chunk_span(seq))
    self.block_manager.register_full_blocks(seq)
    return num_new


def admit_keeping_a_token_back(self: Scheduler, seq: Sequence, budget: int, out: SchedulerOutput) -> bool:
    bm = self.block_manager
    hit_blocks, hit_hashes = bm.find_cached_prefix(seq)
    num_cached = len(hit_blocks) * bm.block_size
    num_new = min(seq.num_tokens - num_cached, max(budget - 1, 1))  # BUG: one budget token kept back
    num_new_blocks = blocks_needed(num_cached + num_new, bm.block_size) - len(hit_blocks)
    need = num_new_blocks + bm.num_free_in(hit_blocks)
    return admit_if_room(self, seq, out, hit_blocks, hit_hashes, num_new, need)


def admit_forgetting_free_hit_blocks(self: Scheduler, seq: Sequence, budget: int, out: SchedulerOutput) -> bool:
    bm = self.block_manager
    hit_blocks, hit_hashes = bm.find_cached_prefix(seq)
    num_cached = len(hit_blocks) * bm.block_size
    num_new = min(seq.num_tokens - num_cached, budget)
    num_new_blocks = blocks_needed(num_cached + num_new, bm.block_size) - len(hit_blocks)
    need = num_new_blocks  # BUG: the hit's blocks that sit free leave the free list too (lesson 7)
    return admit_if_room(self, seq, out, hit_blocks, hit_hashes, num_new, need)


def admit_if_room(
    self: Scheduler,
    seq: Sequence,
    out: SchedulerOutput,
    hit_blocks: list[int],
    hit_hashes: list[int],
    num_new: int,
    need: int,
) -> bool:
    """The rest of Scheduler.try_admit, unchanged: admit seq if `need` blocks are free."""
    bm = self.block_manager
    if not bm.can_allocate(need):
        out.add_event(EventKind.NOT_ADMITTED, seq, need=need, free=bm.num_free_blocks)
        return False
    out.add_event(EventKind.ADMITTED, seq, need=need, free=bm.num_free_blocks)
    self.waiting.popleft()
    bm.use_cached_prefix(seq, hit_blocks, hit_hashes)
    bm.allocate(seq, num_new)
    seq.status = SequenceStatus.RUNNING
    seq.num_scheduled_tokens = num_new
    seq.prefill_chunk = 1
    self.running.append(seq)
    if hit_blocks:
        out.add_event(EventKind.PREFIX_HIT, seq, blocks=hit_blocks, tokens_saved=len(hit_blocks) * bm.block_size)
    return True


def make_room_for_a_spare_block(self: Scheduler, seq: Sequence, num_new: int, out: SchedulerOutput) -> bool:
    bm = self.block_manager
    while not bm.can_allocate(bm.blocks_to_schedule(seq, num_new) + 1):  # BUG: keeps a block spare
        victim = choose_victim(self.running)
        self.preempt(victim, out, needed_by=seq)
        if victim is seq:
            return False
    return True
