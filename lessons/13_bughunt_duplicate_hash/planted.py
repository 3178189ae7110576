"""Spoiler: the bug this lesson plants. exercise.py is the engine's current
BlockManager.register_full_blocks with this patch applied (tests check it
still applies)."""

from tracer.teach.plant import Edit, Patch

BUG = Patch(
    "BlockManager.register_full_blocks",
    (
        Edit(
            "        # No two live blocks share a hash: a copy (the last block of a "
            "full hit) stays unhashed.\n"
            "        if block_hash not in self.hash_to_block:\n"
            "            self.hash_to_block[block_hash] = block_id\n"
            "            self.hashes[block_id] = block_hash\n",
            "        self.hash_to_block[block_hash] = block_id\n"
            "        self.hashes[block_id] = block_hash\n",
        ),
    ),
)
