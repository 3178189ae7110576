"""Paged KV memory: a fixed pool of physical blocks, ref counts, and the prefix cache."""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict

from nanoengine.sequence import Sequence


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """How many blocks hold num_tokens tokens (the last block may be part-full)."""
    return (num_tokens + block_size - 1) // block_size


def compute_block_hash(parent_hash: int | None, token_ids: list[int]) -> int:
    """Chained hash: a block matches only if every block before it matched too.

    sha256, not Python's hash(): whoever picks the tokens cannot make two blocks collide and
    share the wrong KV (vLLM moved to sha256 for this). The first 8 bytes, as a non-negative int
    (63 bits), keep the trace's `hashes` plain JSON numbers."""
    parent = -1 if parent_hash is None else parent_hash
    data = struct.pack(f"<q{len(token_ids)}q", parent, *token_ids)
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


class BlockManager:
    def __init__(self, num_kv_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.num_kv_blocks = num_kv_blocks  # the pool's size
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_kv_blocks
        self.hashes: list[int | None] = [None] * num_kv_blocks
        self.hash_to_block: dict[int, int] = {}
        # Blocks with ref count 0, oldest-freed first; hashed ones are still reusable until taken.
        self.free_blocks: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_kv_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= self.num_free_blocks

    def blocks_to_schedule(self, seq: Sequence, num_new_tokens: int) -> int:
        """Blocks seq must take from the free list to hold num_new_tokens more tokens."""
        num_tokens = seq.num_cached_tokens + num_new_tokens
        num_new = blocks_needed(num_tokens, self.block_size) - len(seq.block_table)
        return num_new + self.must_copy(seq)

    def must_copy(self, seq: Sequence) -> bool:
        """Is the block seq writes next shared? Then it writes into a copy of its own.
        (A prefix hit shares only full blocks, which nobody writes again: forks share the rest.)
        Asked of all a beam search's beams before any copies, it counts one copy too many per
        block they all write: the last writer finds it its own (vLLM v0 wanted a block per beam)."""
        i = seq.num_cached_tokens // self.block_size
        return i < len(seq.block_table) and self.ref_counts[seq.block_table[i]] > 1

    def copy_on_write(self, seq: Sequence) -> tuple[int, int] | None:
        """Before seq writes into a shared block: (source, its new copy), the runner to copy the
        K/V; None when the block is its own."""
        if not self.must_copy(seq):
            return None
        i = seq.num_cached_tokens // self.block_size
        source, copy = seq.block_table[i], self.take_free_block()
        self.ref_counts[source] -= 1
        seq.block_table[i] = copy
        return source, copy

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """The child shares every block of its parent: one more holder each."""
        for block_id in parent.block_table:
            self.ref_counts[block_id] += 1
        child.block_table = list(parent.block_table)
        child.block_hashes = list(parent.block_hashes)

    def find_cached_prefix(self, seq: Sequence) -> tuple[list[int], list[int]]:
        """Longest run of full prompt blocks already in the cache: (block ids, their hashes).

        Stops one token short of the whole sequence, so the last token is always computed
        and the step has logits to sample from.
        """
        if not self.enable_prefix_caching or seq.params.prompt_logprobs is not None:
            return [], []  # prompt logprobs need every prompt position computed (as vLLM v1)
        blocks, hashes, parent = [], [], None
        for i in range((seq.num_tokens - 1) // self.block_size):
            start = i * self.block_size
            parent = compute_block_hash(parent, seq.token_ids[start : start + self.block_size])
            block_id = self.hash_to_block.get(parent)
            if block_id is None:
                break
            blocks.append(block_id)
            hashes.append(parent)
        return blocks, hashes

    def num_free_in(self, block_ids: list[int]) -> int:
        return sum(1 for b in block_ids if self.ref_counts[b] == 0)

    def use_cached_prefix(self, seq: Sequence, block_ids: list[int], hashes: list[int]) -> None:
        for block_id in block_ids:
            if self.ref_counts[block_id] == 0:
                del self.free_blocks[block_id]
            self.ref_counts[block_id] += 1
        seq.block_table = list(block_ids)
        seq.block_hashes = list(hashes)
        seq.num_cached_tokens = len(block_ids) * self.block_size

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        """Give seq enough blocks to hold its cached tokens plus num_new_tokens."""
        for _ in range(self.blocks_to_schedule(seq, num_new_tokens)):
            seq.block_table.append(self.take_free_block())

    def take_free_block(self) -> int:
        block_id, _ = self.free_blocks.popitem(last=False)
        old_hash = self.hashes[block_id]
        if old_hash is not None:  # evict: its cached contents are overwritten
            del self.hash_to_block[old_hash]
            self.hashes[block_id] = None
        self.ref_counts[block_id] = 1
        return block_id

    def free(self, seq: Sequence) -> None:
        # Tail blocks first, so they are evicted before the (more shareable) prefix blocks.
        for block_id in reversed(seq.block_table):
            self.ref_counts[block_id] -= 1
            if self.ref_counts[block_id] == 0:
                self.free_blocks[block_id] = None
        seq.block_table = []
        seq.block_hashes = []

    def register_full_blocks(self, seq: Sequence) -> None:
        """Hash each block full of computed or scheduled tokens, so other requests can share it.

        Called when seq is scheduled, as vLLM v1 does: a request admitted later in the same step
        hits blocks this step computes (every K/V of a layer is written before attention reads any).
        """
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        num_known = seq.num_cached_tokens + seq.num_scheduled_tokens
        for i in range(len(seq.block_hashes), num_known // bs):
            parent = seq.block_hashes[-1] if seq.block_hashes else None
            block_hash = compute_block_hash(parent, seq.token_ids[i * bs : (i + 1) * bs])
            seq.block_hashes.append(block_hash)
            block_id = seq.block_table[i]
            # No two live blocks share a hash: a copy (the last block of a full hit) stays unhashed.
            if block_hash not in self.hash_to_block:
                self.hash_to_block[block_hash] = block_id
                self.hashes[block_id] = block_hash

    def forget_uncomputed(self, seq: Sequence) -> list[int]:
        """seq's step failed: its blocks hashed when scheduled hold no K/V, so drop their hashes.
        Returns the blocks the step was to write."""
        first = seq.num_cached_tokens // self.block_size
        for block_id, block_hash in zip(seq.block_table[first:], seq.block_hashes[first:]):
            if self.hashes[block_id] == block_hash:
                del self.hash_to_block[block_hash]
                self.hashes[block_id] = None
        del seq.block_hashes[first:]
        return seq.block_table[first:]
