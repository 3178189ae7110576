"""`nanoengine bench --serving`: its arrivals, its arithmetic, and one real run on the tiny model
through `nanoengine serve` (figures are not asserted: speed targets live in docs/benchmarks.md)."""

from __future__ import annotations

import json
import statistics

import pytest

from tracer.bench.serving import RequestResult, poisson_delays, summarize, summary_line
from tracer.cli.main import main


def test_poisson_arrivals_are_seeded_and_have_the_asked_rate():
    delays = poisson_delays(2000, 4.0, seed=1)
    assert delays == poisson_delays(2000, 4.0, seed=1) and delays[0] == 0.0
    gaps = [b - a for a, b in zip(delays, delays[1:])]
    assert all(g > 0 for g in gaps) and 0.22 < statistics.mean(gaps) < 0.28  # 1 / rate = 0.25 s
    assert poisson_delays(5, float("inf"), seed=1) == [0.0] * 5


def test_summary_counts_goodput_under_the_slo():
    results = [
        RequestResult(True, 10, 11, ttft=0.5, latency=1.5, itl=[0.1] * 10),  # tpot 0.1: good
        RequestResult(True, 10, 11, ttft=3.0, latency=4.0, itl=[0.1] * 10),  # ttft over the SLO
        RequestResult(True, 10, 3, ttft=0.2, latency=1.2, itl=[0.5, 0.5]),  # tpot 0.5: over
        RequestResult(False, error="HTTP 500"),
    ]
    s = summarize(results, duration=2.0, slo_ttft_s=1.0, slo_tpot_s=0.2)
    assert (s["completed"], s["failed"], s["good_requests"]) == (3, 1, 1)
    assert s["goodput"] == 0.5 and s["request_throughput"] == 1.5 and s["output_tok_s"] == 12.5
    assert s["ttft_ms"]["p50"] == 500.0 and s["tpot_ms"]["p50"] == 100.0 and s["errors"] == ["HTTP 500"]
    line = summary_line(s)  # the progress log's line for this run
    assert line.startswith("3 done in 2.00 s, 12.5 output tok/s, TTFT p99 ") and line.endswith("; 1 failed: HTTP 500")
    assert ", TPOT p99 " in line and "{" not in line
    assert summary_line(summarize([RequestResult(False, error="refused")], 1.0, 1.0, 0.2)) == (
        "0 done in 1.00 s, 0.0 output tok/s; 1 failed: refused"
    )


def test_a_serving_run_on_the_tiny_model_completes_every_request(tmp_path, capsys):
    out = tmp_path / "serving.json"
    argv = ["bench", "--serving", "--model", "tiny", "--quick", "--num-requests", "6", "--rate", "8,inf"]
    assert main([*argv, "--skip-hf", "--threads", "1", "--json", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    runs = report["results"]["nanoengine serve"]
    assert set(runs) == {"8.0", "inf"}
    for run in runs.values():
        assert run["completed"] == 6 and run["failed"] == 0
        assert run["ttft_ms"]["p50"] > 0 and run["tpot_ms"]["p99"] >= run["tpot_ms"]["p50"] > 0
        assert run["output_tokens"] == report["num_output_tokens"]  # every token asked, as the server counted
        assert run["output_tok_s"] == pytest.approx(run["output_tokens"] / run["duration_s"], rel=1e-2)


@pytest.mark.parametrize("rate, expected", [("fast", "comma"), ("0", "must be > 0"), ("1,-2", "must be > 0")])
def test_a_bad_rate_is_one_line(capsys, rate, expected):
    assert main(["bench", "--serving", "--model", "tiny", "--rate", rate, "--skip-hf"]) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and "\n" not in err
