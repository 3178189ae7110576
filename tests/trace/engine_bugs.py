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

from nanoengine.block_manager import BlockManager
from nanoengine.engine import LLMEngine
from nanoengine.model_runner import StepInputs, prepare_inputs
from nanoengine.scheduler import Scheduler, SchedulerOutput
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
