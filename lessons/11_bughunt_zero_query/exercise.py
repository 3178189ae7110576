"""Bug hunt 11: find and fix the bug in find_cached_prefix.

This is the engine's prefix-cache lookup with one real bug planted in it
(a method of BlockManager: self is the block manager). The code runs, and
nothing crashes in the lesson's scenario.

Find it: `nanoengine lesson trace 11` runs the lesson's scenario with this
code and opens the replay at the first broken invariant; `nanoengine check` on
the trace it writes (in my-lessons/traces/) lists every violation. Fix it here.

Check it:  nanoengine lesson check 11
"""

from __future__ import annotations

from nanoengine.block_manager import compute_block_hash
from nanoengine.sequence import Sequence


def find_cached_prefix(self, seq: Sequence) -> tuple[list[int], list[int]]:
    """Longest run of full prompt blocks already in the cache: (block ids,
    their hashes)."""
    if not self.enable_prefix_caching or seq.params.prompt_logprobs is not None:
        # prompt logprobs need every prompt position computed (as vLLM v1)
        return [], []
    blocks, hashes, parent = [], [], None
    for i in range(seq.num_tokens // self.block_size):
        start = i * self.block_size
        parent = compute_block_hash(
            parent, seq.token_ids[start : start + self.block_size]
        )
        block_id = self.hash_to_block.get(parent)
        if block_id is None:
            break
        blocks.append(block_id)
        hashes.append(parent)
    return blocks, hashes
