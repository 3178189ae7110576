"""Flatten a scheduled batch into step inputs, run the model, sample."""

from __future__ import annotations

import itertools
import mmap
from dataclasses import dataclass

import torch

from nanoengine.attention import AttentionMetadata
from nanoengine.config import EngineConfig
from nanoengine.loading.engine_parts import EngineParts, pick_backend
from nanoengine.logits_processors import process_logits
from nanoengine.logprobs import Sampled, prompt_logprobs, sampled_logprobs
from nanoengine.model import head_dim_of
from nanoengine.sampler import sample
from nanoengine.sequence import Sequence


def compute_slot_mapping(
    block_tables: torch.Tensor, seq_index: torch.Tensor, positions: torch.Tensor, block_size: int
) -> torch.Tensor:
    """Where each token's K/V goes:
    slot = block_table[pos // block_size] * block_size + pos % block_size."""
    return block_tables[seq_index, positions // block_size] * block_size + positions % block_size


@dataclass(slots=True)
class StepInputs:
    input_ids: torch.Tensor  # [T] every scheduled token, sequences back to back
    positions: torch.Tensor  # [T] each token's position in its sequence
    query_start_loc: torch.Tensor  # [B+1] where each sequence's tokens start in input_ids
    seq_lens: torch.Tensor  # [B] cached + scheduled tokens
    slot_mapping: torch.Tensor  # [T]
    block_tables: torch.Tensor  # [B, max_blocks], padded with 0
    logits_indices: torch.Tensor  # [B] each sequence's last scheduled token
    discard: torch.Tensor  # [B] True: mid-prefill, its sampled token is thrown away


def prepare_inputs(seqs: list[Sequence], block_size: int) -> StepInputs:
    num_scheduled = torch.tensor([s.num_scheduled_tokens for s in seqs])
    num_cached = torch.tensor([s.num_cached_tokens for s in seqs])
    num_tokens = torch.tensor([s.num_tokens for s in seqs])
    # each sequence's scheduled tokens (the first num_scheduled after its cached ones), back to back
    chunks = [s.token_ids[s.num_cached_tokens :][: s.num_scheduled_tokens] for s in seqs]
    input_ids = torch.tensor(list(itertools.chain.from_iterable(chunks)))
    query_start_loc = torch.zeros(len(seqs) + 1, dtype=torch.int64)
    torch.cumsum(num_scheduled, 0, out=query_start_loc[1:])
    seq_index = torch.repeat_interleave(torch.arange(len(seqs)), num_scheduled)
    # position = tokens already cached + offset inside this step's chunk
    positions = torch.arange(len(input_ids)) - query_start_loc[seq_index] + num_cached[seq_index]
    max_blocks = max(len(s.block_table) for s in seqs)
    padded = [s.block_table + [0] * (max_blocks - len(s.block_table)) for s in seqs]
    block_tables = torch.tensor(padded)
    seq_lens = num_cached + num_scheduled
    return StepInputs(
        input_ids=input_ids,
        positions=positions,
        query_start_loc=query_start_loc,
        seq_lens=seq_lens,
        slot_mapping=compute_slot_mapping(block_tables, seq_index, positions, block_size),
        block_tables=block_tables,
        logits_indices=query_start_loc[1:] - 1,
        discard=seq_lens < num_tokens,
    )


class ModelRunner:
    def __init__(self, parts: EngineParts, config: EngineConfig):
        assert config.num_kv_blocks is not None, "the engine sizes the pool before the runner"
        self.model = model = parts.model
        self.block_size = config.block_size
        self.device = device = parts.device
        self.eos_token_ids = parts.eos_token_ids  # min_tokens masks them
        self.attend = pick_backend(config.attention_backend, device, self.block_size)
        self.sampler = sample  # held, as vLLM holds its Sampler: a faster one may replace it
        num_kv_heads, head_dim = model.config.num_key_value_heads, head_dim_of(model.config)
        one = self.attend.cache_shape(config.num_kv_blocks, self.block_size, num_kv_heads, head_dim)
        shape = (len(model.model.layers), 2, *one)  # K and V of every layer
        dtype = parts.kv_dtype  # the model's, unless config.kv_cache_dtype says otherwise
        if device.type == "cpu":  # zeros the OS maps page by page as they are first written
            # (torch.zeros writes the whole pool up front: 1-3 s for 1 GiB, docs/benchmarks.md)
            size = torch.Size(shape).numel() * dtype.itemsize
            pool = torch.frombuffer(mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE), dtype=dtype)
        else:
            pool = torch.zeros(shape, dtype=dtype, device=device)
        self.kv_caches = list(pool.view(shape))

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: each (source, copy) block's K and V, in every layer."""
        if pairs:
            sources, copies = torch.tensor(pairs, device=self.device).T
            for kv in self.kv_caches:  # [2, num_kv_blocks, ...] in every backend
                kv.index_copy_(1, copies, kv.index_select(1, sources))

    def build_metadata(self, inputs: StepInputs) -> AttentionMetadata:
        q_lens = (inputs.query_start_loc[1:] - inputs.query_start_loc[:-1]).tolist()
        seq_lens = inputs.seq_lens.tolist()
        starts = inputs.query_start_loc.tolist()
        return AttentionMetadata(
            slot_mapping=inputs.slot_mapping.to(self.device),
            query_start_loc=inputs.query_start_loc.to(self.device, torch.int32),
            seq_lens=inputs.seq_lens.to(self.device, torch.int32),
            block_tables=inputs.block_tables.to(self.device, torch.int32),
            max_query_len=max(q_lens),
            max_seq_len=max(seq_lens),
            decodes=[(i, starts[i], seq_lens[i]) for i, n in enumerate(q_lens) if n == 1],
            prefills=[(i, starts[i], n, seq_lens[i]) for i, n in enumerate(q_lens) if n != 1],
        )

    @torch.inference_mode()
    def run(self, seqs: list[Sequence], inputs: StepInputs) -> list[Sampled]:
        """Forward the flat batch, compute logits only at logits_indices, sample one token per
        sequence (with the logprobs it asked for)."""
        meta = self.build_metadata(inputs)
        input_ids = inputs.input_ids.to(self.device)
        positions = inputs.positions.to(self.device)
        hidden = self.model(input_ids, positions, self.kv_caches, meta, self.attend)  # [T, hidden]
        logits = self.model.compute_logits(hidden[inputs.logits_indices.to(self.device)])  # [B, V]
        wants_logprobs = any(s.params.logprobs is not None for s in seqs)
        logprobs = logits.float().log_softmax(-1) if wants_logprobs else None  # raw: before the
        logits = process_logits(logits, seqs, self.eos_token_ids)  # sampling parameters' changes
        token_ids = self.sampler(logits, [s.params for s in seqs], [s.num_tokens for s in seqs])
        results = sampled_logprobs(logprobs, seqs, token_ids, inputs.discard.tolist())
        for i, seq in enumerate(seqs):
            if seq.params.prompt_logprobs is not None and seq.is_prefilling:
                start, end = inputs.query_start_loc[i : i + 2].tolist()
                chunk = self.model.compute_logits(hidden[start:end])  # [num_scheduled, V]
                results[i].prompt_logprobs = prompt_logprobs(chunk, seq)
        return results
