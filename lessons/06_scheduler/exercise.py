"""Lesson 6: the scheduler. Write schedule, which picks the batch for one step,
and schedule_unit, which gives one running unit its tokens.

Check it:  nanoengine lesson check 6
Watch it:  nanoengine lesson trace 6
"""

from __future__ import annotations

from nanoengine.scheduler import SchedulerOutput, unit_of
from nanoengine.sequence import EventKind, Sequence, SequenceStatus


def schedule(self) -> SchedulerOutput:
    """Choose this step's batch. self is the Scheduler.

    Pass 1, running sequences (self.running, oldest first) while budget
    remains: skip any whose status is no longer RUNNING (preempted earlier in
    this loop) or that already has num_scheduled_tokens (scheduled with its
    beams); otherwise budget -= self.schedule_unit(unit_of(seq), budget, out).
    Pass 2, only if pass 1 preempted nobody (out.preempted is empty), waiting
    sequences (self.waiting[0] first) while budget > 0 and
    self.has_seq_slots(self.waiting[0]): stop at the first one
    self.try_admit(seq, budget, out) rejects; otherwise budget -=
    self.schedule_tokens(seq, seq.num_scheduled_tokens, budget, out).
    """
    out = SchedulerOutput()
    budget = self.max_num_batched_tokens
    # TODO: the two passes. Iterate over list(self.running): make_room may
    #       remove items from it.
    raise NotImplementedError("schedule is not written yet")


def schedule_unit(
    self, unit: list[Sequence], budget: int, out: SchedulerOutput
) -> int:
    """Schedule a unit (a plain request alone, or a beam search's live beams):
    all of it or none. Returns the tokens to take off the budget, 0 if it did
    not fit.

    num_new = [min(s.num_uncomputed_tokens, budget) for s in unit]; return 0
    if they add up to more than budget or if not self.make_room(unit,
    num_new, out). Then for each seq and n: copied =
    self.block_manager.copy_on_write(seq) (a beam's shared block, lesson 16);
    if it is not None, add it to out.blocks_to_copy and record
    out.add_event(EventKind.COPY_ON_WRITE, seq, source=copied[0],
    copy=copied[1]); self.block_manager.allocate(seq, n); budget -=
    self.schedule_tokens(seq, n, budget, out).
    """
    # TODO
    raise NotImplementedError("schedule_unit is not written yet")
