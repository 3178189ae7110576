"""Spoiler: the bug this lesson plants. exercise.py is the engine's current
Scheduler.recompute_later with this patch applied (tests check it still
applies)."""

from tracer.teach.plant import Edit, Patch

BUG = Patch(
    "Scheduler.recompute_later",
    (Edit("    seq.num_cached_tokens = 0\n", ""),),
)
