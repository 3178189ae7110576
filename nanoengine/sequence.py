from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from nanoengine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from nanoengine.beam_search import BeamGroup


class SequenceStatus(str, Enum):
    WAITING = "WAITING"
    RUNNING = "RUNNING"
    FINISHED = "FINISHED"


class FinishReason(str, Enum):
    STOP = "stop"  # EOS or a stop string
    LENGTH = "length"  # max_tokens or max_model_len reached
    ABORT = "abort"  # the user aborted it
    IGNORED = "ignored"  # could never be scheduled
    ERROR = "error"  # its step failed (Sequence.error says why); the engine went on without it
    PRUNED = "pruned"  # a beam that fell out of its beam search (or was dropped by its restart)


class EventKind(str, Enum):  # what a step did to a sequence: a scheduler event, as traces record it
    ADMITTED = "admitted"
    NOT_ADMITTED = "not_admitted"  # the waiting head's blocks did not fit: it waits
    PREFIX_HIT = "prefix_hit"
    PREFILL_CHUNK = "prefill_chunk"
    PREFILL_DONE = "prefill_done"
    PREEMPTED = "preempted"
    FORKED = "forked"  # a beam search made this sequence from its parent, sharing its blocks
    COPY_ON_WRITE = "copy_on_write"  # it was to write into a shared block: it got its own copy
    FINISHED = "finished"

    def __str__(self) -> str:  # the plain value in f-strings, as a str would print
        return self.value


_seq_ids = itertools.count()


@dataclass(frozen=True, slots=True)
class Logprob:
    """A token's log-probability under the model (before any sampling parameter changes it)."""

    logprob: float
    rank: int  # 1 = the model's likeliest token
    decoded_token: str | None = None  # filled in when the output is made


TopLogprobs = dict[int, Logprob]  # token id -> its logprob: the chosen token first, then the top k


@dataclass(slots=True, eq=False)
class Sequence:
    """One request: its tokens, how many of them have KV in the cache, and where."""

    token_ids: list[int]
    params: SamplingParams
    prompt: str = ""
    seq_id: int = field(default_factory=lambda: next(_seq_ids))
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # tokens whose KV is in the cache; <= num_tokens always
    num_scheduled_tokens: int = 0  # tokens computed this step; 0 outside a step
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # chained hash per full cached block
    # True from admission until every token it must prefill (the prompt, or all its tokens
    # after a preemption) has KV; False while decoding, waiting or finished
    is_prefilling: bool = False
    num_prefill_chunks: int = 0  # chunks of the current prefill computed so far
    error: str = ""  # why it failed, when finish_reason is ERROR
    request_id: int = -1  # the request it answers: its own seq_id, or its first sibling's if n > 1
    logprobs: list[TopLogprobs] = field(default_factory=list)  # per output token, if asked
    prompt_logprobs: list[TopLogprobs | None] = field(default_factory=list)  # idem
    cumulative_logprob: float = 0.0  # sum of the output tokens' logprobs, when they are computed
    parent_id: int = -1  # the sequence it was forked from; -1 if none
    group: BeamGroup | None = None  # its beam search, if it is a beam: scheduled as a whole

    def __post_init__(self) -> None:
        self.num_prompt_tokens = len(self.token_ids)
        if self.request_id < 0:
            self.request_id = self.seq_id
        if self.params.prompt_logprobs is not None:
            self.prompt_logprobs = [None]  # the first prompt token has no logprob

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_completion_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    @property
    def completion_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_cached_tokens

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def fork(self) -> Sequence:
        """A child with the same tokens, logprobs and counters; the block manager shares the
        blocks."""
        child = copy.copy(self)
        child.seq_id = next(_seq_ids)
        child.parent_id = self.seq_id
        child.token_ids = list(self.token_ids)
        child.logprobs = list(self.logprobs)
        child.block_table = []
        child.block_hashes = []
        return child

    def finish(self, reason: FinishReason) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
