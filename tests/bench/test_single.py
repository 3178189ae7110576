"""The single-stream rows of `nanoengine bench` (and `--single-only`), the batch of 32 beside them, and
`nanoengine generate --stats`, on the tiny model: the rows' shape and arithmetic, no timings."""

from __future__ import annotations

import json

import pytest

from tracer.bench.llama_cpp import skip_reason
from tracer.bench.report import single_targets
from tracer.bench.single import BATCH, SingleResult, SingleRun, single_report, time_in_turns
from tracer.cli.bench import bench_main
from tracer.cli.main import main


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("single") / "single.json"
    assert bench_main(["--single-only", "--model", "tiny", "--threads", "1", "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_single_only_has_a_row_per_system_and_dtype(report, capsys):
    rows = report["single"]["rows"]
    assert [(r["system"], r["dtype"]) for r in rows] == [
        ("nanoengine", "float32"),
        ("HF generate", "float32"),
        ("nanoengine", "bfloat16"),
        ("HF generate", "bfloat16"),
    ]
    for r in rows:
        assert r["tok_s"] > 0 and r["ttft_ms"] > 0 and len(r["runs_tok_s"]) == report["single"]["runs"]
        assert r["tok_s"] == sorted(r["runs_tok_s"])[len(r["runs_tok_s"]) // 2]  # the median run
        assert r["of_bound"] == pytest.approx(r["tok_s"] / r["bound_tok_s"], rel=0.01, abs=1e-4)
        assert r["gb_s"] > 0  # probed between this system's runs
    fp32, bf16 = rows[0], rows[2]
    hf = rows[1]  # the same weight bytes as fp32: the bounds differ as the bandwidths probed in their runs
    assert fp32["bound_tok_s"] / hf["bound_tok_s"] == pytest.approx(fp32["gb_s"] / hf["gb_s"], rel=1e-3)
    assert bf16["weight_mb"] == pytest.approx(fp32["weight_mb"] / 2, abs=0.1)  # half the bytes a step
    assert rows[1]["same_tokens"] is True  # HF's greedy tokens in float32 are nanoengine's
    batch = report["single"]["batch"]
    assert batch["num_requests"] == BATCH and batch["rows"][0]["system"] == "nanoengine"
    assert (
        "only the default model" in report["single"]["llama_cpp_skipped"]
        or "not installed" in (report["single"]["llama_cpp_skipped"])
    )
    from tracer.bench.report import print_single_report

    print_single_report(report)
    text = capsys.readouterr().out
    for words in ("Single stream", "bound tok/s", "GB/s", f"A batch of {BATCH}", "single stream vs HF generate"):
        assert words in text


def test_single_targets_compare_the_median_runs():
    runs = [SingleRun(0.1, rate, [1, 2]) for rate in (10.0, 30.0, 20.0)]
    ours = SingleResult("nanoengine", "float32", runs, weight_bytes=10**9)
    hf = SingleResult("HF generate", "float32", [SingleRun(0.1, 10.0, [1, 2])], weight_bytes=10**9)
    bf16 = SingleResult("nanoengine", "bfloat16", [SingleRun(0.1, 50.0, [1, 3])], weight_bytes=5 * 10**8)
    single = single_report([ours, hf, bf16], bandwidth_gb_s=40.0)
    assert [r.get("same_tokens") for r in single["rows"]] == [True, True, False]
    assert single["rows"][0]["bound_tok_s"] == 40.0 and single["rows"][2]["bound_tok_s"] == 80.0
    speedup, share, over = (t.value for t in single_targets(single))
    assert speedup == 2.0 and share == 0.5 and over == 2.5
    assert all(t.value is None for t in single_targets(None))


def test_a_rows_bound_takes_the_bandwidth_probed_between_its_runs():
    """The median of the bandwidths measured after the system's rounds; the bench's own where its runs
    were not probed."""
    runs = [SingleRun(0.1, 20.0, [1], gb_s) for gb_s in (30.0, 50.0, 36.0)]
    probed = SingleResult("nanoengine", "float32", runs, weight_bytes=10**9).to_dict(40.0, None)
    assert probed["gb_s"] == 36.0 and probed["bound_tok_s"] == 36.0 and probed["of_bound"] == round(20 / 36, 4)
    unprobed = SingleResult("nanoengine", "float32", [SingleRun(0.1, 20.0, [1])], weight_bytes=10**9)
    assert unprobed.to_dict(40.0, None)["bound_tok_s"] == 40.0


def test_systems_timed_together_take_turns_run_by_run():
    """nanoengine's float32 and bfloat16 runs alternate, so a drift of the machine's pace falls on
    both: each warmed up once, then one run of each in turn."""
    calls: list[str] = []

    def system(name: str, seconds_a_token: float):
        def generate():
            calls.append(name)
            return [0.0, 0.5] + [0.5 + seconds_a_token * (i + 1) for i in range(10)], [len(calls)]

        return generate

    def probe() -> float:
        calls.append("probe")
        return float(len(calls))

    fp32, bf16 = time_in_turns([system("f", 0.02), system("b", 0.01)], runs=3, probe=probe)
    assert calls == ["f", "b"] + ["f", "b", "probe"] * 3
    assert [r.gb_s for r in fp32] == [r.gb_s for r in bf16] == [5.0, 8.0, 11.0]  # its round's probe
    assert [r.tokens for r in fp32] == [[3], [6], [9]] and [r.tokens for r in bf16] == [[4], [7], [10]]
    assert [round(r.tok_s) for r in fp32 + bf16] == [50] * 3 + [100] * 3 and fp32[0].ttft_s == 0.5


def test_llama_cpp_runs_only_the_default_model():
    reason = skip_reason("tiny")
    assert reason is not None and "\n" not in reason


def test_generate_stats_prints_ttft_and_the_decode_rate(capsys):
    assert main(["generate", "--model", "tiny", "--max-tokens", "12", "--ignore-eos", "--stats", "hi"]) == 0
    err = capsys.readouterr().err
    assert "[stats] TTFT " in err and "tok/s (11 tokens after the first)" in err and "float32" in err


def test_generate_runs_in_the_dtype_asked_for(capsys):
    """--dtype reaches the engine (bfloat16 decodes about twice as fast on CPUs with AMX)."""
    argv = ["generate", "--model", "tiny", "--max-tokens", "4", "--ignore-eos", "--stats", "--dtype", "bfloat16", "hi"]
    assert main(argv) == 0
    assert "torch.bfloat16" in capsys.readouterr().err
