"""Lesson 2: the three counters. Write postprocess, which commits one engine
step.

Check it:  nanoengine lesson check 2
Watch it:  nanoengine lesson trace 2
"""

from __future__ import annotations

from nanoengine.scheduler import SchedulerOutput
from nanoengine.sequence import EventKind, Sequence


def postprocess(
    self, out: SchedulerOutput, token_ids: list[int]
) -> list[Sequence]:
    """Commit the step: advance each sequence's cache, keep its sampled token if
    it is now fully computed, and finish the ones that are done. Returns the
    sequences that gained a token.

    self is the Scheduler. out.seqs[i] ran this step and token_ids[i] was
    sampled for it. Helpers you need: self.check_stop(seq, token_id),
    self.finish(seq, reason, out). The README lists the six steps, in order.
    """
    # TODO: for each (seq, token_id): num_cached_tokens += num_scheduled_tokens;
    #       num_scheduled_tokens = 0; while prefilling, count the chunk
    #       (num_prefill_chunks += 1); mid-prefill -> skip; prefill just
    #       done -> PREFILL_DONE event and is_prefilling = False; append the
    #       token; finish it if check_stop says so.
    raise NotImplementedError("postprocess is not written yet")
