"""The useful-FLOP count and the phase split behind the bench's efficiency figures."""

from __future__ import annotations

import pytest
import torch

from nanoengine.model import ONEDNN
from tracer.bench import efficiency
from tracer.bench.efficiency import (
    FULL_BATCH,
    FULL_DECODE,
    gemm_libraries,
    measure_linear_ceiling,
    request_token_flops,
    run_efficiency,
    split_phases,
)
from tracer.bench.model_shape import ModelShape
from tracer.bench.workload import BenchRequest


@pytest.fixture(scope="module")
def tiny_model():
    from nanoengine.loading.build import build_model
    from nanoengine.loading.tiny import tiny_config

    config = tiny_config()
    return build_model(config, None, 64, torch.device("cpu"), torch.float32)


def test_linear_flops_count_every_decoder_weight_twice(tiny_model):
    shape = ModelShape.of(tiny_model.config)
    weights = sum(m.weight.numel() for m in tiny_model.model.layers.modules() if isinstance(m, torch.nn.Linear))
    assert shape.linear_flops() == 2 * weights
    assert shape.lm_head_flops() == 2 * tiny_model.lm_head.weight.numel()


def test_attention_flops_match_the_matmuls_of_one_query():
    shape = ModelShape(2, 64, 4, 2, 16, 128, 300)
    q, k = torch.randn(4, 1, 16), torch.randn(4, 10, 16)
    # q.k: [heads, 1, dim] @ [heads, dim, 10]; p.v the same size: 2 FLOPs per multiply-add each
    per_layer = 2 * (q.numel() * k.shape[1]) * 2
    assert shape.attention_flops(10) == per_layer * shape.num_layers


def test_prefill_closed_form_equals_the_sum_over_positions():
    shape = ModelShape(3, 64, 4, 2, 16, 128, 300)
    for n in (1, 2, 7, 40):
        assert shape.prefill_flops(n) == sum(shape.token_flops(i) for i in range(n)) + shape.lm_head_flops()


def test_each_output_token_costs_one_forward_at_its_position():
    shape = ModelShape(2, 64, 4, 2, 16, 128, 300)
    flops = request_token_flops(shape, BenchRequest(tuple(range(5)), 3))
    assert len(flops) == 3
    assert flops[0] == shape.prefill_flops(5)
    # token 1 is the forward of token 0 at position 5: it attends to 6 keys
    assert flops[1] == shape.linear_flops() + shape.attention_flops(6) + shape.lm_head_flops()
    assert flops[2] - flops[1] == shape.attention_flops(1)


def test_phases_split_at_the_last_first_token_and_at_batch_16():
    # 20 requests: first tokens at 1..20 ms, each finishing at 100 + its index
    times = [[0.001 * (i + 1), 0.05, 0.1 + i] for i in range(20)]
    whole, prefill, decode, full = split_phases(times, elapsed=120.0)
    assert (whole.start_s, whole.end_s) == (0.0, 120.0)
    assert prefill.end_s == pytest.approx(0.02) and decode.start_s == prefill.end_s
    # the 16th-latest finish: fewer than 16 requests run after it
    assert full.end_s == pytest.approx(0.1 + 20 - FULL_BATCH)


def test_step_rows_count_the_full_decode_phases_steps_by_their_rows():
    """With every token of a step stamped alike, the batch >= 16 phase's steps are its distinct
    stamps, and a step's rows the tokens it gave; other systems' runs (steps_stamped off) have none."""
    shape = ModelShape(2, 64, 4, 2, 16, 128, 300)
    requests = [BenchRequest((5,) * 4, 5) for _ in range(18)]
    # first tokens at 0.1 s; all 18 decode at 1 and 2 s; two finish there, 16 decode at 3 s and finish at 4 s
    times = [[0.1, 1.0, 2.0] if i < 2 else [0.1, 1.0, 2.0, 3.0, 4.0] for i in range(18)]
    full = run_efficiency(shape, requests, times, 5.0, peak=1e9, steps_stamped=True)[FULL_DECODE]
    assert full["step_rows"] == {"16": 2, "18": 2}
    assert "step_rows" not in run_efficiency(shape, requests, times, 5.0, peak=1e9)[FULL_DECODE]


def test_efficiency_credits_every_token_once_per_phase():
    shape = ModelShape(2, 64, 4, 2, 16, 128, 300)
    requests = [BenchRequest((5,) * 4, 3), BenchRequest((6,) * 9, 2)]
    times = [[1.0, 2.0, 3.0], [1.5, 2.5]]
    total = sum(sum(request_token_flops(shape, r)) for r in requests)
    result = run_efficiency(shape, requests, times, elapsed=4.0, peak=1e9)
    whole, prefill, decode = result["whole run"], result["prefill-heavy"], result["decode-heavy"]
    assert whole["gflop"] == pytest.approx(total / 1e9, abs=0.01)
    assert prefill["gflop"] + decode["gflop"] == pytest.approx(whole["gflop"], abs=0.02)
    assert prefill["seconds"] == 1.5 and decode["seconds"] == 2.5
    assert whole["efficiency"] == pytest.approx(total / 4.0 / 1e9, abs=1e-3)


