"""Bug hunt 12: find and fix the bug in Scheduler.preempt.

This is the engine's preemption with one real bug planted in it (a method of
Scheduler: self is the scheduler). The run's outputs are even the same as
with the engine's own code.

Find it: `nanoengine lesson trace 12` runs the lesson's scenario with this
code and opens the replay at the first broken invariant; `nanoengine check` on
the trace it writes (in my-lessons/traces/) lists every violation. Fix it here.

Check it:  nanoengine lesson check 12
"""

from __future__ import annotations

from nanoengine.scheduler import SchedulerOutput
from nanoengine.sequence import EventKind, Sequence, SequenceStatus


def preempt(
    self, seq: Sequence, out: SchedulerOutput, needed_by: Sequence
) -> None:
    """Preempt by recompute: drop its KV; it will prefill all its tokens again
    later."""
    # too few for needed_by's new blocks
    num_free = self.block_manager.num_free_blocks
    self.block_manager.free(seq)
    seq.is_prefilling = False
    seq.status = SequenceStatus.WAITING
    self.running.remove(seq)
    self.waiting.appendleft(seq)
    out.preempted.append(seq)
    out.add_event(EventKind.PREEMPTED, seq, by=needed_by.seq_id, free=num_free)
