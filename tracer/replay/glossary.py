"""Our names beside vLLM v1's and nano-vllm's, with the file where each lives upstream.

Shown on the replay's `?` screen and written out in lessons/README.md (a test keeps the two
in step). Upstream paths: vLLM v1 (vllm-project/vllm, 2025, the v1 engine) and nano-vllm
(GeeeekExplorer/nano-vllm).
"""

from __future__ import annotations

from typing import NamedTuple

from nanoengine.sequence import EventKind
from tracer.i18n import N_, _


class Term(NamedTuple):
    """The fields with prose are N_-marked: shown(field) gives them in the reader's language."""

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
        N_("RequestStatus (vllm/v1/request.py): also PREEMPTED, FINISHED_* per reason"),
        "SequenceStatus (nanovllm/engine/sequence.py)",
    ),
    Term(
        N_("num_cached_tokens: tokens whose KV is in the cache (the progress counter)"),
        "num_computed_tokens (vllm/v1/request.py)",
        "num_cached_tokens (nanovllm/engine/sequence.py)",
        N_("vLLM v1's own num_cached_tokens means something else: the prompt tokens served by a prefix-cache hit"),
    ),
    Term(
        N_("num_scheduled_tokens: tokens computed for a sequence this step"),
        N_("SchedulerOutput.num_scheduled_tokens, a dict by request id (vllm/v1/core/sched/output.py)"),
        "num_scheduled_tokens (nanovllm/engine/sequence.py)",
    ),
    Term(
        "num_completion_tokens",
        "num_output_tokens (vllm/v1/request.py)",
        "num_completion_tokens (nanovllm/engine/sequence.py)",
    ),
    Term(
        N_("block_table: logical block i → physical block"),
        N_("KVCacheManager.get_block_ids (scheduler side); BlockTable (vllm/v1/worker/block_table.py)"),
        "Sequence.block_table (nanovllm/engine/sequence.py)",
    ),
    Term(
        "BlockManager: ref_counts, free_blocks (nanoengine/block_manager.py)",
        N_(
            "KVCacheManager (vllm/v1/core/kv_cache_manager.py) over BlockPool (vllm/v1/core/block_pool.py); "
            "KVCacheBlock.ref_cnt, FreeKVCacheBlockQueue (vllm/v1/core/kv_cache_utils.py)"
        ),
        "BlockManager: Block.ref_count, free_block_ids (nanovllm/engine/block_manager.py)",
    ),
    Term(
        "compute_block_hash, hash_to_block",
        "hash_block_tokens (vllm/v1/core/kv_cache_utils.py); BlockPool.cached_block_hash_to_block",
        "BlockManager.compute_hash, hash_to_block_id",
        N_(
            "vLLM v1 maps a hash to several blocks (a duplicate, such as the last block of a full hit, is "
            "tracked); ours keeps one block per hash and leaves the duplicate unhashed: one name, one block, "
            "and the same hits"
        ),
    ),
    Term(
        N_(
            "BlockManager.register_full_blocks: when a sequence is scheduled, so a later admission in the same "
            "step hits the blocks the step computes"
        ),
        "KVCacheManager.allocate_slots → cache_blocks (vllm/v1/core/kv_cache_manager.py)",
        N_("BlockManager.allocate (a prompt's full blocks, at admission) and may_append (a block filled by decoding)"),
    ),
    Term(
        "BlockManager.find_cached_prefix",
        "KVCacheManager.get_computed_blocks (vllm/v1/core/kv_cache_manager.py)",
        N_("inside BlockManager.can_allocate / allocate"),
    ),
    Term(
        "Scheduler.schedule, schedule_unit, try_admit (nanoengine/scheduler.py)",
        N_("Scheduler.schedule (vllm/v1/core/sched/scheduler.py): running loop, then waiting loop"),
        N_("Scheduler.schedule (nanovllm/engine/scheduler.py): prefill pass or decode pass"),
    ),
    Term(
        "choose_victim, Scheduler.make_room, preempt, recompute_later",
        N_(
            "in Scheduler.schedule: KVCacheManager.allocate_slots fails → self.running.pop() → Scheduler._preempt_request"
        ),
        "Scheduler.schedule → Scheduler.preempt(self.running.pop())",
    ),
    Term(
        "Scheduler.postprocess, check_stop",
        "Scheduler.update_from_output; check_stop (vllm/v1/core/sched/utils.py)",
        N_("Scheduler.postprocess (stop test inline)"),
    ),
    Term(
        "prepare_inputs, compute_slot_mapping (nanoengine/model_runner.py)",
        "GPUModelRunner._prepare_inputs (vllm/v1/worker/gpu_model_runner.py); BlockTable.compute_slot_mapping",
        "ModelRunner.prepare_prefill / prepare_decode (nanovllm/engine/model_runner.py)",
    ),
    Term(
        "query_start_loc, seq_lens, positions, slot_mapping, logits_indices",
        N_("the same names, in the attention metadata (vllm/v1/attention/backends/)"),
        "cu_seqlens_q, cu_seqlens_k / context_lens, positions, slot_mapping, "
        "cu_seqlens_q[1:] - 1 (nanovllm/utils/context.py, nanovllm/layers/embed_head.py)",
    ),
    Term(
        N_(
            "KV pool: [2 (K, V), num_kv_blocks, kv_heads, block_size, head_dim], a tensor a layer (nanoengine/attention.py)"
        ),
        N_(
            "the CPU backend's [num_blocks, num_kv_heads, block_size, 2 * head_size], each token's K and V side by side "
            "(vllm/v1/attention/backends/cpu_attn.py); flash-attn's [2, num_blocks, block_size, num_kv_heads, head_size]"
        ),
        "[2, num_layers, num_blocks, block_size, num_kv_heads, head_dim] (nanovllm/engine/model_runner.py)",
        N_(
            "blocks, then heads, then rows, as vLLM's CPU backend orders them; K and V in two planes, as flash-attn keeps them"
        ),
    ),
    Term(
        "sample, sample_one (nanoengine/sampler.py)",
        "Sampler (vllm/v1/sample/sampler.py), TopKTopPSampler (vllm/v1/sample/ops/topk_topp_sampler.py)",
        N_("Sampler (nanovllm/layers/sampler.py): temperature only"),
    ),
    Term(
        N_(
            "SamplingParams(n): one request, n sequences (LLMEngine.add_request in nanoengine/engine.py fans "
            "it out; sample i draws with seed + i)"
        ),
        N_(
            "ParentRequest.get_child_info (vllm/v1/engine/parallel_sampling.py): the front end adds n child "
            "requests, ids f\"{i}_{request_id}\", seed + i"
        ),
        N_("none: SamplingParams has no n (nanovllm/sampling_params.py)"),
        N_(
            "the same schedules, step for step (tracer/vllm/traces/parallel-sampling.jsonl): vLLM fans n out "
            "in its front end, nanoengine inside its engine; either way the samples share the prompt's full "
            "blocks through the prefix cache, in the same step too"
        ),
    ),
    Term(
        N_("SamplingParams(logprobs, prompt_logprobs): the raw model's log-probabilities (nanoengine/logprobs.py)"),
        N_("Sampler.compute_logprobs, gather_logprobs (vllm/v1/sample/sampler.py); ModelConfig.logprobs_mode"),
        N_("none"),
        N_(
            "ours are vLLM's default logprobs_mode, raw_logprobs: the model's own, before temperature, "
            "penalties or top-k/top-p"
        ),
    ),
    Term(
        N_(
            "BeamSearchParams, BeamGroup (nanoengine/beam_search.py): beam search in the engine, vLLM v0's "
            "design; a beam chosen again is forked and shares its parent's blocks (LLMEngine.advance_beams, "
            "BlockManager.fork), a beam about to write into a shared block gets its own copy (copy-on-write: "
            "BlockManager.copy_on_write, SchedulerOutput.blocks_to_copy); a preempted beam search restarts "
            "from its prompt; swap preemption is not built (the engine's line budget)"
        ),
        N_(
            "vLLM v0 kept a beam search's beams in a SequenceGroup inside the scheduler (fork, "
            "blocks_to_copy), and could only swap a beam group out (it asserted on recompute); vLLM v1 moved "
            "beam search out of the scheduler, into LLM.beam_search "
            "(vllm/entrypoints/generate/beam_search/offline.py), where each step's beams are new requests "
            "sharing blocks through the prefix cache: v1 needs no copy-on-write, and preempts by recompute only"
        ),
        N_("none: no beam search, and recompute only"),
    ),
    Term(
        N_(
            "kv_cache_dtype: the KV pool's numbers, auto (the model's dtype) or bfloat16 (EngineConfig; "
            "TorchAttention.write_kv rounds each K/V once, as it writes it)"
        ),
        N_(
            "CacheConfig.cache_dtype, --kv-cache-dtype (vllm/config/cache.py): auto, bfloat16 and fp8 "
            "kinds; the attention backends read it"
        ),
        N_("none: the pool takes the model's dtype (nanovllm/engine/model_runner.py)"),
        N_(
            "a float32 model's bfloat16 cache holds twice the tokens and halves attention's reads, but its "
            "rounded K/V change the numbers: Hugging Face's exact tokens hold with auto only"
        ),
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
    has none; in the reader's language."""
    for term in GLOSSARY:
        names = function_names(term.ours)
        if qualname in names or ("." not in qualname and any(n.endswith(f".{qualname}") for n in names)):
            return _(term.vllm)
    return ""


class Concept(NamedTuple):
    """A word the replay, the lessons and the seed articles use, beside the identifier that holds it."""

    identifier: str  # as the code spells it: never translated
    term: str  # the word for it (the Chinese catalog gives the term the seed articles use)
    meaning: str  # in a sentence or two


CONCEPTS: tuple[Concept, ...] = (
    Concept("Sequence", N_("sequence (one request)"), N_("a prompt and the tokens generated for it so far")),
    Concept(
        "SequenceStatus",
        N_("status"),
        N_("WAITING (in the waiting queue), RUNNING (scheduled each step), FINISHED; the names stay English"),
    ),
    Concept("num_tokens", N_("number of tokens"), N_("prompt plus completion tokens so far")),
    Concept(
        "num_cached_tokens",
        N_("computed tokens"),
        N_("how many of the sequence's tokens already have their K/V in the cache: the progress counter"),
    ),
    Concept(
        "num_scheduled_tokens",
        N_("tokens scheduled this step"),
        N_("how many tokens of the sequence the model computes in this step (0 when not scheduled)"),
    ),
    Concept(
        "block_table",
        N_("block table"),
        N_("logical block i of a sequence → the physical block of the pool that holds its K/V"),
    ),
    Concept(
        "slot_mapping",
        N_("slot mapping"),
        N_("for each token of the step, the KV slot its K/V is written to: block × block_size + offset"),
    ),
    Concept(
        "ref_counts",
        N_("reference count"),
        N_("how many sequences hold a block; a shared prefix block has more than one, a free block 0"),
    ),
    Concept(
        "free_blocks",
        N_("block pool, free list"),
        N_("the blocks no sequence holds; a new block is taken from the front, a freed one goes to the back"),
    ),
    Concept(
        "prefix caching",
        N_("prefix caching"),
        N_(
            "a full block is found again by the hash of its tokens and everything before them, so an equal "
            "prefix is not computed twice"
        ),
    ),
    Concept(
        EventKind.PREFIX_HIT.value,
        N_("prefix hit"),
        N_("an admission reuses cached blocks for the start of its prompt and skips computing them"),
    ),
    Concept(
        "prefill / decode",
        N_("prefill / decode"),
        N_("prefill computes the prompt's tokens (many per step); decode computes one new token per step"),
    ),
    Concept(
        "chunked prefill",
        N_("chunked prefill"),
        N_("a prompt longer than the token budget is prefilled over several steps, one chunk each"),
    ),
    Concept(
        "max_num_batched_tokens",
        N_("token budget"),
        N_("the most tokens one step computes, over all its sequences"),
    ),
    Concept(
        "preempt",
        N_("preemption (recompute)"),
        N_(
            "when a running sequence needs a block and none is free, the newest running sequence gives up "
            "its blocks and goes back to the head of the waiting queue; its tokens are computed again later"
        ),
    ),
    Concept(
        "BeamSearchParams(beam_width)",
        N_("beam search, beam"),
        N_(
            "a request that keeps its beam_width likeliest continuations (beams) alive: each step every beam's "
            "candidates are ranked together, the best beam_width live on and a beam none of whose candidates "
            "made it is pruned (marked ✂)"
        ),
    ),
    Concept(
        "fork, parent_id",
        N_("fork"),
        N_(
            "a beam chosen twice becomes two: the new beam (its parent_id the old one) shares every block of its parent"
        ),
    ),
    Concept(
        "copy_on_write, blocks_to_copy",
        N_("copy-on-write"),
        N_(
            "a beam about to write into a block other beams hold (ref count > 1) gets a fresh block, and the "
            "runner copies the shared block's K/V into it before the forward (marked ⧉)"
        ),
    ),
    Concept(
        "waiting / running",
        N_("waiting queue / running queue"),
        N_("requests not yet admitted (the head goes first) / requests scheduled every step"),
    ),
    Concept(
        "query_start_loc, positions, seq_lens",
        N_("query start locations, positions, sequence lengths"),
        N_(
            "the flat batch: where each sequence's tokens start, each token's position in its sequence, and "
            "how many tokens each sequence attends to"
        ),
    ),
    Concept(
        "logits_indices",
        N_("logits indices"),
        N_("the row of each sequence's last scheduled token: the only logits sampled from"),
    ),
    Concept(
        "invariant",
        N_("invariant, violation"),
        N_("a rule every step must keep (nanoengine check); a step that breaks one shows a violation, marked ✗"),
    ),
)
