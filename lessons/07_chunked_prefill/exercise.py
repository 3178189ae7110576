"""Lesson 7: chunked prefill. Write try_admit, which admits a waiting request
with its first chunk.

Check it:  nanoengine lesson check 7
Watch it:  nanoengine lesson trace 7
"""

from __future__ import annotations

from nanoengine.block_manager import blocks_needed
from nanoengine.scheduler import SchedulerOutput
from nanoengine.sequence import EventKind, Sequence, SequenceStatus


def try_admit(self, seq: Sequence, budget: int, out: SchedulerOutput) -> bool:
    """Admit seq (the head of self.waiting) with a first chunk of at most budget
    tokens.

    self is the Scheduler; bm = self.block_manager. Returns False, changing
    nothing, if its blocks do not fit. The README's "Admission, step by step"
    lists the five steps.
    """
    bm = self.block_manager
    # TODO: 1 prefix-cache lookup, 2 chunk size, 3 block check (count
    #       bm.num_free_in(hit_blocks)), 4 commit (popleft, use_cached_prefix,
    #       allocate, status/num_scheduled_tokens/is_prefilling,
    #       running.append), 5 events (EventKind.ADMITTED, and PREFIX_HIT
    #       when blocks were reused).
    raise NotImplementedError("try_admit is not written yet")
