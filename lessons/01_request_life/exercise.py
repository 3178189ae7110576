"""Lesson 1: a request's life. Write check_stop, the scheduler's "is this
request done?".

Check it:  nanoengine lesson check 1
Watch it:  nanoengine lesson trace 1
"""

from __future__ import annotations

from nanoengine.sequence import FinishReason, Sequence


def check_stop(self, seq: Sequence, token_id: int) -> FinishReason | None:
    """Is seq finished, now that token_id has just been appended to
    seq.token_ids?

    self is the Scheduler; you need self.eos_token_ids (a set of ids) and
    self.max_model_len. From seq you need seq.params.ignore_eos,
    seq.params.max_tokens, seq.num_completion_tokens and seq.num_tokens.
    """
    # TODO: return FinishReason.STOP if token_id is an end-of-sequence id
    #       (unless ignore_eos), FinishReason.LENGTH if max_tokens tokens were
    #       generated or num_tokens reached max_model_len, and None otherwise.
    raise NotImplementedError("check_stop is not written yet")
