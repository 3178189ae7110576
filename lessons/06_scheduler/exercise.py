"""Lesson 6: the scheduler. Write schedule, which picks the batch for one step.

Check it:  nanoengine lesson check 6
Watch it:  nanoengine lesson trace 6
"""

from __future__ import annotations

from nanoengine.scheduler import SchedulerOutput
from nanoengine.sequence import SequenceStatus


def schedule(self) -> SchedulerOutput:
    """Choose this step's batch. self is the Scheduler.

    Pass 1, running sequences (self.running, oldest first) while budget remains:
    skip any whose status is no longer RUNNING; num_new =
    min(seq.num_uncomputed_tokens, budget); if self.make_room(seq, num_new,
    out): self.block_manager.allocate(seq, num_new) and budget -=
    self.schedule_tokens(seq, num_new, budget, out). Pass 2, only if pass 1
    preempted nobody (out.preempted is empty), waiting sequences
    (self.waiting[0] first) while budget > 0 and fewer than self.max_num_seqs
    are running: stop at the first one self.try_admit(seq, budget, out) rejects;
    otherwise budget -= self.schedule_tokens(seq, seq.num_scheduled_tokens,
    budget, out).
    """
    out = SchedulerOutput()
    budget = self.max_num_batched_tokens
    # TODO: the two passes. Iterate over list(self.running): make_room may
    #       remove items from it.
    raise NotImplementedError("schedule is not written yet")
