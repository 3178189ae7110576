"""The immutable record of one engine step, handed to step hooks, and how it is built.

Built only when a hook is registered (StepWatch), so an engine without hooks pays nothing.
Everything is plain ints, strings, tuples and None, so a hook can serialise it as is.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from nanoengine.sequence import EventKind

if TYPE_CHECKING:
    from nanoengine.block_manager import BlockManager
    from nanoengine.model_runner import StepInputs
    from nanoengine.scheduler import Event, SchedulerOutput
    from nanoengine.sequence import Sequence


@dataclass(frozen=True, slots=True)
class SeqStep:
    """One sequence during one step.

    The middle fields (num_tokens ... block_table) are the values the step inputs were
    built from: after schedule(), before postprocess().
    """

    seq_id: int
    num_prompt_tokens: int
    status_before: str  # at the start of the step: WAITING / RUNNING
    status_after: str  # at the end: WAITING / RUNNING / FINISHED
    num_tokens: int
    num_cached_tokens: int
    num_scheduled_tokens: int
    block_table: tuple[int, ...]
    num_tokens_after: int
    num_cached_tokens_after: int
    num_scheduled_tokens_after: int  # 0: nothing is scheduled outside a step
    block_table_after: tuple[int, ...]
    new_token_ids: tuple[int, ...]  # tokens appended this step (0 or 1)
    finish_reason: str | None  # stop / length / abort / ignored / error, once FINISHED
    request_id: int  # the request it answers: its own seq_id, or its first sibling's if n > 1
    parent_id: int  # the beam it was forked from (sharing its blocks); -1 if none
    beam_width: int  # its beam search's; 0 if it is not a beam


@dataclass(frozen=True, slots=True)
class InputsRecord:
    """The flat, unpadded batch the model ran on (see model_runner.prepare_inputs)."""

    seq_ids: tuple[int, ...]  # request order inside the batch
    input_ids: tuple[int, ...]
    positions: tuple[int, ...]
    query_start_loc: tuple[int, ...]  # len = num seqs + 1
    seq_lens: tuple[int, ...]
    slot_mapping: tuple[int, ...]
    block_tables: tuple[tuple[int, ...], ...]
    logits_indices: tuple[int, ...]  # one per sequence: its last scheduled token
    discard: tuple[bool, ...]  # True where the sequence is mid-prefill


NO_INPUTS = InputsRecord((), (), (), (0,), (), (), (), (), ())  # a step that ran no model


@dataclass(frozen=True, slots=True)
class BlockPool:
    """The physical KV blocks at the end of the step."""

    block_size: int
    ref_counts: tuple[int, ...]  # index = physical block id
    hashes: tuple[int | None, ...]  # prefix-cache hash of full, computed blocks
    free_block_ids: tuple[int, ...]  # in eviction order (oldest first)


@dataclass(frozen=True, slots=True)
class QueueOrder:
    """The scheduler's queues at the start of the step (before aborts), as the step found them."""

    running: tuple[int, ...]  # admission order: the victim policy preempts from the end
    # head first (preempted sequences go back there), as much as one step can admit
    waiting: tuple[int, ...]
    num_waiting: int  # the whole waiting queue's length


@dataclass(frozen=True, slots=True)
class StepRecord:
    step: int
    wall_time: float  # seconds for the whole step
    model_time: float  # seconds in the model forward + sampling
    seqs: tuple[SeqStep, ...]  # by seq_id: see StepWatch for which
    events: tuple[Event, ...]  # each with the lines that emitted it
    inputs: InputsRecord
    pool: BlockPool
    queues: QueueOrder
    blocks_to_copy: tuple[tuple[int, int], ...]  # copy-on-write (source, copy), before the forward


StepHook = Callable[[StepRecord], None]


@dataclass(frozen=True, slots=True)
class Scheduled:
    """A sequence's counters as the step inputs were built from them."""

    num_tokens: int
    num_cached_tokens: int
    num_scheduled_tokens: int
    block_table: tuple[int, ...]


