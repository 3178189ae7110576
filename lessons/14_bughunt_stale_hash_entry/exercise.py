"""Bug hunt 14: find and fix the bug in BlockManager.take_free_block.

This is the engine's block allocation from the free list with one real bug
planted in it. Every counter, ref count and hash the trace records stays
consistent, and the outputs match the engine's own in this scenario.

Find it: `nanoengine lesson trace 14` runs the lesson's scenario with this
code and opens the replay at the first broken invariant; `nanoengine check` on
the trace it writes (in my-lessons/traces/) lists every violation. Fix it here.

Check it:  nanoengine lesson check 14
"""

from __future__ import annotations


def take_free_block(self) -> int:
    """Take the oldest free block for a new owner; a cached block is evicted.
    self is the BlockManager."""
    block_id, _ = self.free_blocks.popitem(last=False)
    if self.hashes[block_id] is not None:  # evict: its old contents go
        self.hashes[block_id] = None
    self.ref_counts[block_id] = 1
    return block_id
