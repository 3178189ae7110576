"""Continuous batching: which sequences run this step, and how many tokens each computes."""

from __future__ import annotations

import sys
from collections import deque
from dataclasses import dataclass, field
from types import CodeType
from typing import Any

from nanoengine.block_manager import BlockManager, blocks_needed
from nanoengine.sequence import EventKind, FinishReason, Sequence, SequenceStatus


def choose_victim(running: list[Sequence]) -> Sequence:
    """Preempt the most recently admitted request: it has done the least work."""
    return running[-1]


def seq_slots(seq: Sequence) -> int:
    return seq.group.params.beam_width if seq.group else 1


def unit_of(seq: Sequence) -> list[Sequence]:
    """What is scheduled, preempted and swapped as a whole: a beam search's live beams (they
    are ranked against each other every step), else the sequence alone."""
    return list(seq.group.live) if seq.group else [seq]


def chunk_span(seq: Sequence) -> dict[str, int]:  # the tokens a prefill chunk computes
    start, end = seq.num_cached_tokens, seq.num_cached_tokens + seq.num_scheduled_tokens
    chunk = seq.num_prefill_chunks + 1
    return {"chunk": chunk, "start": start, "end": end, "num_tokens": seq.num_tokens}


@dataclass(frozen=True, slots=True)
class Event:
    """What a step did to a sequence, with the numbers the decision was taken on."""

    kind: EventKind
    seq_id: int
    detail: dict[str, Any]  # kind-specific: see docs/trace-format.md
    # The lines that emitted it, innermost first: the emitting function and its two callers, as
    # a log record notes its line (the replay shows the code that decided).
    where: tuple[tuple[CodeType, int], ...] = field(default=(), repr=False, compare=False)


def emitted_from(frame: Any, depth: int = 3) -> tuple[tuple[CodeType, int], ...]:
    lines: list[tuple[CodeType, int]] = []
    while frame is not None and len(lines) < depth:
        lines.append((frame.f_code, frame.f_lineno))
        frame = frame.f_back
    return tuple(lines)


@dataclass(slots=True)
class SchedulerOutput:
    # batch order; each has num_scheduled_tokens > 0
    seqs: list[Sequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)  # this step, in preemption order
    events: list[Event] = field(default_factory=list)
    # copy-on-write: (source, copy) blocks whose K/V the runner copies before the forward
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)

    def add_event(self, kind: EventKind, seq: Sequence, **detail: Any) -> None:
        self.events.append(Event(kind, seq.seq_id, detail, emitted_from(sys._getframe(1))))


