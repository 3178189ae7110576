"""Smoke tests for `nanoengine bench` on the tiny model: the report's shape and the workload, no timings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HANG_S

from nanoengine.loading.engine_parts import cpu_has_bf16
from nanoengine.model import ONEDNN
from nanoengine.sampling_params import SamplingParams
from tracer.bench.metrics import latencies, percentile
from tracer.bench.report import (
    ceiling_rate_at,
    decode_phase,
    decode_reach,
    decode_reach_caption,
    decode_targets,
    evaluate_targets,
    fmt_limit,
    own_batches_caption,
    own_batches_reach,
    reach_budget,
    reach_limit,
    reach_share,
    roofline_caption,
)
from tracer.bench.run import BF16_LEFT_OUT, BF16_RUN, NO_BF16_CPU, BenchSettings, bf16_skip_reason
from tracer.bench.workload import QUICK, STANDARD, WorkloadSpec, build_workload
from tracer.cli.bench import bench_main

ROOT = Path(__file__).resolve().parents[2]
RUN_KEYS = {"elapsed_s", "num_prompt_tokens", "num_output_tokens", "output_tok_s", "total_tok_s", "ttft_ms", "tpot_ms"}


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    # One thread: on a shared 2-core machine two OpenMP threads can make small ops 30x slower.
    # A small paged cache for generate_batch: its default sizing fills GBs of buffers on CPU (~20 s).
    code = bench_main(
        [
            "--quick",
            "--model",
            "tiny",
            "--json",
            "--threads",
            "1",
            "--cb-num-blocks",
            "16",
            "--cb-max-batch-tokens",
            "256",
            "--profile",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    return json.loads(out.read_text())


def test_report_has_every_run_and_measure(report):
    # on an x86 CPU in float32 the static baseline runs a second time with nanoengine's GEMM library
    onednn = {"hf_generate_onednn"} if ONEDNN else set()
    bf16 = {BF16_RUN} if cpu_has_bf16() else set()
    assert set(report["runs"]) == {"nanoengine", "hf_generate", "hf_generate_batch"} | onednn | bf16
    for run in report["runs"].values():
        assert RUN_KEYS <= set(run)
        assert set(run["ttft_ms"]) == {"p50", "p90", "p99"}
        assert run["num_output_tokens"] == report["workload"]["num_output_tokens"]
    for key in ("hf_generate", "hf_generate_batch"):
        assert report["runs"][key]["nanoengine_speedup"] > 0
    assert {"num_steps", "model_time_s", "overhead_share", "model_only_s", "total_over_model_only"} <= set(
        report["engine"]
    )
    assert {"elapsed_s", "overhead", "trace_bytes", "trace_steps", "header_s", "recording_s", "recording_share"} <= set(
        report["tracer"]
    )
    assert report["tracer"]["recording_s"] > 0  # on the tiny model recording can cost more than its tiny steps
    assert report["tracer"]["header_s"] > 0  # written before the first step, timed on its own
    startup = report["startup"]
    assert {"total_s", "import_s", "build_s", "first_token_s"} <= set(startup)
    # the median of three fresh processes, each listed
    assert len(startup["runs_total_s"]) == 3 and startup["total_s"] == sorted(startup["runs_total_s"])[1]
    targets = {t["name"]: t for t in report["targets"]}
    decode = ["decode at batch >= 16: share of its reach (float32)"]
    decode += ["decode at batch >= 16: share of its reach (bfloat16)"] if bf16 else []
    decode += ["decode at batch >= 16: bfloat16 over float32 (AMX hosts)"]
    measured = [
        "throughput vs HF generate",
        "throughput vs HF generate_batch",
        "total / model-only time",
        "tracer overhead",
        "start-up to first token",
    ]
    single = [
        "single stream vs HF generate (batch 1, float32)",
        "single stream: share of the batch-1 bandwidth bound",
        "single stream: bfloat16 over float32",
    ]
    assert list(targets) == measured + decode + single
    assert all(isinstance(targets[name]["met"], bool) for name in measured + single)
    # the quick workload never runs 16 requests at once: no such phase, no reach
    assert all(targets[name]["met"] is None for name in decode)
    assert targets["throughput vs HF generate"]["limit"] == 2.5


def test_efficiency_is_reported_per_system_and_phase(report):
    assert report["gemm_peak"]["gflop_s"] > 0 and set(report["gemm_peak"]["at_batch_32"]) == {"gate_proj", "lm_head"}
    peak = report["gemm_peak"]
    # the peak is the best rate of any library measured; the decode ceiling is the model's own linears
    every_rate = [v for by_name in peak["by_library"].values() for r in by_name.values() for v in r.values()]
    assert peak["gflop_s"] == pytest.approx(max(every_rate), abs=0.01) and peak["library"] in peak["by_library"]
    assert set(peak["model_linears_gflop_s"]) == {"16", "24", "32"} and min(peak["model_linears_gflop_s"].values()) > 0
    assert set(report["efficiency"]) == set(report["runs"])
    for phases in report["efficiency"].values():
        assert list(phases) == ["whole run", "prefill-heavy", "decode-heavy", "decode at batch >= 16"]
        whole = phases["whole run"]
        assert 0 < whole["efficiency"] and whole["gflop"] > 0
        assert 0 < whole["cpu_share"] and 0 < whole["efficiency_per_cpu_s"]
        assert phases["prefill-heavy"]["gflop"] + phases["decode-heavy"]["gflop"] == pytest.approx(
            whole["gflop"], abs=0.02
        )
        # the roofline: every phase has a bound no longer than the phase itself took
        for phase in phases.values():
            if phase["seconds"] > 0:
                assert phase["bound_by"] in ("compute", "memory") and 0 < phase["of_roofline"] <= 1
    bandwidth = report["memory_bandwidth"]
    assert bandwidth["gb_s"] == max(bandwidth["by_kernel"].values()) > 0
    assert bandwidth["weight_mb_per_step"] > 0 and bandwidth["kv_kb_per_key"] > 0
    # the engine's pool read as its decode kernel reads it, the rate its K/V are charged at
    assert bandwidth["kv_reads"]["gb_s"] > 0 and bandwidth["kv_reads"]["dtype"] == "float32"
    assert f"nothing computed: {bandwidth['kv_reads']['gb_s']:.1f} GB/s" in (roofline_caption(report) or "")
    # with a step's weights read between two reads of the pool, as a step reads them
    assert bandwidth["kv_reads"]["read_between_mb"] == pytest.approx(bandwidth["weight_mb_per_step"], abs=0.1)
    # the same useful work, whoever does it
    gflops = {phases["whole run"]["gflop"] for phases in report["efficiency"].values()}
    assert max(gflops) - min(gflops) <= 0.01


def test_profile_splits_each_phase_into_categories(report):
    from tracer.bench.op_profile import CATEGORIES

    for phase in ("prefill-heavy", "decode-heavy"):
        p = report["profile"][phase]
        assert p["num_steps"] > 0 and list(p["categories"]) == list(CATEGORIES)
        shares = [c["share"] for c in p["categories"].values()]
        assert sum(shares) == pytest.approx(1.0, abs=0.01)
        for name in ("linear", "attention (incl. K/V gather)", "norms / RoPE / activation", "sampling"):
            assert p["categories"][name]["seconds"] > 0, (phase, name)
    steps = report["profile"]["prefill-heavy"]["num_steps"] + report["profile"]["decode-heavy"]["num_steps"]
    assert steps == report["engine"]["num_steps"]  # the same workload, the same schedule


def test_baselines_compute_the_same_greedy_tokens(report):
    # The HF baselines run the tiny model with nanoengine's exact weights: greedy outputs must agree
    # for nearly every request (a float near-tie may flip one).
    n = report["workload"]["num_requests"]
    # bfloat16 rounds differently: its count is reported, never held to this
    for key in set(report["runs"]) - {"nanoengine", BF16_RUN}:
        assert report["runs"][key]["matching_requests"] >= n - 1


def test_the_report_names_its_cpu_and_prints_the_name_as_text(report, capsys):
    from tracer.bench.report import print_report

    assert report["cpu"]["model"] and report["cpu"]["cores"] >= 1 and report["cpu"]["isa"]
    print_report({**report, "model": "[red]m[/red]", "cpu": {**report["cpu"], "model": "[red]Evil[/red] CPU"}})
    out = capsys.readouterr().out
    assert "CPU [red]Evil[/red] CPU" in out and "model [red]m[/red]," in out


def test_a_report_written_to_a_file_keeps_the_efficiency_headers_whole(report, capsys):
    from tracer.bench.report import print_report

    print_report(report)  # capsys: not a terminal, as `nanoengine bench > bench.txt`
    out = capsys.readouterr().out
    assert "system" in out and "phase" in out and "sys…" not in out and "pha…" not in out


def test_tables_show_every_system_and_target(report, capsys):
    from tracer.bench.report import print_report

    print_report(report)
    text = capsys.readouterr().out
    for word in (
        "HF generate_batch",
        "TTFT p50",
        "model-only time",
        "tracer overhead",
        "start-up to first token",
        "GEMM peak",
        "Roofline",
        "decode-heavy",
        "Where nanoengine's time goes",
    ):
        assert word in text


def test_the_timed_engines_weights_were_moved_into_huge_pages_and_the_report_says_so(report, capsys):
    from tracer.bench.report import print_report
    from tracer.kernels.huge_pages import HUGE_PAGE

    moved = report["engine"]["huge_pages"]
    # (the tiny model's weights lie in a malloc arena whose 2 MiB pages the system will not move:
    # 0 of 4 MiB; test_huge_pages.py moves weights of their own)
    assert moved["of_mib"] >= HUGE_PAGE >> 20 and 0 <= moved["moved_mib"] <= moved["of_mib"] and moved["s"] >= 0
    assert report["memory_bandwidth"]["huge_pages"]  # the bound read in pages like the weights'
    print_report(report)
    text = " ".join(capsys.readouterr().out.split())
    assert f"{moved['moved_mib']} of {moved['of_mib']} MiB in {moved['s']:.2f} s" in text
    assert "buffers asked for 2 MiB pages" in text


def test_engine_steps_cover_the_longest_request(report):
    assert report["engine"]["num_steps"] >= QUICK.max_output_len
    assert report["tracer"]["trace_steps"] == report["engine"]["num_steps"]


def test_workload_is_seeded_and_in_range():
    a, b = build_workload(STANDARD, 49152), build_workload(STANDARD, 49152)
    assert a == b and len(a) == 32
    assert all(16 <= r.num_prompt_tokens <= 256 and 16 <= r.max_tokens <= 256 for r in a)
    assert all(100 <= t < 10_000 for r in a for t in r.prompt_token_ids)
    assert build_workload(WorkloadSpec(seed=1), 49152) != a


def test_bad_workload_is_a_clear_error(capsys):
    from tracer.cli.main import main

    assert main(["bench", "--model", "tiny", "--input-len", "50", "10"]) == 2
    assert "input lengths must satisfy" in capsys.readouterr().err


def test_an_output_file_that_cannot_be_written_is_refused_before_measuring(tmp_path, capsys, monkeypatch):
    """Not after minutes of runs: the results would be lost. A file made to find out is removed."""
    from tracer.bench import run
    from tracer.cli.main import main

    monkeypatch.setattr(run, "run_single_benchmark", lambda settings: pytest.fail("measured anyway"))
    folder = tmp_path / "a folder"
    folder.mkdir()
    for flag, path in (("--out", folder), ("--trace-out", tmp_path / "a file" / "under a file.jsonl")):
        (tmp_path / "a file").write_text("")
        assert main(["bench", "--model", "tiny", "--single-only", flag, str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and f"{flag} {path}: cannot write there" in err and "Traceback" not in err
    fresh = tmp_path / "fresh.json"
    monkeypatch.setattr(run, "run_single_benchmark", lambda settings: {"single": None})
    from tracer.cli import bench

    monkeypatch.setattr(bench, "emit_report", lambda report, args, table: None)
    assert main(["bench", "--model", "tiny", "--single-only", "--out", str(fresh)]) == 0
    assert not fresh.exists()  # made to check, removed; emit_report (here a no-op) writes it


def test_a_named_pipe_as_out_is_refused_not_waited_on(tmp_path):
    """Opening a pipe for writing waits for a reader: --out would hang before measuring."""
    import signal

    from tracer.cli.bench import check_writable

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)

    def hung(signum, frame):
        raise AssertionError("--out waited on a named pipe")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    try:
        with pytest.raises(ValueError, match="cannot write there"):
            check_writable("--out", pipe)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert pipe.exists()  # the user's pipe stays


def test_latency_math():
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    ttft, tpot = latencies([[1.5, 2.0, 2.5], [3.0]], start=1.0)
    assert ttft == [0.5, 2.0] and tpot == [0.5]


def test_gpu_script_runs_on_cpu_with_tiny_shape(tmp_path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tracer" / "bench" / "gpu.py"),
            "--tiny-shape",
            "--threads",
            "1",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["device"] == "cpu" and data["model_shape"]["model_type"] == "qwen3"
    assert {"nanoengine", "hf_generate"} <= set(data["runs"])


def test_onednn_linears_swap_the_hf_layers_only_inside_the_block():
    import torch

    from nanoengine.model import Linear
    from tracer.bench.hf import onednn_linears, tiny_hf_model

    hf = tiny_hf_model(torch.float32)
    ids = torch.tensor([[5, 9, 30, 41]])
    with torch.inference_mode():
        before = hf(ids).logits
        with onednn_linears(hf) as swapped:
            assert swapped == ONEDNN
            kinds = {type(m) for m in hf.modules() if isinstance(m, torch.nn.Linear)}
            assert kinds == ({Linear} if ONEDNN else {torch.nn.Linear})
            inside = hf(ids).logits
        assert {type(m) for m in hf.modules() if isinstance(m, torch.nn.Linear)} == {torch.nn.Linear}
        assert {m.weight.layout for m in hf.modules() if isinstance(m, torch.nn.Linear)} == {torch.strided}
    torch.testing.assert_close(inside, before, rtol=1e-4, atol=1e-4)


def test_quiet_transformers_silences_the_no_eos_warning_and_restores_verbosity():
    """generate() warns at every call that eos_token_id -1 never stops it (what the bench means);
    inside quiet_transformers that line and the progress bars are off, and after it as before."""
    import logging

    import torch
    from transformers import GenerationConfig
    from transformers.utils import logging as hf_logging

    from tracer.bench.hf import NO_EOS, generate_static, quiet_transformers, tiny_hf_model
    from tracer.bench.workload import BenchRequest

    warning = "`eos_token_id` should consist of positive integers"

    class Seen(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.messages: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.messages.append(record.getMessage())

    logger, seen = logging.getLogger("transformers.generation.utils"), Seen()
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_warning()  # whatever an earlier test left transformers at
    logger.addHandler(seen)
    try:
        hf = tiny_hf_model(torch.float32)
        with quiet_transformers():
            assert not hf_logging.is_progress_bar_enabled()
            (tokens,), _ = generate_static(hf, [BenchRequest(prompt_token_ids=(5, 9, 30), max_tokens=3)], pad_id=0)
        assert len(tokens) == 3 and not [m for m in seen.messages if warning in m]
        assert hf_logging.get_verbosity() == logging.WARNING and hf_logging.is_progress_bar_enabled()
        config = GenerationConfig(max_new_tokens=2, do_sample=False, eos_token_id=NO_EOS, pad_token_id=0)
        with torch.inference_mode():
            hf.generate(input_ids=torch.tensor([[5, 9, 30]]), generation_config=config)
        assert [m for m in seen.messages if warning in m]  # generate() itself still says it
    finally:
        logger.removeHandler(seen)
        hf_logging.set_verbosity(verbosity)


def test_decode_reach_is_the_bound_over_the_ceiling_time():
    phase = {"gflop": 1200.0, "bound_s": 6.0, "seconds": 25.0}
    report = {
        "gemm_peak": {"model_linears_gflop_s": {"16": 80.0, "32": 120.0}},
        "efficiency": {"nanoengine": {"decode at batch >= 16": phase}},
    }
    share, seconds, _ = decode_reach(report)  # type: ignore[misc]
    assert seconds == pytest.approx(10.0) and share == pytest.approx(0.6)  # 1200 GFLOP at 120 GFLOP/s
    assert "exceed 60 %" in (decode_reach_caption(report) or "")
    phase["gflop"] = 300.0  # the linears fit in the bound: the roofline itself is the limit
    assert decode_reach(report)[0] == 1.0  # type: ignore[index]
    assert decode_reach({"gemm_peak": {}, "efficiency": {}}) is None


def test_reach_budget_is_what_the_goal_leaves_past_the_linears_and_kv_reads():
    """80 % of the reach asks the phase to take at most the larger of its bound and its linears'
    time over 0.8; what that leaves past the linears and the K/V reads, against what the rest took."""
    phase = {"gflop": 1200.0, "bound_s": 6.0, "seconds": 25.0, "gbytes": 70.0, "min_steps": 100}
    report = {
        "gemm_peak": {"model_linears_gflop_s": {"32": 120.0}},  # the linears alone: 10 s
        "efficiency": {"nanoengine": {"decode at batch >= 16": phase}},
        "memory_bandwidth": {"gb_s": 20.0, "weight_mb_per_step": 500.0},  # 20 GB of K/V: 1 s
    }
    goal_s, left_s, took_s = reach_budget(report)  # type: ignore[misc]
    assert (goal_s, left_s, took_s) == pytest.approx((12.5, 1.5, 14.0))  # 10 / 0.8; 12.5 - 11; 25 - 11
    assert "asks for at most 12.50 s, which leaves 1.50 s for all else" in (decode_reach_caption(report) or "")
    assert "14.00 s in this run" in (decode_reach_caption(report) or "")
    report["memory_bandwidth"]["gb_s"] = 5.0  # 4 s of K/V: 14 s alone, past the goal's 12.5
    assert reach_budget(report)[1] == pytest.approx(-1.5)  # type: ignore[index]
    assert "less than the linears and the K/V reads alone take here" in (decode_reach_caption(report) or "")
    phase["gflop"] = 300.0  # the linears (2.5 s) inside the bound (6 s): the goal is the bound over 0.8
    assert reach_budget(report)[0] == pytest.approx(7.5)  # type: ignore[index]
    del phase["seconds"]
    assert reach_budget(report) is None and "asks for" not in (decode_reach_caption(report) or "")


def test_ceiling_rate_at_reads_a_steps_time_off_between_the_rows_measured():
    ceiling = {"16": 80.0, "32": 120.0}  # a step's linears: 16 / 80 = 0.2 and 32 / 120 = 0.267 units
    assert ceiling_rate_at(ceiling, 24) == pytest.approx(24 / ((0.2 + 32 / 120) / 2))
    assert ceiling_rate_at(ceiling, 16) == 80.0 and ceiling_rate_at(ceiling, 40) == 120.0
    assert ceiling_rate_at(ceiling, 8) == 80.0  # below the rows measured: the nearest one's rate
    three = {"16": 80.0, "24": 90.0, "32": 120.0}
    assert ceiling_rate_at(three, 20) == pytest.approx(20 / ((0.2 + 24 / 90) / 2))


def test_own_batches_reach_charges_each_step_at_its_own_rows_rate():
    """The linears' time at each step's own rows: slower than the best rate (the most rows) where
    the steps have fewer; judged so, the share rises where the reach is below the bound."""
    phase = {"gflop": 1200.0, "bound_s": 6.0, "seconds": 25.0, "of_roofline": 0.24, "gbytes": 70.0, "min_steps": 100}
    report = {
        "gemm_peak": {"model_linears_gflop_s": {"16": 80.0, "32": 120.0}},
        "efficiency": {"nanoengine": {"decode at batch >= 16": phase}},
        "memory_bandwidth": {"gb_s": 20.0, "weight_mb_per_step": 500.0},  # the K/V: 1 s
    }
    assert own_batches_reach(report) is None and own_batches_caption(report) is None  # no step rows
    phase["step_rows"] = {"16": 30, "32": 10}
    rate, seconds, share, most = own_batches_reach(report)  # type: ignore[misc]
    work, time = 30 * 16 + 10 * 32, 30 * 16 / 80.0 + 10 * 32 / 120.0
    assert rate == pytest.approx(work / time) and seconds == pytest.approx(1200.0 / rate)
    assert share == pytest.approx(0.24 / (6.0 / seconds)) and most == pytest.approx(seconds / (seconds + 1.0))
    assert share > reach_share(report)  # type: ignore[operator]  # the best rate's reach is the harder one
    caption = own_batches_caption(report) or ""
    assert "40 steps of 16-32 rows, 20.0 on average" in caption and "not its best 120.0" in caption
    phase["step_rows"] = {"32": 40}  # every step at the rows measured best: the same as the target's
    assert own_batches_reach(report)[2] == pytest.approx(reach_share(report))  # type: ignore[index]


def test_reach_limit_adds_the_kv_reads_to_the_linears():
    """The most of its reach decode can have: the linears at the ceiling plus the phase's K/V read
    once at the measured bandwidth (its bytes less the weights of the steps it ran)."""
    phase = {"gflop": 1200.0, "bound_s": 6.0, "seconds": 25.0, "gbytes": 70.0, "min_steps": 100}
    report = {
        "gemm_peak": {"model_linears_gflop_s": {"32": 120.0}},  # the linears alone: 10 s
        "efficiency": {"nanoengine": {"decode at batch >= 16": phase}},
        "memory_bandwidth": {"gb_s": 20.0, "weight_mb_per_step": 500.0},  # 70 - 100 x 0.5 = 20 GB: 1 s
    }
    kv_gb, kv_seconds, most = reach_limit(report)  # type: ignore[misc]
    assert (kv_gb, kv_seconds) == pytest.approx((20.0, 1.0)) and most == pytest.approx(10 / 11)
    assert "at 20.0 GB/s, the measured bandwidth" in (decode_reach_caption(report) or "")
    assert "at most 91 % of the reach" in (decode_reach_caption(report) or "")
    # where the bench read the pool's pages as the kernel does, the K/V are charged at that rate
    report["memory_bandwidth"]["kv_reads"] = {"gb_s": 10.0}
    assert reach_limit(report)[1:] == pytest.approx((2.0, 10 / 12))  # type: ignore[index]
    assert "at 10.0 GB/s, as its pages are read here (scattered, nothing computed)" in (
        decode_reach_caption(report) or ""
    )
    report["memory_bandwidth"]["kv_reads"]["read_between_mb"] = 500.0  # the probe read a step's weights between
    assert "nothing computed, a step's weights read between)" in (decode_reach_caption(report) or "")
    del report["memory_bandwidth"]["kv_reads"]
    report["bf16"] = {"weight_mb_per_step": 250.0}  # the bfloat16 row counts its own weights
    report["efficiency"][BF16_RUN] = {"decode at batch >= 16": phase}
    report["bf16"]["gemm_peak"] = {"model_linears_gflop_s": {"32": 120.0}}
    assert reach_limit(report, BF16_RUN)[0] == pytest.approx(45.0)  # type: ignore[index]
    report["bf16"]["kv_reads"] = {"gb_s": 9.0}  # its own pool's rate, not the float32 row's
    assert reach_limit(report, BF16_RUN)[1] == pytest.approx(5.0)  # type: ignore[index]
    assert reach_limit(report)[1] == pytest.approx(1.0)  # type: ignore[index]
    del report["bf16"]["kv_reads"]
    report["runs"] = {"nanoengine": {}}
    (share,) = [t for t in decode_targets(report) if "share of its reach" in t.name]
    assert share.most_here == pytest.approx(0.9091) and "(here at most 90.9 %)" in fmt_limit(share.to_dict())
    del phase["gbytes"]  # an older report: the caption without the limit
    assert reach_limit(report) is None and "at most" not in (decode_reach_caption(report) or "")
    assert decode_targets(report)[0].most_here is None


# ---- the bfloat16 row (issue 39) -------------------------------------------------------------------
# Enough requests and tokens for a "decode at batch >= 16" phase whose roofline bound the report's
# rounding keeps above zero; nanoengine only, so each run takes seconds.
LONG_DECODE = ["--model", "tiny", "--num-requests", "24", "--input-len", "8", "32", "--output-len", "48", "96"]
NANOENGINE_ONLY = ["--threads", "1", "--kv-cache-memory-gb", "0.05", "--skip-hf", "--skip-tracer", "--skip-startup"]
NANOENGINE_ONLY += ["--skip-single", "--skip-model-only", "--json"]


def bench_report(tmp_path: Path, *extra: str) -> dict:
    out = tmp_path / "bench.json"
    assert bench_main([*LONG_DECODE, *NANOENGINE_ONLY, "--out", str(out), *extra]) == 0
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def bf16_report(tmp_path_factory) -> dict:
    if not cpu_has_bf16():
        pytest.skip("this CPU has neither AVX512_BF16 nor AMX: the bench runs no bfloat16 row here")
    return bench_report(tmp_path_factory.mktemp("bench-bf16"))


def test_the_bf16_row_runs_the_same_workload(bf16_report):
    runs, n = bf16_report["runs"], bf16_report["workload"]["num_requests"]
    assert list(runs) == ["nanoengine", BF16_RUN] and bf16_report["dtype"] == "float32"
    row, fp32 = runs[BF16_RUN], runs["nanoengine"]
    assert row["dtype"] == "bfloat16" and row["num_output_tokens"] == fp32["num_output_tokens"]
    assert row["over_float32"] == pytest.approx(row["output_tok_s"] / fp32["output_tok_s"], rel=1e-2)
    assert 0 <= row["matching_requests"] <= n and bf16_report["bf16_skipped"] is None


def test_the_bf16_row_has_its_own_peak_bytes_and_reach(bf16_report):
    bf16, fp32 = bf16_report["bf16"], bf16_report["gemm_peak"]
    assert bf16["gemm_peak"]["gflop_s"] == max(bf16["gemm_peak"]["measured_gflop_s"]) > 0
    assert set(bf16["gemm_peak"]["model_linears_gflop_s"]) == {"16", "24", "32"}
    if torch_has_onednn_bf16():
        assert "oneDNN" in bf16["gemm_peak"]["by_library"]
    # 2-byte weights and K/V: half of float32's bytes
    mem = bf16_report["memory_bandwidth"]
    assert bf16["weight_mb_per_step"] == pytest.approx(mem["weight_mb_per_step"] / 2, abs=0.1)
    assert bf16["kv_kb_per_key"] == pytest.approx(mem["kv_kb_per_key"] / 2, abs=0.01)
    phases, fp32_phases = bf16_report["efficiency"][BF16_RUN], bf16_report["efficiency"]["nanoengine"]
    assert list(phases) == list(fp32_phases)
    whole = phases["whole run"]
    assert whole["efficiency"] == pytest.approx(whole["gflop_s"] / bf16["gemm_peak"]["gflop_s"], rel=0.02)
    # the whole run reads the weights as many times in either dtype: its bytes halve
    assert whole["gbytes"] == pytest.approx(fp32_phases["whole run"]["gbytes"] / 2, abs=0.002)
    assert fp32["gflop_s"] != bf16["gemm_peak"]["gflop_s"]  # its own measure, not float32's copied
    share, seconds, _ = decode_reach(bf16_report, BF16_RUN)  # type: ignore[misc]
    assert 0 < share <= 1 and seconds > 0
    assert decode_reach(bf16_report, BF16_RUN) != decode_reach(bf16_report)


def test_the_bf16_row_is_judged_by_its_reach_and_against_float32(bf16_report, capsys):
    from tracer.bench.report import print_report

    targets = {t["name"]: t for t in bf16_report["targets"]}
    for key, dtype in (("nanoengine", "float32"), (BF16_RUN, "bfloat16")):
        value = targets[f"decode at batch >= 16: share of its reach ({dtype})"]["value"]
        assert value == reach_share(bf16_report, key) and value is not None and value > 0
    over = targets["decode at batch >= 16: bfloat16 over float32 (AMX hosts)"]
    decode = {k: bf16_report["efficiency"][k]["decode at batch >= 16"]["seconds"] for k in ("nanoengine", BF16_RUN)}
    assert over["value"] == pytest.approx(decode["nanoengine"] / decode[BF16_RUN])
    print_report(bf16_report)
    out = capsys.readouterr().out
    assert "nanoengine (bfloat16)" in out and "bfloat16 GEMM peak" in out and "Decode ceiling in bfloat16" in out
    assert "Reach in bfloat16" in out


def test_skip_bf16_leaves_the_row_out_and_says_so(tmp_path, capsys):
    report = bench_report(tmp_path, "--skip-bf16")
    assert list(report["runs"]) == ["nanoengine"] and list(report["efficiency"]) == ["nanoengine"]
    assert report["bf16"] is None and report["bf16_skipped"] == BF16_LEFT_OUT
    targets = {t["name"]: t for t in report["targets"]}
    assert "decode at batch >= 16: share of its reach (bfloat16)" not in targets
    assert targets["decode at batch >= 16: bfloat16 over float32 (AMX hosts)"]["value"] is None
    assert targets["decode at batch >= 16: share of its reach (float32)"]["value"] is not None
    from tracer.bench.report import print_report

    capsys.readouterr()
    print_report(report)
    assert BF16_LEFT_OUT in capsys.readouterr().out


def test_a_bfloat16_run_is_its_own_only_row(tmp_path):
    report = bench_report(tmp_path, "--dtype", "bfloat16")
    assert report["dtype"] == "bfloat16" and list(report["runs"]) == ["nanoengine"]
    assert report["bf16"] is None and report["bf16_skipped"] is None


def test_a_cpu_without_bf16_instructions_gets_a_reason_not_a_row(monkeypatch):
    import torch

    import nanoengine.loading.engine_parts as engine_parts

    cpu = torch.device("cpu")
    monkeypatch.setattr(engine_parts, "cpu_has_bf16", lambda: False)
    assert bf16_skip_reason(BenchSettings(), cpu, "float32") == NO_BF16_CPU
    monkeypatch.setattr(engine_parts, "cpu_has_bf16", lambda: True)
    assert bf16_skip_reason(BenchSettings(), cpu, "float32") is None
    assert bf16_skip_reason(BenchSettings(skip_bf16=True), cpu, "float32") == BF16_LEFT_OUT
    # a bfloat16 (or CUDA) run is its own only row: nothing to explain
    assert bf16_skip_reason(BenchSettings(), cpu, "bfloat16") is None
    assert bf16_skip_reason(BenchSettings(), torch.device("cuda"), "float32") is None


def torch_has_onednn_bf16() -> bool:
    import torch

    return ONEDNN and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def hand_built_report(fp32_decode: dict, bf16_decode: dict | None = None, dtype: str = "float32") -> dict:
    """A report with only what the targets read: runs, engine and the decode phases with their ceilings."""
    report: dict = {
        "dtype": dtype,
        "runs": {"nanoengine": {}, "hf_generate": {"nanoengine_speedup": 2.4}, "hf_generate_batch": {}},
        "engine": {},
        "gemm_peak": {"model_linears_gflop_s": {"16": 80.0, "32": 120.0}},
        "efficiency": {"nanoengine": {"decode at batch >= 16": fp32_decode}},
    }
    if bf16_decode is not None:
        report["runs"][BF16_RUN] = {}
        report["bf16"] = {"gemm_peak": {"model_linears_gflop_s": {"16": 300.0, "32": 400.0}}}
        report["efficiency"][BF16_RUN] = {"decode at batch >= 16": bf16_decode}
    return report


def targets_by_name(report: dict) -> dict[str, dict]:
    return {t["name"]: t for t in evaluate_targets(report)}


def test_decode_targets_are_shares_of_each_dtypes_reach():
    # float32: 1200 GFLOP at 120 GFLOP/s = 10 s against a 6 s bound: reach 60 %; the phase took 12.5 s,
    # 48 % of its bound, so 80 % of its reach. bfloat16: 1200 / 400 = 3 s under a 3 s bound: reach 100 %.
    fp32 = {"gflop": 1200.0, "bound_s": 6.0, "seconds": 12.5, "of_roofline": 0.48}
    bf16 = {"gflop": 1200.0, "bound_s": 3.0, "seconds": 5.0, "of_roofline": 0.6}
    targets = targets_by_name(hand_built_report(fp32, bf16))
    reach32 = targets["decode at batch >= 16: share of its reach (float32)"]
    assert reach32["value"] == pytest.approx(0.8) and reach32["met"] is True
    reach16 = targets["decode at batch >= 16: share of its reach (bfloat16)"]
    assert reach16["value"] == pytest.approx(0.6) and reach16["met"] is False
    over = targets["decode at batch >= 16: bfloat16 over float32 (AMX hosts)"]
    assert over["value"] == pytest.approx(2.5) and over["met"] is True
    throughput = targets["throughput vs HF generate"]
    assert (throughput["value"], throughput["limit"], throughput["met"]) == (2.4, 2.5, False)
    fp32["seconds"], fp32["of_roofline"] = 15.0, 0.4  # 2/3 of its reach; bfloat16 3x faster
    targets = targets_by_name(hand_built_report(fp32, bf16))
    assert targets["decode at batch >= 16: share of its reach (float32)"]["met"] is False
    assert targets["decode at batch >= 16: bfloat16 over float32 (AMX hosts)"]["value"] == pytest.approx(3.0)


def test_a_report_without_a_reach_shows_a_dash(capsys):
    from tracer.bench.report import targets_table

    # no ceiling measured, or a workload too short for the phase: not measured, never a crash
    no_ceiling = hand_built_report({"gflop": 1.0, "bound_s": 1.0, "seconds": 2.0, "of_roofline": 0.5})
    no_ceiling["gemm_peak"] = {}
    short = hand_built_report({"gflop": 0.0, "bound_s": 0.0, "seconds": 0.0, "of_roofline": None})
    bare = {"runs": {"nanoengine": {}}, "engine": {}}
    for report in (no_ceiling, short, bare):
        targets = evaluate_targets(report)
        by_name = {t["name"]: t for t in targets}
        share = by_name["decode at batch >= 16: share of its reach (float32)"]
        assert share["value"] is None and share["met"] is None
        assert by_name["decode at batch >= 16: bfloat16 over float32 (AMX hosts)"]["value"] is None
        from rich.console import Console

        Console(width=160).print(targets_table({"targets": targets}))
        row = next(line for line in capsys.readouterr().out.splitlines() if "share of its reach" in line)
        assert " - " in row and "not measured" in row
    # a bfloat16 run is not compared with itself
    bf16_run = hand_built_report({"gflop": 1.0, "bound_s": 1.0, "seconds": 2.0, "of_roofline": 0.5}, dtype="bfloat16")
    assert "decode at batch >= 16: share of its reach (bfloat16)" in targets_by_name(bf16_run)
    assert targets_by_name(bf16_run)["decode at batch >= 16: bfloat16 over float32 (AMX hosts)"]["value"] is None


def test_the_profile_counts_the_few_row_kernel_as_linear():
    """Linears of a few rows run in C through ctypes (tracer/kernels/packed_gemv.c), where
    torch.profiler sees nothing unless the bench names them: a step of 8 rows or fewer has no oneDNN
    linear op at all, and its linear time must still be found. (Such a decode step runs all its
    layers in one C call outside the profile: here the loop, layer by layer.)"""
    from torch.profiler import ProfilerActivity, profile

    from tracer.bench.op_profile import CATEGORIES, classify, instrument, uninstrument
    from tracer.kernels.choose import build_engine
    from tracer.kernels.decode_layers import DecodeLayers
    from tracer.kernels.packed_linear import FewRowsLinear

    engine = build_engine("tiny", {"num_threads": 1})
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    engine.add_request([5, 6, 7], params)  # the first calls compare with oneDNN: not profiled
    while engine.has_unfinished():
        engine.step()
    instrument(engine)
    try:
        engine.add_request([8, 9, 10], params)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            while engine.has_unfinished():
                engine.step()
    finally:
        uninstrument()
    assert FewRowsLinear.kernel.__qualname__ == "FewRowsLinear.kernel"  # restored
    assert DecodeLayers.fits.__qualname__ == "DecodeLayers.fits"
    names = [event.name for event in prof.events()]
    linears_a_step = 4 * engine.model.config.num_hidden_layers + 1  # and the LM head
    assert names.count("linear") == 4 * linears_a_step and "mkldnn::_linear_pointwise" not in names
    totals = dict.fromkeys(CATEGORIES, 0.0)
    for step in (event for event in prof.events() if event.name == "step" and event.cpu_parent is None):
        classify(step, False, totals)
    assert totals["linear"] > 0


def test_a_bfloat16_kv_cache_run_says_so_and_counts_its_own_kv_bytes(tmp_path):
    """--kv-cache-dtype bfloat16: the header and the reach target name the cache, and nanoengine's
    roofline reads two bytes a K/V number (the baselines keep their own)."""
    narrow = bench_report(tmp_path, "--kv-cache-dtype", "bfloat16", "--skip-bf16")
    assert narrow["engine_options"]["kv_cache_dtype"] == "bfloat16"
    assert narrow["attention"].endswith(", KV cache in bfloat16")
    (reach,) = [t for t in narrow["targets"] if "share of its reach" in t["name"]]
    assert reach["name"].endswith("(float32, KV cache in bfloat16)")
    wide = bench_report(tmp_path, "--skip-bf16")
    assert "KV cache" not in wide["attention"]
    phases = [decode_phase(r) for r in (narrow, wide)]
    assert phases[0]["min_steps"] == phases[1]["min_steps"]  # the same schedule: twice the blocks never bind
    weights = phases[1]["min_steps"] * wide["memory_bandwidth"]["weight_mb_per_step"] / 1e3
    # gbytes is rounded to 1 MB, the weights to 0.1 MB a step
    assert phases[0]["gbytes"] - weights == pytest.approx((phases[1]["gbytes"] - weights) / 2, abs=0.003)
    kb = [r["memory_bandwidth"]["kv_kb_per_key"] for r in (narrow, wide)]
    assert kb[0] == pytest.approx(kb[1] / 2, abs=0.01)
