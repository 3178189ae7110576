"""The flash-attn contract, checked on CPU.

flash-attn cannot be installed here (CUDA only), so `flash_attn.flash_attn_varlen_func` is replaced,
inside these tests only, by a pure-torch stand-in that implements its documented paged semantics
and refuses any call the real kernel would refuse or misread:

    q              [total_q, num_heads, head_dim], contiguous last dim
    k, v           paged caches [num_blocks, page_block_size, num_kv_heads, head_dim],
                   page_block_size a multiple of 256, num_heads divisible by num_kv_heads (GQA/MQA)
    cu_seqlens_q   [batch + 1] int32, 0 first, non-decreasing, last = total_q
    cu_seqlens_k   [batch + 1] int32, the same for each sequence's key length (cached + new tokens)
    max_seqlen_q/k at least every sequence's query / key length
    block_table    [batch, max_blocks] int32: sequence b's keys are its blocks' pages, in order
    causal=True    aligned to the bottom-right: query i of a sequence with lq queries and lk keys
                   sees keys 0 .. i + lk - lq
    dtype          fp16 / bf16 (fp32 only where a test lifts that, so it can match HF's fp32 greedy tokens)

This checks our integration (layout, dtypes, cumulative lengths, masking) - not the kernel.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoengine import LLM, SamplingParams
from nanoengine.attention import FlashAttention, TorchAttention
from nanoengine.model_runner import ModelRunner, StepInputs, compute_slot_mapping

PAGE = 256  # flash-attn's paged kernel needs page_block_size % 256 == 0


class ContractError(ValueError):
    pass


def require(ok: bool, what: str) -> None:
    if not ok:
        raise ContractError(what)


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
    *,
    allow_fp32: bool = False,
):
    """The stand-in: flash-attn 2's flash_attn_varlen_func with a block_table, in plain torch."""
    dtypes = (torch.float16, torch.bfloat16) + ((torch.float32,) if allow_fp32 else ())
    require(q.dtype in dtypes, f"q dtype {q.dtype}: flash-attn runs fp16/bf16")
    require(k.dtype == q.dtype and v.dtype == q.dtype, "q, k and v must share a dtype")
    require(q.dim() == 3 and q.stride(-1) == 1, "q must be [total_q, heads, head_dim], last dim contiguous")
    require(block_table is not None, "the engine's caches are paged: block_table is required")
    require(k.dim() == 4 and k.shape == v.shape, "paged k/v must be [num_blocks, page_block_size, kv_heads, dim]")
    require(k.stride(-1) == 1 and v.stride(-1) == 1, "k/v last dim must be contiguous")
    num_blocks, page, num_kv_heads, dim = k.shape
    total_q, num_heads, q_dim = q.shape
    require(page % 256 == 0, f"page_block_size {page} is not a multiple of 256")
    require(q_dim == dim and dim % 8 == 0 and dim <= 256, f"head_dim {q_dim} vs cache {dim}")
    require(num_heads % num_kv_heads == 0, f"{num_heads} query heads, {num_kv_heads} kv heads")
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        require(cu.dtype == torch.int32 and cu.dim() == 1, f"{name} must be 1-d int32, got {cu.dtype}")
        require(int(cu[0]) == 0 and bool((cu[1:] >= cu[:-1]).all()), f"{name} must start at 0 and not decrease")
    batch = len(cu_seqlens_q) - 1
    require(len(cu_seqlens_k) == batch + 1, "cu_seqlens_q and cu_seqlens_k differ in batch size")
    require(int(cu_seqlens_q[-1]) == total_q, f"cu_seqlens_q ends at {int(cu_seqlens_q[-1])}, q has {total_q} rows")
    require(block_table.dtype == torch.int32, f"block_table must be int32, got {block_table.dtype}")
    require(block_table.dim() == 2 and block_table.shape[0] == batch, "block_table must be [batch, max_blocks]")
    require(dropout_p == 0.0 and window_size == (-1, -1) and softcap == 0.0 and alibi_slopes is None, "extras")
    scale = q_dim**-0.5 if softmax_scale is None else softmax_scale
    out = torch.empty_like(q)
    group = num_heads // num_kv_heads
    for b in range(batch):
        q0, q1 = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        lq, lk = q1 - q0, int(cu_seqlens_k[b + 1] - cu_seqlens_k[b])
        require(lq <= max_seqlen_q and lk <= max_seqlen_k, "a sequence is longer than max_seqlen_q/k")
        require(lk <= block_table.shape[1] * page, f"sequence {b}: {lk} keys, block_table row holds fewer")
        require(not causal or lq <= lk, f"sequence {b}: more queries ({lq}) than keys ({lk})")
        blocks = block_table[b, : -(-lk // page)].long()
        require(bool((blocks >= 0).all() and (blocks < num_blocks).all()), f"sequence {b}: block id out of range")
        keys = k[blocks].reshape(-1, num_kv_heads, dim)[:lk].repeat_interleave(group, dim=1).float()
        values = v[blocks].reshape(-1, num_kv_heads, dim)[:lk].repeat_interleave(group, dim=1).float()
        scores = torch.einsum("qhd,khd->hqk", q[q0:q1].float(), keys) * scale
        if causal:
            visible = torch.arange(lk)[None, :] <= torch.arange(lq)[:, None] + (lk - lq)
            scores = scores.masked_fill(~visible, float("-inf"))
        out[q0:q1] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), values).to(q.dtype)
    return out


