"""Spoiler: the bug this lesson plants. exercise.py is the engine's current
BlockManager.take_free_block with this patch applied (tests check it still
applies)."""

from tracer.teach.plant import Edit, Patch

BUG = Patch(
    "BlockManager.take_free_block",
    (Edit("        del self.hash_to_block[old_hash]\n", ""),),
)
