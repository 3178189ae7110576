"""Lesson 8: preemption. Write choose_victim, preempt and make_room.

Check it:  nanoengine lesson check 8
Watch it:  nanoengine lesson trace 8
"""

from __future__ import annotations

from nanoengine.scheduler import SchedulerOutput
from nanoengine.sequence import EventKind, Sequence, SequenceStatus


def choose_victim(running: list[Sequence]) -> Sequence:
    """The running sequence to preempt: the most recently admitted one (running
    is oldest first)."""
    # TODO
    raise NotImplementedError("choose_victim is not written yet")


def preempt(
    self, seq: Sequence, out: SchedulerOutput, needed_by: Sequence
) -> None:
    """Preempt seq by recompute. self is the Scheduler; needed_by is the
    sequence that needed room.

    Free its blocks, forget its KV (num_cached_tokens = 0, is_prefilling =
    False), make it WAITING, move it from self.running to the head of
    self.waiting, list it in out.preempted (schedule admits nobody in a step
    that preempted), and record out.add_event(EventKind.PREEMPTED, seq,
    by=needed_by.seq_id, free=...) (who needed the room, and the free blocks
    before seq's were given back).
    """
    # TODO
    raise NotImplementedError("preempt is not written yet")


def make_room(self, seq: Sequence, num_new: int, out: SchedulerOutput) -> bool:
    """Preempt until seq's num_new tokens have their blocks; False if seq itself
    was preempted.

    bm = self.block_manager; bm.blocks_to_schedule(seq, num_new) blocks are
    needed and bm.can_allocate(n) says whether n are free.
    """
    # TODO: loop: choose_victim(self.running), self.preempt(victim, out,
    #       needed_by=seq).
    raise NotImplementedError("make_room is not written yet")