def install(monkeypatch, allow_fp32: bool = False) -> list[dict]:
    """Put the stand-in in sys.modules as `flash_attn`; returns a log of its calls."""
    calls: list[dict] = []

    def traced(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *args, **kwargs):
        calls.append(
            {
                "q_lens": cu_seqlens_q.diff().tolist(),
                "k_lens": cu_seqlens_k.diff().tolist(),
                "max_seqlen_q": max_seqlen_q,
                "dtype": q.dtype,
            }
        )
        return flash_attn_varlen_func(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *args, **kwargs, allow_fp32=allow_fp32
        )

    module = types.ModuleType("flash_attn")
    module.flash_attn_varlen_func = traced  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flash_attn", module)
    return calls


# ---- end to end: the FlashAttention backend through the golden comparison ---------------------------
def test_engine_picks_flash_only_with_the_module_and_a_256_block(monkeypatch):
    with pytest.raises(ValueError, match="needs flash-attn"):
        monkeypatch.setitem(sys.modules, "flash_attn", None)  # an import that fails
        LLM("tiny", attention_backend="flash", block_size=PAGE)
    install(monkeypatch)
    assert isinstance(LLM("tiny", attention_backend="flash", block_size=PAGE).engine.runner.attend, FlashAttention)
    with pytest.raises(ValueError, match="multiple of 256"):
        LLM("tiny", attention_backend="flash", block_size=16)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_flash_backend_matches_hf_greedy(family, monkeypatch, tmp_path, one_torch_thread):
    from test_golden import hf_greedy, save_tiny_checkpoint

    calls = install(monkeypatch, allow_fp32=True)  # fp32 on CPU, so greedy tokens can equal HF's
    hf = save_tiny_checkpoint(family, tmp_path, max_position_embeddings=1024)
    g = torch.Generator().manual_seed(1)
    shared = torch.randint(3, 300, (300,), generator=g).tolist()
    # Up to three pages per sequence and a 64-token budget: chunked prefill, so a chunk's queries end
    # at the bottom right of a longer key range, beside single-token decodes.
    prompts = [torch.randint(3, 300, (n,), generator=g).tolist() for n in (1, 17, 260, 530)] + [shared + [5, 6]]
    llm = LLM(str(tmp_path), attention_backend="flash", block_size=PAGE, max_num_batched_tokens=64)
    assert isinstance(llm.engine.runner.attend, FlashAttention)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    outs = llm.generate(prompts, params)
    # Then the shared 300-token prefix again: its first page comes from the prefix cache.
    num_calls = len(calls)
    outs += llm.generate([shared + [7]], params)
    prompts.append(shared + [7])
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == hf_greedy(hf, prompt, 24), f"{family}, prompt of {len(prompt)} tokens"
    assert any(c["max_seqlen_q"] > 1 for c in calls) and any(c["max_seqlen_q"] == 1 for c in calls)
    assert any(q > 1 and k > q for c in calls for q, k in zip(c["q_lens"], c["k_lens"]))  # a later chunk
    assert calls[num_calls]["q_lens"] == [301 - PAGE] and calls[num_calls]["k_lens"] == [301]  # the cache hit


