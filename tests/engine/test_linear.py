"""The model's Linear: on x86 CPUs in float32 its matmul runs on oneDNN, with F.linear's result."""

from __future__ import annotations

import platform

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import profile

from nanoengine.loading.build import pack_for_onednn
from nanoengine.model import ONEDNN, Linear


@pytest.mark.parametrize("rows", [1, 2, 7, 32, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_matches_f_linear(rows: int, bias: bool) -> None:
    torch.manual_seed(rows)
    layer = Linear(96, 80, bias=bias)
    x = torch.randn(rows, 96)
    with torch.inference_mode():
        out = layer(x)
    assert out.shape == (rows, 80) and out.dtype == torch.float32
    torch.testing.assert_close(out, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


def ops_run(layer: Linear, x: torch.Tensor) -> set[str]:
    with torch.inference_mode(), profile() as prof:
        layer(x)
    return {e.key for e in prof.key_averages()}


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="oneDNN is used on x86 only")
def test_float32_cpu_matmul_runs_on_onednn() -> None:
    assert ONEDNN, "this x86 torch build has no oneDNN linear op"
    layer = Linear(64, 64)
    pack_for_onednn(layer)
    ops = ops_run(layer, torch.randn(4, 64))
    assert "mkldnn::_linear_pointwise" in ops and "aten::linear" not in ops


def test_unpacked_weights_keep_f_linear() -> None:
    layer = Linear(64, 64).to(torch.bfloat16)
    ops = ops_run(layer, torch.randn(4, 64, dtype=torch.bfloat16))
    assert "aten::linear" in ops and "mkldnn::_linear_pointwise" not in ops


def test_packed_weights_give_the_same_model_outputs():
    from nanoengine.loading.build import build_model
    from nanoengine.loading.tiny import tiny_config

    config = tiny_config()
    config.tie_word_embeddings = True
    model = build_model(config, None, 64, torch.device("cpu"), torch.float32)
    hidden = torch.randn(5, config.hidden_size)
    with torch.inference_mode():
        before = model.compute_logits(hidden)
        pack_for_onednn(model)
        after = model.compute_logits(hidden)
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)
    layouts = {m.weight.layout for m in model.modules() if isinstance(m, Linear)}
    assert layouts == ({torch._mkldnn} if ONEDNN else {torch.strided})  # type: ignore[attr-defined]
    assert model.model.embed_tokens.weight.layout == torch.strided  # the embedding keeps its plain weight


@pytest.mark.parametrize("rows", [1, 2, 32])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_layer_gives_f_linear_result_at_any_rows(rows: int, bias: bool) -> None:
    """One row too: a lone sequence's decode step reads the packed weight (docs/benchmarks.md)."""
    torch.manual_seed(rows)
    layer = Linear(96, 80, bias=bias)
    weight, x = layer.weight.detach().clone(), torch.randn(rows, 96)
    pack_for_onednn(layer)
    with torch.inference_mode():
        out = layer(x)
    torch.testing.assert_close(out, F.linear(x, weight, layer.bias), rtol=1e-5, atol=1e-5)
    assert ("mkldnn::_linear_pointwise" in ops_run(layer, x)) == ONEDNN


ONEDNN_BF16 = ONEDNN and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def test_bfloat16_weights_are_packed_where_onednn_has_bf16_kernels():
    torch.manual_seed(0)
    layer = Linear(64, 48).to(torch.bfloat16)
    weight, x = layer.weight.detach().clone(), torch.randn(5, 64, dtype=torch.bfloat16)
    pack_for_onednn(layer)
    assert layer.weight.is_mkldnn == ONEDNN_BF16  # without them bf16 is emulated: F.linear
    with torch.inference_mode():
        out = layer(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, F.linear(x, weight, layer.bias), rtol=1.6e-2, atol=1e-2)


def test_float16_weights_are_not_packed():
    layer = Linear(64, 64).to(torch.float16)
    pack_for_onednn(layer)
    assert layer.weight.layout == torch.strided
