"""Real engine bugs, each a small change to one engine function, for the mutation tests and lessons.

Each BUG names the engine function it replaces (a tracer.teach.plugins target, or a module
attribute), the broken function, and the invariant the checker must name when the bug bites.
The broken functions are copies of the engine's own with one or two lines changed; the comment
on the changed line says what is missing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from nanoengine.block_manager import BlockManager, compute_block_hash
from nanoengine.engine import LLMEngine
from nanoengine.model_runner import StepInputs, prepare_inputs
from nanoengine.scheduler import Scheduler, SchedulerOutput
from nanoengine.sequence import Sequence, SequenceStatus


def take_free_block_keeping_its_hash_entry(self: BlockManager) -> int:
    block_id, _ = self.free_blocks.popitem(last=False)
    self.hashes[block_id] = None  # BUG: hash_to_block still maps the old hash to this block
    self.ref_counts[block_id] = 1
    return block_id


def preempt_keeping_cached_tokens(self: Scheduler, seq: Sequence, out: SchedulerOutput, needed_by: Sequence) -> None:
    self.block_manager.free(seq)
    # BUG: seq.num_cached_tokens is not reset: the count says KV exists that was just freed
    seq.prefill_chunk = 0
    seq.status = SequenceStatus.WAITING
    self.running.remove(seq)
    self.waiting.appendleft(seq)
    out.events.append(("preempted", seq.seq_id, {"reason": "KV cache full"}))


def find_cached_prefix_up_to_the_last_token(self: BlockManager, seq: Sequence) -> tuple[list[int], list[int]]:
    if not self.enable_prefix_caching:
        return [], []
    blocks, hashes, parent = [], [], None
    for i in range(seq.num_tokens // self.block_size):  # BUG: a full hit leaves no token to compute
        start = i * self.block_size
        parent = compute_block_hash(parent, seq.token_ids[start : start + self.block_size])
        block_id = self.hash_to_block.get(parent)
        if block_id is None:
            break
        blocks.append(block_id)
        hashes.append(parent)
    return blocks, hashes


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
    out.events.append(("preempted", seq.seq_id, {"reason": "KV cache full"}))


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
    target: str  # the tracer.teach.plugins target the bug replaces
    make: Callable[[LLMEngine], Callable]  # the broken function for this engine
    invariants: tuple[str, ...]  # the checker must name one of these
    upstream: str  # where this kind of bug was seen


def same(fn: Callable) -> Callable[[LLMEngine], Callable]:
    return lambda engine: fn


BUGS = {
    "stale_hash_entry": Bug(
        "reused free block not evicted from the hash lookup",
        "BlockManager.take_free_block",
        same(take_free_block_keeping_its_hash_entry),
        ("kv_content",),
        "the checker's own blind spot (issue 11)",
    ),
    "stale_cached_count": Bug(
        "stale num_cached_tokens after preemption",
        "Scheduler.preempt",
        same(preempt_keeping_cached_tokens),
        ("preempt_resets",),
        "nano-vllm PR #211",
    ),
    "zero_length_query": Bug(
        "a full prefix hit leaves zero tokens to compute",
        "BlockManager.find_cached_prefix",
        same(find_cached_prefix_up_to_the_last_token),
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
