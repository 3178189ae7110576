"""Bug hunt 13: find and fix the bug in BlockManager.register_full_blocks.

This is the engine's prefix-cache registration with one real bug planted in
it (a method of BlockManager: self is the block manager). The run's outputs
are the same as with the engine's own code.

Find it: `nanoengine lesson trace 13` runs the lesson's scenario with this
code and opens the replay at the first broken invariant; `nanoengine check` on
the trace it writes (in my-lessons/traces/) lists every violation. Fix it here.

Check it:  nanoengine lesson check 13
"""

from __future__ import annotations

from nanoengine.block_manager import compute_block_hash
from nanoengine.sequence import Sequence


def register_full_blocks(self, seq: Sequence) -> None:
    """Hash each block full of computed or scheduled tokens, so other requests
    can share it.

    Called when seq is scheduled, as vLLM v1 does: a request admitted later in
    the same step hits blocks this step computes (every K/V of a layer is
    written before attention reads any).
    """
    if not self.enable_prefix_caching:
        return
    bs = self.block_size
    num_known = seq.num_cached_tokens + seq.num_scheduled_tokens
    for i in range(len(seq.block_hashes), num_known // bs):
        parent = seq.block_hashes[-1] if seq.block_hashes else None
        block_hash = compute_block_hash(
            parent, seq.token_ids[i * bs : (i + 1) * bs]
        )
        seq.block_hashes.append(block_hash)
        block_id = seq.block_table[i]
        self.hash_to_block[block_hash] = block_id
        self.hashes[block_id] = block_hash
