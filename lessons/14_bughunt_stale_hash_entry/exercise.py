"""Bug hunt 14: find and fix the bug in BlockManager.take_free_block.

This is the engine's block allocation from the free list with one real bug
planted in it (a method of BlockManager: self is the block manager; it takes
the oldest free block for a new owner, evicting a cached one). The block
manager remembers the prefix cache in two places: self.hashes[block_id], each
block's hash (None: not cached), and self.hash_to_block, hash -> block id,
the table find_cached_prefix looks a prefix up in. Every counter, ref count
and hash the trace records stays consistent, and the outputs match the
engine's own in this scenario.

Find it: `nanoengine lesson trace 14` runs the lesson's scenario with this
code and opens the replay at the first broken invariant; `nanoengine check` on
the trace it writes (in my-lessons/traces/) lists every violation. Fix it here.

Check it:  nanoengine lesson check 14
"""

from __future__ import annotations


def take_free_block(self) -> int:
    block_id, _ = self.free_blocks.popitem(last=False)
    old_hash = self.hashes[block_id]
    if old_hash is not None:  # evict: its cached contents are overwritten
        self.hashes[block_id] = None
    self.ref_counts[block_id] = 1
    return block_id
