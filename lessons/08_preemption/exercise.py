"""Lesson 8: preemption. Write choose_victim, make_room, preempt and
recompute_later.

Check it:  nanoengine lesson check 8
Watch it:  nanoengine lesson trace 8
"""

from __future__ import annotations

from nanoengine.scheduler import SchedulerOutput, unit_of
from nanoengine.sequence import (
    EventKind,
    FinishReason,
    Sequence,
    SequenceStatus,
)


def choose_victim(running: list[Sequence]) -> Sequence:
    """The running sequence to preempt: the most recently admitted one (running
    is oldest first)."""
    # TODO
    raise NotImplementedError("choose_victim is not written yet")


def make_room(
    self, unit: list[Sequence], num_new: list[int], out: SchedulerOutput
) -> bool:
    """Preempt until the unit's new tokens have their blocks (num_new[i] tokens
    for unit[i]); False if the unit itself was preempted. self is the
    Scheduler; a unit is a plain request alone, or a beam search's live beams.

    bm = self.block_manager; bm.blocks_to_schedule(seq, n) blocks are needed
    for each seq and its n, and bm.can_allocate(k) says whether k are free.
    Each round preempts victim = choose_victim(self.running) with
    self.preempt(victim, out, needed_by=unit[0]); return False as soon as the
    victim is one of the unit's.
    """
    # TODO
    raise NotImplementedError("make_room is not written yet")


def preempt(
    self, victim: Sequence, out: SchedulerOutput, needed_by: Sequence
) -> None:
    """Preempt victim's unit, unit_of(victim), by recompute. needed_by is the
    sequence that needed room.

    Read the free blocks first (too few for needed_by: the event records
    them). Then for each seq of the unit, newest first (reversed): remove it
    from self.running, list it in out.preempted (schedule admits nobody in a
    step that preempted), record out.add_event(EventKind.PREEMPTED, seq,
    by=needed_by.seq_id, free=...), and hand it to self.recompute_later(seq,
    out).
    """
    # TODO
    raise NotImplementedError("preempt is not written yet")


def recompute_later(self, seq: Sequence, out: SchedulerOutput) -> None:
    """What a preemption does to each sequence: free its blocks, forget its KV
    (num_cached_tokens = 0, is_prefilling = False), make it WAITING at the
    head of self.waiting.

    A beam search starts again from its prompt: seq.group.restart() cuts its
    first beam back to the prompt and returns it. If seq.group and seq is not
    that beam, seq is dropped instead: seq.finish(FinishReason.PRUNED), then
    out.add_event(EventKind.FINISHED, seq, reason=FinishReason.PRUNED.value).
    """
    # TODO
    raise NotImplementedError("recompute_later is not written yet")