@pytest.mark.parametrize("backend", ["torch", "flash"])
def test_every_kv_of_a_layer_is_written_before_attention_reads_it(backend, monkeypatch, one_torch_thread):
    """A prefix hit on a block computed earlier in the same step (vLLM v1's rule) reads K/V that the
    same forward writes: each layer must write the whole batch's K/V before any sequence attends."""
    install(monkeypatch, allow_fp32=True)
    page = PAGE if backend == "flash" else 4
    prompt = torch.randint(3, 200, (page + 3,), generator=torch.Generator().manual_seed(3)).tolist()
    llm = LLM("tiny", attention_backend=backend, block_size=page, max_num_batched_tokens=4 * page)
    attend, log = llm.engine.runner.attend, []
    write_kv, attend_call = attend.write_kv, type(attend).__call__
    monkeypatch.setattr(attend, "write_kv", lambda *a: (log.append(("write", len(a[-1]))), write_kv(*a))[1])
    monkeypatch.setattr(type(attend), "__call__", lambda self, *a: (log.append(("read", 0)), attend_call(self, *a))[1])
    steps = []
    llm.engine.add_step_hook(steps.append)
    outs = llm.generate([prompt + [7], prompt + [7], prompt], SamplingParams(max_tokens=6, ignore_eos=True))
    assert [s.num_scheduled_tokens for s in steps[0].seqs] == [page + 4, 4, 3]  # two hits on A's first page
    num_layers = len(llm.engine.model.model.layers)
    assert log[: 2 * num_layers] == [("write", page + 11), ("read", 0)] * num_layers  # per layer: all, then read
    assert outs[0].token_ids == outs[1].token_ids  # B read the page A wrote in that step
    alone = LLM("tiny", attention_backend=backend, block_size=page).generate(
        [prompt], SamplingParams(max_tokens=6, ignore_eos=True)
    )
    assert outs[2].token_ids == alone[0].token_ids


@pytest.mark.real_model
def test_flash_backend_matches_hf_greedy_on_smollm2(monkeypatch, one_torch_thread):
    from test_golden import hf_greedy
    from transformers import AutoModelForCausalLM

    from nanoengine.loading.checkpoint import ensure_default_model

    install(monkeypatch, allow_fp32=True)
    prompts = ["What is the capital of France?", "Explain how a paged KV cache works, step by step."]
    llm = LLM("default", attention_backend="flash", block_size=PAGE, max_num_batched_tokens=16)
    outs = llm.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True))
    hf = AutoModelForCausalLM.from_pretrained(ensure_default_model(), dtype=torch.float32).eval()
    for out in outs:
        assert out.token_ids == hf_greedy(hf, out.prompt_token_ids, 16)


def test_flash_backend_runs_in_bf16_as_the_kernel_requires(monkeypatch, one_torch_thread):
    calls = install(monkeypatch)  # strict: fp16/bf16 only, as the real kernel
    llm = LLM("tiny", attention_backend="flash", block_size=PAGE, dtype="bfloat16", max_num_batched_tokens=32)
    outs = llm.generate(["hello there, how are you today?", "hi"], SamplingParams(max_tokens=8, ignore_eos=True))
    assert all(len(o.token_ids) == 8 for o in outs)
    assert calls and {c["dtype"] for c in calls} == {torch.bfloat16}
    out = LLM("tiny", attention_backend="flash", block_size=PAGE, dtype="float32").generate(
        ["hi"], SamplingParams(max_tokens=2)
    )[0]
    # The contract fires inside the step: the engine isolates it as that request's error.
    assert out.finish_reason == "error" and out.error.startswith("ContractError") and "fp16/bf16" in out.error


# ---- the backends side by side on random shapes ----------------------------------------------------
def metadata_for(q_lens: list[int], k_lens: list[int], tables: list[list[int]], block_size: int):
    """AttentionMetadata exactly as the engine's runner builds it for these sequences."""
    runner = object.__new__(ModelRunner)
    runner.block_size, runner.device = block_size, torch.device("cpu")
    num_scheduled, num_cached = torch.tensor(q_lens), torch.tensor(k_lens) - torch.tensor(q_lens)
    query_start_loc = torch.zeros(len(q_lens) + 1, dtype=torch.int64)
    torch.cumsum(num_scheduled, 0, out=query_start_loc[1:])
    seq_index = torch.repeat_interleave(torch.arange(len(q_lens)), num_scheduled)
    positions = torch.arange(int(num_scheduled.sum())) - query_start_loc[seq_index] + num_cached[seq_index]
    width = max(map(len, tables))
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    inputs = StepInputs(
        input_ids=torch.zeros(len(positions), dtype=torch.int64),
        positions=positions,
        query_start_loc=query_start_loc,
        seq_lens=torch.tensor(k_lens),
        slot_mapping=compute_slot_mapping(block_tables, seq_index, positions, block_size),
        block_tables=block_tables,
        logits_indices=query_start_loc[1:] - 1,
        discard=torch.zeros(len(q_lens), dtype=torch.bool),
    )
    return runner.build_metadata(inputs)


def attend_with(backend, q, keys, values, q_lens, k_lens, tables, num_blocks):
    """Write every sequence's keys/values through the backend's own layout, then attend."""
    _, num_kv_heads, dim = keys[0].shape
    shape = backend.cache_shape(num_blocks, PAGE, num_kv_heads, dim)
    kv = torch.zeros(2, *shape, dtype=q.dtype)  # one layer's K and V
    whole = metadata_for(k_lens, k_lens, tables, PAGE)  # every key position, to fill the cache
    backend.write_kv(kv, torch.cat(keys), torch.cat(values), whole.slot_mapping)
    meta = metadata_for(q_lens, k_lens, tables, PAGE)
    return backend(q, kv, meta, dim**-0.5)


