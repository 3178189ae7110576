"""The immutable record of one engine step, handed to step hooks.

Built only when a hook is registered, so an engine without hooks pays nothing.
Everything is plain ints, strings, tuples and None, so a hook can serialise it as is.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SeqStep:
    """One sequence during one step.

    The middle fields (num_tokens ... block_table) are the values the step inputs were
    built from: after schedule(), before postprocess().
    """
    seq_id: int
    num_prompt_tokens: int
    status_before: str                 # at the start of the step: WAITING / RUNNING
    status_after: str                  # at the end: WAITING / RUNNING / FINISHED
    num_tokens: int
    num_cached_tokens: int
    num_scheduled_tokens: int
    block_table: tuple[int, ...]
    num_tokens_after: int
    num_cached_tokens_after: int
    num_scheduled_tokens_after: int    # 0: nothing is scheduled outside a step
    block_table_after: tuple[int, ...]
    new_token_ids: tuple[int, ...]     # tokens appended this step (0 or 1)
    finish_reason: str | None          # stop / length / abort / ignored, once FINISHED


@dataclass(frozen=True, slots=True)
class StepEvent:
    kind: str      # admitted, prefill_chunk, prefill_done, preempted, finished, prefix_hit
    seq_id: int
    detail: dict   # kind-specific: see docs/trace-format.md


@dataclass(frozen=True, slots=True)
class StepInputs:
    """The flat, unpadded batch the model ran on (see model_runner.prepare_inputs)."""
    seq_ids: tuple[int, ...]           # request order inside the batch
    input_ids: tuple[int, ...]
    positions: tuple[int, ...]
    query_start_loc: tuple[int, ...]   # len = num seqs + 1
    seq_lens: tuple[int, ...]
    slot_mapping: tuple[int, ...]
    block_tables: tuple[tuple[int, ...], ...]
    logits_indices: tuple[int, ...]    # one per sequence: its last scheduled token
    discard: tuple[bool, ...]          # True where the sequence is mid-prefill


@dataclass(frozen=True, slots=True)
class BlockPool:
    """The physical KV blocks at the end of the step."""
    block_size: int
    ref_counts: tuple[int, ...]        # index = physical block id
    hashes: tuple[int | None, ...]     # prefix-cache hash of full, computed blocks
    free_block_ids: tuple[int, ...]    # in eviction order (oldest first)


@dataclass(frozen=True, slots=True)
class StepRecord:
    step: int
    wall_time: float                   # seconds for the whole step
    model_time: float                  # seconds in the model forward + sampling
    seqs: tuple[SeqStep, ...]          # every live sequence, by seq_id
    events: tuple[StepEvent, ...]
    inputs: StepInputs
    pool: BlockPool
