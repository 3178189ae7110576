"""Lesson 5: prefix caching. Write compute_block_hash and find_cached_prefix.

Check it:  nanoengine lesson check 5
Watch it:  nanoengine lesson trace 5
"""

from __future__ import annotations

import hashlib
import struct

from nanoengine.sequence import Sequence


def compute_block_hash(parent_hash: int | None, token_ids: list[int]) -> int:
    """A key for one full block that also covers every block before it (through
    parent_hash).

    Must be deterministic, a non-negative int, and differ when the parent or any
    token differs.
    """
    # TODO: hash the parent's key together with this block's tokens.
    raise NotImplementedError("compute_block_hash is not written yet")


def find_cached_prefix(self, seq: Sequence) -> tuple[list[int], list[int]]:
    """The longest run of seq's full blocks already in the cache: (block ids,
    their keys).

    self is the BlockManager: self.block_size, self.hash_to_block (key -> block
    id), self.enable_prefix_caching. Look at most at the first (seq.num_tokens -
    1) // block_size blocks, so the last token is always computed. Chain the
    keys with compute_block_hash.
    """
    # TODO: key = compute_block_hash(previous key, the block's tokens); stop at
    #       the first miss.
    raise NotImplementedError("find_cached_prefix is not written yet")