@dataclass(slots=True, eq=False)
class Scheduler:
    block_manager: BlockManager
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    eos_token_ids: frozenset[int] = frozenset()
    waiting: deque[Sequence] = field(default_factory=deque)
    running: list[Sequence] = field(default_factory=list)  # admission order: newest last

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        # 1. Running sequences first, oldest first: one decode token each, or their next
        #    prefill chunk. A beam search's beams go together, or none of them.
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status != SequenceStatus.RUNNING or seq.num_scheduled_tokens:
                continue  # preempted earlier in this loop, or scheduled with its beams
            budget -= self.schedule_unit(unit_of(seq), budget, out)
        # 2. Then admit waiting sequences (preempted ones are at the head) while budget and blocks
        # last; none after a preemption (vLLM v1): the pool is short, they would go out again.
        admit = not out.preempted
        while admit and self.waiting and budget > 0 and self.has_seq_slots(self.waiting[0]):
            seq = self.waiting[0]
            if not self.try_admit(seq, budget, out):
                break
            budget -= self.schedule_tokens(seq, seq.num_scheduled_tokens, budget, out)
        return out

    def has_seq_slots(self, seq: Sequence) -> bool:
        """max_num_seqs: a beam search holds a slot for each of its beams from the start."""
        used = sum(seq_slots(s) for s in self.running if not s.group or s is s.group.live[0])
        return used + seq_slots(seq) <= self.max_num_seqs

    def schedule_unit(self, unit: list[Sequence], budget: int, out: SchedulerOutput) -> int:
        """Schedule each sequence's uncomputed tokens (as many as the budget takes: beams take
        one each), their shared blocks copied before they are written.

        Returns the tokens to take off the budget: 0 when the unit did not fit."""
        num_new = [min(s.num_uncomputed_tokens, budget) for s in unit]
        if sum(num_new) > budget or not self.make_room(unit, num_new, out):
            return 0
        for seq, n in zip(unit, num_new):
            copied = self.block_manager.copy_on_write(seq)
            if copied is not None:
                out.blocks_to_copy.append(copied)
                out.add_event(EventKind.COPY_ON_WRITE, seq, source=copied[0], copy=copied[1])
            self.block_manager.allocate(seq, n)
            budget -= self.schedule_tokens(seq, n, budget, out)
        return sum(num_new)

    def make_room(self, unit: list[Sequence], num_new: list[int], out: SchedulerOutput) -> bool:
        """Preempt newer sequences until the unit's new blocks fit; False if it was preempted."""
        bm = self.block_manager
        while not bm.can_allocate(sum(map(bm.blocks_to_schedule, unit, num_new))):
            victim = choose_victim(self.running)
            self.preempt(victim, out, needed_by=unit[0])
            if victim in unit:
                return False
        return True

    def try_admit(self, seq: Sequence, budget: int, out: SchedulerOutput) -> bool:
        bm = self.block_manager
        hit_blocks, hit_hashes = bm.find_cached_prefix(seq)
        num_cached = len(hit_blocks) * bm.block_size
        num_new = min(seq.num_tokens - num_cached, budget)
        num_new_blocks = blocks_needed(num_cached + num_new, bm.block_size) - len(hit_blocks)
        need = num_new_blocks + bm.num_free_in(hit_blocks)  # blocks it takes from the free list
        if not bm.can_allocate(need):
            out.add_event(EventKind.NOT_ADMITTED, seq, need=need, free=bm.num_free_blocks)
            return False
        out.add_event(EventKind.ADMITTED, seq, need=need, free=bm.num_free_blocks)
        self.waiting.popleft()
        bm.use_cached_prefix(seq, hit_blocks, hit_hashes)
        bm.allocate(seq, num_new)
        seq.status = SequenceStatus.RUNNING
        seq.num_scheduled_tokens = num_new
        seq.is_prefilling = True
        seq.num_prefill_chunks = 0
        self.running.append(seq)
        if hit_blocks:
            out.add_event(EventKind.PREFIX_HIT, seq, blocks=hit_blocks, tokens_saved=num_cached)
        return True

    def schedule_tokens(
        self, seq: Sequence, num_new: int, budget: int, out: SchedulerOutput
    ) -> int:
        """Put num_new of seq's tokens in this step's batch; budget: the tokens left before them.

        Returns num_new, the tokens to take off the budget."""
        seq.num_scheduled_tokens = num_new
        if seq.is_prefilling:
            out.add_event(EventKind.PREFILL_CHUNK, seq, budget=budget, **chunk_span(seq))
        out.seqs.append(seq)
        self.block_manager.register_full_blocks(seq)  # findable now: later admissions may hit them
        return num_new

    def preempt(self, victim: Sequence, out: SchedulerOutput, needed_by: Sequence) -> None:
        """Preempt by recompute: drop the KV of victim's unit (a beam search's beams together);
        it will prefill all its tokens again later."""
        num_free = self.block_manager.num_free_blocks  # too few for needed_by's new blocks
        for seq in reversed(unit_of(victim)):  # newest first: the unit keeps its order
            self.running.remove(seq)
            out.preempted.append(seq)
            out.add_event(EventKind.PREEMPTED, seq, by=needed_by.seq_id, free=num_free)
            self.recompute_later(seq, out)

    def recompute_later(self, seq: Sequence, out: SchedulerOutput) -> None:
        """Drop seq's KV and put it back at the head of the waiting queue. A beam search starts
        again from its prompt (greedy, it finds the same beams): its first beam is kept."""
        self.block_manager.free(seq)
        seq.num_cached_tokens = 0
        seq.is_prefilling = False
        if seq.group and seq is not seq.group.restart():
            seq.finish(FinishReason.PRUNED)
            out.add_event(EventKind.FINISHED, seq, reason=FinishReason.PRUNED.value)
            return
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)

    def postprocess(self, out: SchedulerOutput, token_ids: list[int]) -> list[Sequence]:
        """Commit the step: advance caches, append sampled tokens, finish what is done.

        Returns the sequences that gained a token.
        """
        appended = []
        for seq, token_id in zip(out.seqs, token_ids):
            seq.num_cached_tokens += seq.num_scheduled_tokens
            seq.num_scheduled_tokens = 0
            if seq.is_prefilling:
                seq.num_prefill_chunks += 1
            if seq.num_cached_tokens < seq.num_tokens:  # mid-prefill: its logits were discarded
                continue
            if seq.is_prefilling:
                out.add_event(EventKind.PREFILL_DONE, seq, chunks=seq.num_prefill_chunks)
                seq.is_prefilling = False
            seq.token_ids.append(token_id)
            appended.append(seq)
            reason = self.check_stop(seq, token_id)
            if reason is not None:
                self.finish(seq, reason, out)
        return appended

    def check_stop(self, seq: Sequence, token_id: int) -> FinishReason | None:
        p = seq.params
        is_eos = token_id in self.eos_token_ids and not p.ignore_eos
        if (is_eos or token_id in p.stop_token_ids) and seq.num_completion_tokens >= p.min_tokens:
            return FinishReason.STOP
        out_of_positions = seq.num_tokens >= self.max_model_len
        if seq.num_completion_tokens >= seq.params.max_tokens or out_of_positions:
            return FinishReason.LENGTH
        return None

    def finish(
        self, seq: Sequence, reason: FinishReason, out: SchedulerOutput | None = None
    ) -> None:
        if seq.status == SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.finish(reason)
        if out is not None:
            out.add_event(EventKind.FINISHED, seq, reason=reason.value)
