"""Spoiler: the bug this lesson plants. exercise.py is the engine's current
find_cached_prefix with this patch applied (tests check it still applies)."""

from tracer.teach.plant import Edit, Patch

BUG = Patch(
    "BlockManager.find_cached_prefix",
    (
        Edit(  # the docstring's rule goes with the line that keeps it
            "their hashes).\n\n"
            "    Stops one token short of the whole sequence, so the last token is "
            "always computed\n"
            "    and the step has logits to sample from.\n"
            '    """',
            'their hashes)."""',
        ),
        Edit(
            "range((seq.num_tokens - 1) // self.block_size)",
            "range(seq.num_tokens // self.block_size)",
        ),
    ),
)
