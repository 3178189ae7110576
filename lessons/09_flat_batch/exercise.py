"""Lesson 9: flattening a batch. Write prepare_inputs.

Check it:  nanoengine lesson check 9
Watch it:  nanoengine lesson trace 9
"""

from __future__ import annotations

import itertools

import torch

from nanoengine.model_runner import StepInputs, compute_slot_mapping
from nanoengine.sequence import Sequence


def prepare_inputs(seqs: list[Sequence], block_size: int) -> StepInputs:
    """Flatten the scheduled sequences (in batch order) into one step's model
    inputs.

    Each seq computes seq.token_ids[seq.num_cached_tokens :
    seq.num_cached_tokens + seq.num_scheduled_tokens]. Return
    StepInputs(input_ids, positions, query_start_loc, seq_lens, slot_mapping,
    block_tables, logits_indices, discard): int64 tensors, discard a bool
    tensor. The README defines each one.
    """
    # TODO: build the eight tensors. block_tables pads each seq.block_table with
    #       0 to the longest.
    raise NotImplementedError("prepare_inputs is not written yet")
