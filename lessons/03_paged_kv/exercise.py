"""Lesson 3: paged KV. Write blocks_needed and compute_slot_mapping.

Check it:  nanoengine lesson check 3
Watch it:  nanoengine lesson trace 3
"""

from __future__ import annotations

import torch


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """How many blocks of block_size slots hold num_tokens tokens (the last
    block may be part-full)."""
    # TODO: integer arithmetic only: 0 tokens need 0 blocks, 1..block_size need
    #       1, block_size+1 need 2.
    raise NotImplementedError("blocks_needed is not written yet")


def compute_slot_mapping(
    block_tables: torch.Tensor,
    seq_index: torch.Tensor,
    positions: torch.Tensor,
    block_size: int,
) -> torch.Tensor:
    """The KV slot of every token in the step.

    block_tables: [num_seqs, max_blocks] int tensor, row i = sequence i's block
    table (padded with 0) seq_index:    [T] which row of block_tables each token
    belongs to positions:    [T] each token's position in its sequence Returns a
    [T] int64 tensor: slot = block_table[position // block_size] * block_size +
    position % block_size
    """
    # TODO: look up each token's physical block in its own sequence's row, then
    #       add the offset.
    raise NotImplementedError("compute_slot_mapping is not written yet")