@st.composite
def batches(draw):
    num_kv_heads, group = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dim = draw(st.sampled_from([8, 16, 64]))
    k_lens = draw(st.lists(st.integers(1, 3 * PAGE), min_size=1, max_size=4))
    q_lens = [draw(st.sampled_from([1, draw(st.integers(1, k))])) for k in k_lens]
    seed = draw(st.integers(0, 2**16))
    return num_kv_heads, group, dim, q_lens, k_lens, seed


@settings(max_examples=25, deadline=None)
@given(batches())
def test_flash_backend_equals_torch_backend(batch):
    num_kv_heads, group, dim, q_lens, k_lens, seed = batch
    g = torch.Generator().manual_seed(seed)
    num_pages = [-(-k // PAGE) for k in k_lens]
    num_blocks = sum(num_pages) + 2
    ids = (torch.randperm(num_blocks, generator=g) + 0).tolist()  # pages scattered through the pool
    tables, used = [], 0
    for n in num_pages:
        tables.append(ids[used : used + n])
        used += n
    keys = [torch.randn(k, num_kv_heads, dim, generator=g) for k in k_lens]
    values = [torch.randn(k, num_kv_heads, dim, generator=g) for k in k_lens]
    q = torch.randn(sum(q_lens), num_kv_heads * group, dim, generator=g)
    module = types.ModuleType("flash_attn")
    module.flash_attn_varlen_func = lambda *a, **kw: flash_attn_varlen_func(*a, **kw, allow_fp32=True)  # type: ignore[attr-defined]
    saved = sys.modules.get("flash_attn")
    sys.modules["flash_attn"] = module
    try:
        flash = attend_with(FlashAttention(), q, keys, values, q_lens, k_lens, tables, num_blocks)
    finally:
        if saved is None:
            del sys.modules["flash_attn"]
        else:
            sys.modules["flash_attn"] = saved
    ours = attend_with(TorchAttention(), q, keys, values, q_lens, k_lens, tables, num_blocks)
    torch.testing.assert_close(flash, ours, atol=2e-5, rtol=1e-4)


# ---- the stand-in catches integration bugs --------------------------------------------------------
def planted(bug: str):
    """FlashAttention.__call__ with one integration bug planted."""
    import torch.nn.functional as F

    def call(self, q, kv, meta, scale):
        from flash_attn import flash_attn_varlen_func as kernel

        k_cache, v_cache = kv

        cu_seqlens_k = F.pad(meta.seq_lens.cumsum(0, dtype=torch.int32), (1, 0))
        args = dict(
            q=q,
            k=k_cache,
            v=v_cache,
            cu_seqlens_q=meta.query_start_loc,
            cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=meta.max_query_len,
            max_seqlen_k=meta.max_seq_len,
            softmax_scale=scale,
            causal=True,
            block_table=meta.block_tables,
        )
        if bug == "seq_lens for cu_seqlens_k":
            args["cu_seqlens_k"] = meta.seq_lens
        elif bug == "int64 block_table":
            args["block_table"] = meta.block_tables.long()
        elif bug == "head-major cache":
            args["k"], args["v"] = k_cache.permute(2, 0, 1, 3), v_cache.permute(2, 0, 1, 3)
        elif bug == "top-left causal":  # what causal masking without the bottom-right alignment does
            args["causal"] = False
        return kernel(**args)

    return call


@pytest.mark.parametrize(
    "bug", ["seq_lens for cu_seqlens_k", "int64 block_table", "head-major cache", "top-left causal"]
)
def test_contract_catches_a_planted_integration_bug(bug, monkeypatch):
    install(monkeypatch, allow_fp32=True)
    q_lens, k_lens = [1, 40], [300, 300]
    g = torch.Generator().manual_seed(0)
    keys = [torch.randn(k, 2, 16, generator=g) for k in k_lens]
    values = [torch.randn(k, 2, 16, generator=g) for k in k_lens]
    q = torch.randn(sum(q_lens), 4, 16, generator=g)
    tables = [[3, 0], [1, 2]]
    want = attend_with(TorchAttention(), q, keys, values, q_lens, k_lens, tables, 4)
    monkeypatch.setattr(FlashAttention, "__call__", planted(bug))
    try:
        got = attend_with(FlashAttention(), q, keys, values, q_lens, k_lens, tables, 4)
    except (ContractError, RuntimeError):
        return  # refused
    assert not torch.allclose(got, want, atol=1e-3), f"{bug} went unnoticed"
