"""Bug hunt 12: find and fix the bug in Scheduler.recompute_later.

This is what the engine's preemption does to each sequence it preempts, with
one real bug planted in it (a method of Scheduler: self is the scheduler;
Scheduler.preempt calls it). The run's outputs are even the same as with the
engine's own code.

Find it: `nanoengine lesson trace 12` runs the lesson's scenario with this
code and opens the replay at the first broken invariant; `nanoengine check` on
the trace it writes (in my-lessons/traces/) lists every violation. Fix it here.

Check it:  nanoengine lesson check 12
"""

from __future__ import annotations

from nanoengine.scheduler import SchedulerOutput
from nanoengine.sequence import (
    EventKind,
    FinishReason,
    Sequence,
    SequenceStatus,
)


def recompute_later(self, seq: Sequence, out: SchedulerOutput) -> None:
    """Drop seq's KV and put it back at the head of the waiting queue. A beam
    search starts again from its prompt (greedy, it finds the same beams): its
    first beam is kept."""
    self.block_manager.free(seq)
    seq.is_prefilling = False
    if seq.group and seq is not seq.group.restart():
        seq.finish(FinishReason.PRUNED)
        out.add_event(EventKind.FINISHED, seq, reason=FinishReason.PRUNED.value)
        return
    seq.status = SequenceStatus.WAITING
    self.waiting.appendleft(seq)
