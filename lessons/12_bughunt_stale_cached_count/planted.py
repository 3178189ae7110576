"""Spoiler: the bug this lesson plants. exercise.py is the engine's current
Scheduler.preempt with this patch applied (tests check it still applies)."""

from tracer.teach.plant import Edit, Patch

BUG = Patch(
    "Scheduler.preempt",
    (Edit("    seq.num_cached_tokens = 0\n", ""),),
)
