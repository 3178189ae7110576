"""Lesson 4: the block manager. Write can_allocate, allocate and free.

Check it:  nanoengine lesson check 4
Watch it:  nanoengine lesson trace 4
"""

from __future__ import annotations

from nanoengine.sequence import Sequence


def can_allocate(self, num_blocks: int) -> bool:
    """Are there num_blocks free blocks? (self is the BlockManager;
    self.num_free_blocks counts them.)"""
    # TODO: compare with the number of free blocks.
    raise NotImplementedError("can_allocate is not written yet")


def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
    """Give seq enough blocks to hold its cached tokens plus num_new_tokens
    more.

    self.blocks_to_schedule(seq, num_new_tokens) says how many it still needs;
    self.take_free_block() hands out one block (ref count 1, old hash evicted).
    """
    # TODO: append that many new blocks to seq.block_table.
    raise NotImplementedError("allocate is not written yet")


def free(self, seq: Sequence) -> None:
    """Release every block seq holds.

    For each block in seq.block_table, last block first: lower
    self.ref_counts[block] by one, and when it reaches 0 put it at the back of
    the free list (self.free_blocks[block] = None). Then empty seq.block_table
    and seq.block_hashes.
    """
    # TODO
    raise NotImplementedError("free is not written yet")
