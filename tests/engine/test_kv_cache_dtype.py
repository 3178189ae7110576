"""EngineConfig.kv_cache_dtype (vLLM's option): the KV pool in the model's dtype (auto) or in another
one. A bfloat16 pool under a float32 model holds twice the blocks in the same memory, and each
K/V is the float32 one rounded once, as it is written; the textbook path reads it widened."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_engine

from nanoengine.engine import LLMEngine
from nanoengine.llm import LLM
from nanoengine.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


def test_auto_keeps_the_models_dtype():
    assert make_tiny_engine().runner.kv_caches[0].dtype == torch.float32
    assert make_tiny_engine(dtype="bfloat16").runner.kv_caches[0].dtype == torch.bfloat16


def test_a_bfloat16_pool_holds_twice_the_blocks_in_the_same_memory():
    blocks = {}
    for kv_cache_dtype in ("auto", "bfloat16"):
        engine = LLMEngine("tiny", kv_cache_memory_gb=0.001, kv_cache_dtype=kv_cache_dtype)
        pool = engine.runner.kv_caches
        assert pool[0].dtype == (torch.float32 if kv_cache_dtype == "auto" else torch.bfloat16)
        blocks[kv_cache_dtype] = engine.config.num_kv_blocks
        nbytes = sum(kv.numel() * kv.element_size() for kv in pool)
        assert nbytes <= 0.001 * 2**30 < nbytes + len(pool) * pool[0][0, 0].nbytes * 2  # within a block
    assert blocks["bfloat16"] == 2 * blocks["auto"]


def first_layers_kv(kv_cache_dtype: str) -> torch.Tensor:
    engine = make_tiny_engine(attention_backend="torch", kv_cache_dtype=kv_cache_dtype)
    engine.add_request("the cat sat on the mat", SamplingParams(max_tokens=1))
    engine.step()  # a prefill chunk: layer 0's K/V come from the same numbers either way
    return engine.runner.kv_caches[0]


def test_each_k_and_v_is_the_float32_one_rounded_to_nearest():
    wide, narrow = first_layers_kv("auto"), first_layers_kv("bfloat16")
    assert narrow.dtype == torch.bfloat16 and bool(wide.any())
    assert torch.equal(narrow, wide.bfloat16())
    cut = (wide.view(torch.int32) & -65536).view(torch.float32).bfloat16()  # the planted bug: truncation
    assert not torch.equal(narrow, cut)


def test_the_text_stays_close_to_the_float32_caches():
    """Rounded K/V change the numbers, not (on a short greedy run of the tiny model) the tokens; the
    lessons' glossary says where this differs from the default."""
    outs = []
    for kv_cache_dtype in ("auto", "bfloat16"):
        llm = LLM("tiny", kv_cache_dtype=kv_cache_dtype, attention_backend="torch")
        outs.append([o.outputs[0].token_ids for o in llm.generate(["hello world", "abc abc abc"], GREEDY)])
    assert outs[0] == outs[1]


@pytest.mark.parametrize("value", ["fp8", "float64", "", 16])
def test_a_kv_cache_dtype_it_does_not_know_is_one_line(value):
    with pytest.raises(ValueError, match=r"^kv_cache_dtype must be one of float32, bfloat16, float16 or auto") as e:
        LLMEngine("tiny", kv_cache_dtype=value)
    assert "\n" not in str(e.value)
