"""The roofline bound: the bytes a phase must move, the measured bandwidth, which limit binds."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import tracer.bench
from tracer.bench.efficiency import Roofline, run_efficiency
from tracer.bench.model_shape import ModelShape
from tracer.bench.roofline import ByteModel, bound_seconds, measure_memory_bandwidth
from tracer.bench.workload import BenchRequest

SHAPE = ModelShape(2, 64, 4, 2, 16, 128, 300)


def test_weight_bytes_are_every_linear_and_the_lm_head_once():
    from nanoengine.loading.build import build_model
    from nanoengine.loading.tiny import tiny_config

    config = tiny_config()
    model = build_model(config, None, 64, torch.device("cpu"), torch.float32)
    bytes_model = ByteModel.of(ModelShape.of(config), 4)
    linears = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert bytes_model.weight_bytes == 4 * linears
    k_cache = config.num_key_value_heads * (config.hidden_size // config.num_attention_heads)
    assert bytes_model.kv_bytes_per_key == 2 * config.num_hidden_layers * k_cache * 4
    narrow = ByteModel.of(ModelShape.of(config), 4, kv_itemsize=2)  # kv_cache_dtype="bfloat16"
    assert narrow.weight_bytes == bytes_model.weight_bytes
    assert narrow.kv_bytes_per_key * 2 == bytes_model.kv_bytes_per_key


def test_each_token_reads_its_whole_context_of_keys():
    bytes_model = ByteModel(weight_bytes=1000, kv_bytes_per_key=10)
    kv = bytes_model.token_kv_bytes(BenchRequest((1,) * 5, 3))
    # the prefill writes and reads 5 keys; token 1 is position 5: writes 1 key, reads 6
    assert kv == [2 * 5 * 10, (1 + 6) * 10, (1 + 7) * 10]


def test_the_slower_limit_binds():
    assert bound_seconds(flops=1e9, nbytes=1e6, peak_flops=1e9, bandwidth=1e9) == (1.0, "compute")
    assert bound_seconds(flops=1e6, nbytes=4e9, peak_flops=1e9, bandwidth=1e9) == (4.0, "memory")


def test_a_decode_phase_needs_one_weight_read_per_token_of_its_longest_request():
    requests = [BenchRequest((5,) * 4, 4), BenchRequest((6,) * 9, 2)]
    times = [[1.0, 2.0, 3.0, 4.0], [1.5, 2.5]]
    bytes_model = ByteModel(weight_bytes=10**6, kv_bytes_per_key=100)
    result = run_efficiency(SHAPE, requests, times, 4.0, peak=1e12, roofline=Roofline(1e9, bytes_model))
    decode = result["decode-heavy"]  # after 1.5 s: request 0's tokens 2-4, request 1's token 2
    assert decode["min_steps"] == 3
    kv = sum(bytes_model.token_kv_bytes(requests[0])[1:]) + bytes_model.token_kv_bytes(requests[1])[1]
    assert decode["gbytes"] == pytest.approx((3 * 10**6 + kv) / 1e9, abs=1e-3)
    assert decode["bound_by"] == "memory"
    assert decode["of_roofline"] == pytest.approx(decode["bound_s"] / decode["seconds"], rel=1e-2)


def test_without_a_roofline_no_bound_is_reported():
    result = run_efficiency(SHAPE, [BenchRequest((5,) * 4, 2)], [[1.0, 2.0]], 3.0, peak=1e9)
    assert "of_roofline" not in result["whole run"]


def test_bandwidth_is_measured_by_every_kernel_and_the_best_wins():
    bw = measure_memory_bandwidth(torch.device("cpu"), nbytes=8 * 2**20)
    assert set(bw["by_kernel"]) == {"read", "copy", "triad"}
    assert bw["gb_s"] == max(bw["by_kernel"].values()) > 0


def imported_modules(path: Path) -> set[str]:
    """Every tracer module a file imports, at its top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_the_roofline_and_what_it_uses_never_import_the_efficiency_module():
    """efficiency.py builds on roofline.py, timing.py and model_shape.py, one way: no import circle."""
    bench = Path(tracer.bench.__file__).parent
    for name in ("roofline", "timing", "model_shape"):
        assert "tracer.bench.efficiency" not in imported_modules(bench / f"{name}.py"), name