@dataclass(slots=True)
class StepWatch:
    """Takes the snapshots one step's record needs, then hands the record to the hooks.

    The record lists the sequences running at the start, those the hooks have not seen yet,
    and those scheduled or named by an event this step. A waiting sequence that nothing touched
    is left out (a recorder carries its last row), so the cost follows the batch, not the queue."""

    step: int
    sequences: dict[int, Sequence]  # the engine's: every request not yet collected, by seq_id
    hooks: list[StepHook]
    queues: QueueOrder
    # Each sequence listed from the start, with its status then; any other was WAITING.
    status_before: dict[int, str]
    start: float = field(default_factory=time.perf_counter)
    scheduled: dict[int, Scheduled] = field(default_factory=dict)
    inputs: StepInputs | None = None
    model_start: float = 0.0
    model_time: float = 0.0

    def saw_inputs(self, seqs: list[Sequence], inputs: StepInputs) -> None:
        """The values the step inputs were built from, taken between schedule() and
        postprocess(); the model's clock starts."""
        if not self.hooks:
            return
        self.scheduled = {s.seq_id: counters(s) for s in seqs}
        self.inputs = inputs
        self.model_start = time.perf_counter()

    def saw_tokens(self) -> None:
        """The model ran and sampled: its clock stops."""
        self.model_time = time.perf_counter() - self.model_start

    def publish(self, out: SchedulerOutput, bm: BlockManager) -> None:
        if not self.hooks:
            return
        record = self.record(out, bm)
        for hook in self.hooks:
            hook(record)

    def record(self, out: SchedulerOutput, bm: BlockManager) -> StepRecord:
        # taken before the record is built: building it is the tracer's cost, not the step's
        wall_time = time.perf_counter() - self.start
        touched = [s.seq_id for s in out.seqs] + [e.seq_id for e in out.events]
        listed = self.status_before.keys() | (set(touched) & self.sequences.keys())
        forked = {e.seq_id for e in out.events if e.kind == EventKind.FORKED}
        return StepRecord(
            step=self.step,
            wall_time=wall_time,
            model_time=self.model_time,
            seqs=tuple(self.seq_step(self.sequences[i], i in forked) for i in sorted(listed)),
            events=tuple(out.events),
            inputs=record_inputs(out.seqs, self.inputs, self.scheduled),
            pool=record_pool(bm),
            queues=self.queues,
            blocks_to_copy=tuple(out.blocks_to_copy),
        )

    def seq_step(self, s: Sequence, forked: bool) -> SeqStep:
        """A beam forked in this step starts RUNNING, with its parent's blocks and tokens but
        the last (its own)."""
        after = Scheduled(s.num_tokens, s.num_cached_tokens, 0, tuple(s.block_table))
        before = self.scheduled.get(s.seq_id, after)
        if forked:
            before = Scheduled(s.num_tokens - 1, s.num_cached_tokens, 0, after.block_table)
        status_before = "RUNNING" if forked else self.status_before.get(s.seq_id, "WAITING")
        return SeqStep(
            seq_id=s.seq_id,
            num_prompt_tokens=s.num_prompt_tokens,
            status_before=status_before,
            status_after=s.status.value,
            num_tokens=before.num_tokens,
            num_cached_tokens=before.num_cached_tokens,
            num_scheduled_tokens=before.num_scheduled_tokens,
            block_table=before.block_table,
            num_tokens_after=s.num_tokens,
            num_cached_tokens_after=s.num_cached_tokens,
            num_scheduled_tokens_after=s.num_scheduled_tokens,
            block_table_after=tuple(s.block_table),
            new_token_ids=tuple(s.token_ids[before.num_tokens :]),
            finish_reason=s.finish_reason.value if s.finish_reason else None,
            request_id=s.request_id,
            parent_id=s.parent_id,
            beam_width=s.group.params.beam_width if s.group else 0,
        )


def counters(s: Sequence) -> Scheduled:
    return Scheduled(
        s.num_tokens, s.num_cached_tokens, s.num_scheduled_tokens, tuple(s.block_table)
    )


# The watch of an engine without hooks: snapshots and publishes nothing.
NO_WATCH = StepWatch(0, {}, [], QueueOrder((), (), 0), {})


def record_pool(bm: BlockManager) -> BlockPool:
    return BlockPool(bm.block_size, tuple(bm.ref_counts), tuple(bm.hashes), tuple(bm.free_blocks))


def record_inputs(
    seqs: list[Sequence], inputs: StepInputs | None, scheduled: dict[int, Scheduled]
) -> InputsRecord:
    if inputs is None:
        return NO_INPUTS
    return InputsRecord(
        seq_ids=tuple(s.seq_id for s in seqs),
        input_ids=tuple(inputs.input_ids.tolist()),
        positions=tuple(inputs.positions.tolist()),
        query_start_loc=tuple(inputs.query_start_loc.tolist()),
        seq_lens=tuple(inputs.seq_lens.tolist()),
        slot_mapping=tuple(inputs.slot_mapping.tolist()),
        # unpadded, as the step saw them
        block_tables=tuple(scheduled[s.seq_id].block_table for s in seqs),
        logits_indices=tuple(inputs.logits_indices.tolist()),
        discard=tuple(inputs.discard.tolist()),
    )
