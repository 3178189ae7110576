"""Our names beside vLLM v1's and nano-vllm's, with the file where each lives upstream.

Shown on the replay's `?` screen and written out in lessons/README.md (a test keeps the two
in step). Upstream paths: vLLM v1 (vllm-project/vllm, 2025, the v1 engine) and nano-vllm
(GeeeekExplorer/nano-vllm).
"""

from __future__ import annotations

from typing import NamedTuple


class Term(NamedTuple):
    ours: str  # the name in nanoengine
    vllm: str  # vLLM v1's name and file
    nano_vllm: str  # nano-vllm's name and file
    note: str = ""  # where the meanings differ


GLOSSARY: tuple[Term, ...] = (
    Term(
        "Sequence (nanoengine/sequence.py)",
        "Request (vllm/v1/request.py)",
        "Sequence (nanovllm/engine/sequence.py)",
    ),
    Term(
        "SequenceStatus WAITING / RUNNING / FINISHED",
        "RequestStatus (vllm/v1/request.py): also PREEMPTED, FINISHED_* per reason",
        "SequenceStatus (nanovllm/engine/sequence.py)",
    ),
    Term(
        "num_cached_tokens: tokens whose KV is in the cache (the progress counter)",
        "num_computed_tokens (vllm/v1/request.py)",
        "num_cached_tokens (nanovllm/engine/sequence.py)",
        "vLLM v1's own num_cached_tokens means something else: the prompt tokens served by a prefix-cache hit",
    ),
    Term(
        "num_scheduled_tokens: tokens computed for a sequence this step",
        "SchedulerOutput.num_scheduled_tokens, a dict by request id (vllm/v1/core/sched/output.py)",
        "num_scheduled_tokens (nanovllm/engine/sequence.py)",
    ),
    Term(
        "num_completion_tokens",
        "num_output_tokens (vllm/v1/request.py)",
        "num_completion_tokens (nanovllm/engine/sequence.py)",
    ),
    Term(
        "block_table: logical block i → physical block",
        "KVCacheManager.get_block_ids (scheduler side); BlockTable (vllm/v1/worker/block_table.py)",
        "Sequence.block_table (nanovllm/engine/sequence.py)",
    ),
    Term(
        "BlockManager: ref_counts, free_blocks (nanoengine/block_manager.py)",
        "KVCacheManager (vllm/v1/core/kv_cache_manager.py) over BlockPool (vllm/v1/core/block_pool.py); "
        "KVCacheBlock.ref_cnt, FreeKVCacheBlockQueue (vllm/v1/core/kv_cache_utils.py)",
        "BlockManager: Block.ref_count, free_block_ids (nanovllm/engine/block_manager.py)",
    ),
    Term(
        "compute_block_hash, hash_to_block",
        "hash_block_tokens (vllm/v1/core/kv_cache_utils.py); BlockPool.cached_block_hash_to_block",
        "BlockManager.compute_hash, hash_to_block_id",
        "vLLM v1 maps a hash to several blocks (a duplicate, such as the last block of a full hit, is "
        "tracked); ours keeps one block per hash and leaves the duplicate unhashed: one name, one block, "
        "and the same hits",
    ),
    Term(
        "BlockManager.register_full_blocks: when a sequence is scheduled, so a later admission in the same "
        "step hits the blocks the step computes",
        "KVCacheManager.allocate_slots → cache_blocks (vllm/v1/core/kv_cache_manager.py)",
        "BlockManager.allocate (a prompt's full blocks, at admission) and may_append (a block filled by decoding)",
    ),
    Term(
        "BlockManager.find_cached_prefix",
        "KVCacheManager.get_computed_blocks (vllm/v1/core/kv_cache_manager.py)",
        "inside BlockManager.can_allocate / allocate",
    ),
    Term(
        "Scheduler.schedule, try_admit (nanoengine/scheduler.py)",
        "Scheduler.schedule (vllm/v1/core/sched/scheduler.py): running loop, then waiting loop",
        "Scheduler.schedule (nanovllm/engine/scheduler.py): prefill pass or decode pass",
    ),
    Term(
        "choose_victim, Scheduler.make_room, preempt",
        "in Scheduler.schedule: KVCacheManager.allocate_slots fails → self.running.pop() → Scheduler._preempt_request",
        "Scheduler.schedule → Scheduler.preempt(self.running.pop())",
    ),
    Term(
        "Scheduler.postprocess, check_stop",
        "Scheduler.update_from_output; check_stop (vllm/v1/core/sched/utils.py)",
        "Scheduler.postprocess (stop test inline)",
    ),
    Term(
        "prepare_inputs, compute_slot_mapping (nanoengine/model_runner.py)",
        "GPUModelRunner._prepare_inputs (vllm/v1/worker/gpu_model_runner.py); BlockTable.compute_slot_mapping",
        "ModelRunner.prepare_prefill / prepare_decode (nanovllm/engine/model_runner.py)",
    ),
    Term(
        "query_start_loc, seq_lens, positions, slot_mapping, logits_indices",
        "the same names, in the attention metadata (vllm/v1/attention/backends/)",
        "cu_seqlens_q, cu_seqlens_k / context_lens, positions, slot_mapping, "
        "cu_seqlens_q[1:] - 1 (nanovllm/utils/context.py, nanovllm/layers/embed_head.py)",
    ),
    Term(
        "sample, sample_one (nanoengine/sampler.py)",
        "Sampler (vllm/v1/sample/sampler.py), TopKTopPSampler (vllm/v1/sample/ops/topk_topp_sampler.py)",
        "Sampler (nanovllm/layers/sampler.py): temperature only",
    ),
    Term(
        "LLMEngine.step (nanoengine/engine.py)",
        "EngineCore.step (vllm/v1/engine/core.py)",
        "LLMEngine.step (nanovllm/engine/llm_engine.py)",
    ),
)


def function_names(ours: str) -> list[str]:
    """The engine functions a term names, qualified: 'Scheduler.schedule, try_admit (...)' ->
    ['Scheduler.schedule', 'Scheduler.try_admit'] (a bare name takes the class before it)."""
    names, owner = [], ""
    for part in ours.split(":")[0].split("(")[0].split(","):
        name = part.strip().split(" ")[0]
        if "." in name:
            owner = name.rsplit(".", 1)[0]
        elif owner:
            name = f"{owner}.{name}"
        names.append(name)
    return names


def vllm_counterpart(qualname: str) -> str:
    """vLLM v1's name and file for one of our functions ('Scheduler.preempt'), or '' if the glossary
    has none."""
    for term in GLOSSARY:
        names = function_names(term.ours)
        if qualname in names or ("." not in qualname and any(n.endswith(f".{qualname}") for n in names)):
            return term.vllm
    return ""