def test_cpu_time_gives_the_share_of_the_cores_the_run_got():
    shape = ModelShape(2, 64, 4, 2, 16, 128, 300)
    requests = [BenchRequest((5,) * 4, 3)]
    flops = sum(request_token_flops(shape, requests[0]))
    whole = run_efficiency(shape, requests, [[1.0, 2.0, 3.0]], 4.0, peak=2e9, cpu_time=2.0, threads=2)["whole run"]
    assert whole["cpu_share"] == 0.25  # 2 CPU seconds of the 8 that 2 threads could use in 4 s
    assert whole["efficiency_per_cpu_s"] == pytest.approx(flops / 2.0 / 1e9, abs=1e-4)


def test_every_gemm_library_computes_x_times_w_transposed():
    x, w = torch.randn(5, 48), torch.randn(40, 48)
    libraries = gemm_libraries(torch.device("cpu"), torch.float32)
    assert "torch default" in libraries
    for gemm in libraries.values():
        torch.testing.assert_close(gemm(x, w), x @ w.T, rtol=1e-5, atol=1e-5)
    assert list(gemm_libraries(torch.device("cpu"), torch.float16)) == ["torch default"]


def test_bf16_gemm_libraries_include_onednn_where_the_engine_packs_bf16():
    onednn = ONEDNN and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    libraries = gemm_libraries(torch.device("cpu"), torch.bfloat16)
    assert list(libraries) == (["torch default", "oneDNN"] if onednn else ["torch default"])
    x, w = torch.randn(5, 48, dtype=torch.bfloat16), torch.randn(40, 48, dtype=torch.bfloat16)
    for gemm in libraries.values():
        torch.testing.assert_close(gemm(x, w).float(), x.float() @ w.float().T, rtol=2e-2, atol=5e-2)


def test_linear_ceiling_times_every_linear_of_the_model(tiny_model, monkeypatch):
    calls: list[tuple[int, int]] = []
    original = torch.nn.Linear.__call__

    def counting(self, x):
        calls.append((x.shape[0], self.in_features))
        return original(self, x)

    monkeypatch.setattr(torch.nn.Linear, "__call__", counting)
    rates = measure_linear_ceiling(tiny_model, batches=(3, 8))
    # rates are rounded to 0.01 GFLOP/s: the tiny model under load can round to 0
    assert set(rates) == {"3", "8"} and min(rates.values()) >= 0
    num_linears = sum(isinstance(m, torch.nn.Linear) for m in tiny_model.modules())
    assert num_linears == 4 * tiny_model.config.num_hidden_layers + 1  # qkv, o, gate_up, down; LM head
    assert {rows for rows, _ in calls} == {3, 8} and len(calls) % num_linears == 0


def test_linear_ceiling_takes_the_faster_way_to_run_the_linears(tiny_model, monkeypatch):
    """Where the engine has kernels for the linears, the ceiling is whichever way runs them faster."""
    linears = [m for m in tiny_model.modules() if isinstance(m, torch.nn.Linear)]
    widths: list[int] = []
    kernels = [lambda x, m=m: (widths.append(x.shape[1]), m(x))[1] for m in linears]

    def seconds(fn, device, min_time, between=None):  # the kernels' way takes half the modules' time
        widths.clear()
        fn()
        return 0.5 if widths else 1.0

    monkeypatch.setattr(efficiency, "time_call", seconds)
    alone = measure_linear_ceiling(tiny_model, batches=(4,))
    both = measure_linear_ceiling(tiny_model, kernels, batches=(4,))
    assert widths == [m.in_features for m in linears]  # each kernel called with its own linear's rows
    assert both["4"] == pytest.approx(2 * alone["4"], rel=0.01)


def test_linear_ceiling_reads_other_memory_between_its_calls(tiny_model, monkeypatch):
    """As a step reads its K/V between two reads of a weight, the ceiling reads between_bytes of
    memory of its own before each timed call; none where it is not asked to."""
    read: list[int] = []
    monkeypatch.setattr(efficiency, "other_reads", lambda n: lambda: read.append(n))
    measure_linear_ceiling(tiny_model, batches=(2,), between_bytes=1 << 20)
    assert len(read) >= 3 and set(read) == {1 << 20}  # time_call's three timed calls at least
    read.clear()
    measure_linear_ceiling(tiny_model, batches=(2,))
    assert read == []
