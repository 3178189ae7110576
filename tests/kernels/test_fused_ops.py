"""The fused small steps (tracer/kernels/fused_ops.c) and the decoder built on them: each step gives
torch's bits (norm, RoPE with the K/V write, SiLU x up), so a whole engine run through the fused
decoder gives the model's own hidden states to the bit, in float32 and bfloat16."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import BUSY_OPTIONS, BUSY_REQUESTS, make_tiny_engine, torch_threads
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file
from transformers import LlamaConfig, Qwen3Config

import nanoengine.attention as attention
from nanoengine.attention import TorchAttention
from nanoengine.beam_search import BeamSearchParams
from nanoengine.engine import LLMEngine
from nanoengine.llm import LLM
from nanoengine.loading.build import build_model
from nanoengine.loading.tiny import tiny_config
from nanoengine.model import CausalLM, RMSNorm, apply_rope
from nanoengine.sampling_params import SamplingParams
from tracer.kernels import decode_layers
from tracer.kernels.build import AVX2_ONLY, has_avx2
from tracer.kernels.choose import build_engine
from tracer.kernels.decode_layers import DecodeLayers
from tracer.kernels.fused_decoder import FusedDecoder, check_step
from tracer.kernels.fused_ops import add_rms_norm, rope_write_kv, silu_and_mul
from tracer.kernels.packed_linear import bf16_kernel_ready
from tracer.kernels.paged_attention import PagedDecodeAttention

DTYPES = st.sampled_from([torch.float32, torch.bfloat16])

needs_bf16_kernel = pytest.mark.skipif(
    not bf16_kernel_ready(), reason="the bfloat16 kernels run on CPUs with AMX or AVX512_BF16"
)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool((a == b).all())


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 40), dim=st.sampled_from([8, 36, 64, 100, 576, 960]), dtype=DTYPES, seed=st.integers(0, 99))
def test_add_rms_norm_is_the_residual_add_and_rmsnorm_to_the_bit(rows, dim, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    x, residual = (torch.randn(rows, dim, generator=gen).mul(3).to(dtype) for _ in range(2))
    norm = RMSNorm(dim, 1e-5).to(dtype)
    norm.weight.data = torch.randn(dim, generator=gen).to(dtype)
    with torch.inference_mode():
        expected_residual = residual + x
        expected = norm(expected_residual)
        ours_residual = residual.clone()
        ours = add_rms_norm(x, ours_residual, norm.weight, norm.eps)
        assert same_bits(ours_residual, expected_residual) and same_bits(ours, expected)
        assert same_bits(add_rms_norm(None, residual, norm.weight, norm.eps), norm(residual))


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 40), width=st.sampled_from([8, 100, 128, 1536]), dtype=DTYPES, seed=st.integers(0, 99))
def test_silu_and_mul_is_torchs_silu_times_up_to_the_bit(rows, width, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    gate_up = (torch.randn(rows, 2 * width, generator=gen) * 8).to(dtype)
    gate_up[0, :4] = torch.tensor([0.0, -120.0, 120.0, 1e-30])  # e^x's clamps, both ways
    gate, up = gate_up.chunk(2, -1)
    assert same_bits(silu_and_mul(gate_up), F.silu(gate) * up)


def rope_case(tokens: int, heads: int, kv_heads: int, dim: int, dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=gen).to(dtype)
    positions = torch.randint(0, 100, (tokens,), generator=gen)
    cos, sin = (torch.randn(100, dim, generator=gen).to(dtype) for _ in range(2))
    num_blocks, block_size = tokens + 2, 4
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens]
    kv = torch.zeros(2, num_blocks, kv_heads, block_size, dim, dtype=dtype)
    return qkv, positions, cos, sin, slots, kv


def torch_rope_write_kv(qkv, positions, cos, sin, slots, kv, heads):
    """What nanoengine/model.py's Attention does between its qkv projection and the attention."""
    q_k, v = qkv.unflatten(-1, (-1, kv.shape[-1])).split([qkv.shape[1] // kv.shape[-1] - kv.shape[2], kv.shape[2]], 1)
    rope = (cos[positions].unsqueeze(1), sin[positions].unsqueeze(1))
    q, k = torch.split(apply_rope(q_k, rope), [heads, kv.shape[2]], 1)
    TorchAttention().write_kv(kv, k, v, slots)
    return q


@settings(max_examples=30, deadline=None)
@given(
    tokens=st.integers(1, 20),
    heads=st.sampled_from([(1, 1), (4, 2), (9, 3)]),
    dim=st.sampled_from([8, 16, 64]),
    dtype=DTYPES,
    seed=st.integers(0, 99),
)
def test_rope_write_kv_rotates_and_writes_as_the_model_does(tokens, heads, dim, dtype, seed):
    qkv, positions, cos, sin, slots, kv = rope_case(tokens, *heads, dim, dtype, seed)
    their_kv = kv.clone()
    q = rope_write_kv(qkv, positions, cos, sin, slots, kv, heads[0])
    assert same_bits(q, torch_rope_write_kv(qkv, positions, cos, sin, slots, their_kv, heads[0]).contiguous())
    assert same_bits(kv, their_kv)


@settings(max_examples=30, deadline=None)
@given(
    tokens=st.integers(1, 20),
    heads=st.sampled_from([(1, 1), (4, 2), (9, 3)]),
    dim=st.sampled_from([8, 64]),
    seed=st.integers(0, 99),
)
def test_rope_write_kv_rounds_into_a_bfloat16_cache_as_torch_does(tokens, heads, dim, seed):
    """kv_cache_dtype="bfloat16" under float32: q stays float32; k is turned in float32 and then
    rounded (to nearest, ties to even), v rounded, as TorchAttention.write_kv's .to() rounds them."""
    qkv, positions, cos, sin, slots, kv = rope_case(tokens, *heads, dim, torch.float32, seed)
    kv = kv.bfloat16()
    their_kv = kv.clone()
    q = rope_write_kv(qkv, positions, cos, sin, slots, kv, heads[0])
    theirs = torch_rope_write_kv(qkv, positions, cos, sin, slots, their_kv, heads[0])
    assert q.dtype == torch.float32 and same_bits(q, theirs.contiguous())
    assert same_bits(kv, their_kv)


def test_the_bfloat16_comparison_catches_a_cache_cut_short_instead_of_rounded():
    """The planted bug: the float32 numbers' low halves dropped (truncation), not rounded."""
    qkv, positions, cos, sin, slots, kv = rope_case(8, 4, 2, 16, torch.float32, 0)
    wide = kv.clone()
    torch_rope_write_kv(qkv, positions, cos, sin, slots, wide, 4)
    cut = (wide.view(torch.int32) & -65536).view(torch.float32).bfloat16()  # exact: low bits zero
    ours = kv.bfloat16()
    rope_write_kv(qkv, positions, cos, sin, slots, ours, 4)
    assert same_bits(ours, wide.bfloat16()) and not same_bits(ours, cut)


def test_the_comparison_catches_a_rope_one_position_off():
    """The planted bug: each token turned by its neighbour's angle."""
    qkv, positions, cos, sin, slots, kv = rope_case(6, 4, 2, 16, torch.float32, 0)
    ours = rope_write_kv(qkv, (positions + 1) % 100, cos, sin, slots, kv.clone(), 4)
    assert not same_bits(ours, torch_rope_write_kv(qkv, positions, cos, sin, slots, kv, 4).contiguous())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_norm_and_the_rotary_shared_among_threads_keep_their_bits(dtype):
    """From 8 rows on each thread takes a share of the rows: the same bits as one thread, row by
    row (a share that started one row off would leave rows unwritten or written twice)."""
    results = []
    for threads in (1, 2, 3):
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            gen = torch.Generator().manual_seed(0)
            x, residual = (torch.randn(31, 576, generator=gen).to(dtype) for _ in range(2))
            weight = torch.randn(576, generator=gen).to(dtype)
            normed = add_rms_norm(x, residual, weight, 1e-5)
            qkv, positions, cos, sin, slots, kv = rope_case(31, 9, 3, 64, dtype, 0)
            q = rope_write_kv(qkv, positions, cos, sin, slots, kv, 9)
            results.append((normed, residual, q, kv))
        finally:
            torch.set_num_threads(before)
    one, *others = results
    assert all(same_bits(a, b) for other in others for a, b in zip(one, other))
    assert not same_bits(one[2][1:], one[2][:-1])  # rows differ: a row written twice would show


class HiddenRecorder:
    """Wraps a runner's model; keeps each step's hidden states."""

    def __init__(self, model):
        self.model, self.hidden, self.one_call_steps, self.decode_steps = model, [], [], 0
        self.config = model.config

    def __call__(self, *args):
        self.decode_steps += args[3].max_query_len == 1  # (input_ids, positions, kv_caches, meta, ...)
        out = self.model(*args)
        self.hidden.append(out.clone())
        return out

    def compute_logits(self, hidden):
        return self.model.compute_logits(hidden)


def note_one_call_steps(decoder: FusedDecoder, rows: list[int]) -> None:
    """Each step that takes decode_layers.c's one call appends its row count to rows."""
    run = decoder.one_call.run

    def counted(*args):
        rows.append(len(args[0]))
        return run(*args)

    decoder.one_call.run = counted  # type: ignore[method-assign]


def run_busy(fused: bool, dtype: str, kv_cache_dtype: str = "auto") -> tuple[list, HiddenRecorder]:
    """The busy workload (chunked prefill, preemption, prefix hits), greedy, through the kernel."""
    options = {**BUSY_OPTIONS, "attention_backend": PagedDecodeAttention(), "dtype": dtype}
    engine = make_tiny_engine(**options, kv_cache_dtype=kv_cache_dtype)
    model = FusedDecoder(engine.model) if fused else engine.model
    recorder = engine.runner.model = HiddenRecorder(model)  # type: ignore[assignment]
    if fused:
        note_one_call_steps(model, recorder.one_call_steps)
    ids, step = [], 0
    while step == 0 or engine.has_unfinished():
        for prompt, max_tokens, arrival in BUSY_REQUESTS:
            if arrival == step:
                params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
                ids.append(engine.add_request(prompt, params))
        engine.step()
        step += 1
        assert step < 200
    return [engine.collect(i).outputs[0].token_ids for i in ids], recorder


@pytest.mark.parametrize("dtype, kv_cache_dtype", [("float32", "auto"), ("bfloat16", "auto"), ("float32", "bfloat16")])
def test_the_fused_decoder_gives_the_models_hidden_states_to_the_bit(dtype, kv_cache_dtype):
    ours, our_recorder = run_busy(True, dtype, kv_cache_dtype)
    theirs, their_recorder = run_busy(False, dtype, kv_cache_dtype)
    assert ours == theirs
    our_hidden, their_hidden = our_recorder.hidden, their_recorder.hidden
    assert len(our_hidden) == len(their_hidden) > 10
    assert all(same_bits(a, b) for a, b in zip(our_hidden, their_hidden))
    if dtype == "float32" or bf16_kernel_ready():  # the few-row linears took part, the LM head's too
        decoder = our_recorder.model
        assert any(decoder.lm_head.agreement.rows.values())
        assert len(our_recorder.one_call_steps) > 5 and max(our_recorder.one_call_steps) > 1
        # every decode step in one call, the first at each row count too (the linears agree first)
        assert len(our_recorder.one_call_steps) == our_recorder.decode_steps
        with torch.inference_mode():
            for rows in (1, 3, 12):
                hidden = our_hidden[-1].repeat(rows, 1)[:rows]
                assert same_bits(decoder.compute_logits(hidden), decoder.model.compute_logits(hidden))


def wide_mlp_folder(folder, intermediate_size: int):
    """The tiny model with a wider MLP, random weights, as a model folder."""
    config = tiny_config()
    config.intermediate_size = intermediate_size
    model = build_model(config, None, 64, torch.device("cpu"), torch.float32)
    config.save_pretrained(folder)
    save_file({k: v.clone() for k, v in model.state_dict().items()}, folder / "model.safetensors")
    return folder


@pytest.mark.parametrize(
    ("dtype", "build"),
    [
        ("float32", "native"),
        pytest.param("bfloat16", "native", marks=needs_bf16_kernel),
        pytest.param("float32", "avx2", marks=pytest.mark.skipif(not has_avx2(), reason="the AVX2 build needs AVX2")),
    ],
)
def test_a_few_rows_read_whole_blocks_side_by_side_to_the_bit(tmp_path, monkeypatch, dtype, build):
    """Up to four rows, the few-row linears read several of a thread's whole blocks of 64 outputs
    side by side (packed_gemv.c: few_rows_runs, with AVX2 two at a time, two_block_runs;
    decode_layers.c: gate_up_silu_few_rows, each block's gate and up together). An MLP of
    11 blocks on 2 threads gives each thread five whole blocks, in runs of unequal length, and half
    of the sixth, which it reads alone. Four requests that stop one after the other decode 4, 3, 2
    and then 1 row a step, each step in one call: the model's hidden states to the bit; also with
    the AVX2 code on a CPU with AVX-512."""
    if build == "avx2":
        avx2_build = decode_layers.decode_layers_library(decode_layers.SOURCE, AVX2_ONLY)
        monkeypatch.setattr(decode_layers, "decode_layers_library", lambda: avx2_build)
    folder = wide_mlp_folder(tmp_path / "wide", intermediate_size=11 * 64)
    hidden, one_call_steps = [], []
    for fused in (True, False):
        engine = LLMEngine(str(folder), attention_backend=PagedDecodeAttention(), dtype=dtype)
        model = FusedDecoder(engine.model) if fused else engine.model
        recorder = engine.runner.model = HiddenRecorder(model)  # type: ignore[assignment]
        if fused:
            note_one_call_steps(model, one_call_steps)
        with torch_threads(2):
            for prompt, max_tokens in (("the cat", 3), ("a dog ran", 4), ("sun", 5), ("the end", 7)):
                engine.add_request(prompt, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
            while engine.has_unfinished():
                engine.step()
        hidden.append(recorder.hidden)
    assert one_call_steps == [4, 4, 3, 2, 1, 1]
    assert len(hidden[0]) == len(hidden[1]) == 7
    assert all(same_bits(a, b) for a, b in zip(*hidden))


def test_steps_in_one_call_never_plan_the_torch_backends_decode_groups(monkeypatch):
    """The runner leaves the decode groups to the torch backend, which plans them when it is first
    called in a step: the one-call steps never call it, and mixed steps give their decodes to the
    kernel, so no decode is ever grouped (a prefill-only step plans its empty list)."""
    plans = []
    group_by_length = attention.group_by_length
    monkeypatch.setattr(attention, "group_by_length", lambda decodes: plans.append(decodes) or group_by_length(decodes))
    _, recorder = run_busy(True, "float32")
    assert len(recorder.one_call_steps) > 5 and plans and not any(plans)


def test_beams_through_the_fused_decoder_find_the_models_beams():
    """Beam search forks and copies blocks on write; the fused K/V write lands where the copies say."""
    params = BeamSearchParams(beam_width=3, max_tokens=8, ignore_eos=True)
    found = []
    for fused in (True, False):
        llm = LLM("tiny", block_size=4, attention_backend=PagedDecodeAttention())
        if fused:
            llm.engine.runner.model = FusedDecoder(llm.engine.model)  # type: ignore[assignment]
        (out,) = llm.beam_search(["the cat sat on"], params)
        found.append([beam.tokens for beam in out.sequences])
    assert found[0] == found[1] and len(found[0]) == 3


def test_the_tools_fuse_with_the_kernel_and_keep_the_textbook_path_on_request():
    assert isinstance(build_engine("tiny", {}).runner.model, FusedDecoder)
    assert isinstance(build_engine("tiny", {"attention_backend": "torch"}).runner.model, CausalLM)


def test_qwen3s_per_head_norms_are_left_to_the_model():
    small = dict(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    heads = dict(num_attention_heads=2, num_key_value_heads=1)
    assert FusedDecoder.fits(CausalLM(LlamaConfig(**small, **heads), 64), torch.device("cpu"))
    assert not FusedDecoder.fits(CausalLM(Qwen3Config(**small, **heads, head_dim=16), 64), torch.device("cpu"))


def test_positions_and_slots_the_kernels_would_read_out_of_bounds_are_refused():
    """Checked once a step, before the first layer: the torch path's indexing would refuse them too."""
    engine = build_engine("tiny", {})
    decoder, kv = engine.runner.model, engine.runner.kv_caches[0]
    assert isinstance(decoder, FusedDecoder)
    table = len(decoder.model.model.rotary_emb.cos)
    num_slots = kv.shape[1] * kv.shape[3]
    with pytest.raises(IndexError, match=f"a position lies outside the rotary table's 0..{table - 1}"):
        check_step(torch.tensor([3, table]), torch.tensor([0, 1]), table, kv)
    with pytest.raises(IndexError, match="a slot lies outside the KV cache"):
        check_step(torch.tensor([3, 4]), torch.tensor([0, num_slots]), table, kv)
    with pytest.raises(IndexError, match="a slot lies outside the KV cache"):
        check_step(torch.tensor([3]), torch.tensor([-1]), table, kv)
    with pytest.raises(TypeError, match="int64 positions"):
        check_step(torch.tensor([3], dtype=torch.int32), torch.tensor([0]), table, kv)
    check_step(torch.tensor([0, table - 1]), torch.tensor([0, num_slots - 1]), table, kv)


@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=needs_bf16_kernel)])
def test_a_step_in_one_call_is_held_to_the_models_bits(monkeypatch, dtype):
    """A planted bug in decode_layers.c's arguments (each layer handed the next one's weights) must
    show in the comparison above: the one-call steps are part of what it compares."""
    original = DecodeLayers.layer_args

    def shifted(self, kv_caches, rows):
        args = original(self, kv_caches, rows)
        layers = list(args)
        for layer, following in zip(layers, layers[1:] + layers[:1]):
            layer.qkv, layer.o = following.qkv, following.o
        return args

    monkeypatch.setattr(DecodeLayers, "layer_args", shifted)
    ours, our_recorder = run_busy(True, dtype)
    theirs, their_recorder = run_busy(False, dtype)
    assert our_recorder.one_call_steps
    assert not all(same_bits(a, b) for a, b in zip(our_recorder.hidden, their_recorder.hidden))


def test_the_decoders_linears_come_in_the_models_order():
    """The bench times them against the model's own modules (efficiency.measure_linear_ceiling)."""
    engine = make_tiny_engine(attention_backend=PagedDecodeAttention())
    modules = [m for m in engine.model.modules() if isinstance(m, torch.nn.Linear)]
    linears = FusedDecoder(engine.model).linears()
    assert len(linears) == len(modules)
    for linear, module in zip(linears, modules):
        x = torch.randn(3, module.in_features)
        assert torch.equal(linear(x), module(x))
