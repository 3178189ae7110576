"""`--n` on the command line: n samples of each prompt, printed under their own headers, traced as
one request's sequences."""

from __future__ import annotations

import pytest

from nanoengine import LLM, SamplingParams
from tracer.cli.main import main
from tracer.trace.invariants import check_trace
from tracer.trace.trace_file import load_trace

pytestmark = pytest.mark.usefixtures("one_torch_thread")
FLAGS = ["--model", "tiny", "--threads", "1", "--temperature", "1", "--seed", "5", "--max-tokens", "6"]


def test_generate_prints_each_sample_under_its_header(capsys):
    assert main(["generate", *FLAGS, "--n", "3", "hi"]) == 0
    out = capsys.readouterr().out
    headers = [line for line in out.splitlines() if line.startswith("--- [0]")]
    assert headers == ["--- [0] (sample 0) hi", "--- [0] (sample 1) hi", "--- [0] (sample 2) hi"]
    (expected,) = LLM("tiny", num_threads=1).generate(
        ["hi"], SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=6)
    )
    for c in expected.outputs:
        assert f"--- [0] (sample {c.index}) hi\n{c.text}" in out


def test_trace_records_the_samples_as_one_request(tmp_path, capsys):
    path = tmp_path / "n.jsonl"
    assert main(["trace", *FLAGS, "--n", "2", "--no-tui", "--out", str(path), "hi"]) == 0
    capsys.readouterr()
    trace = load_trace(path)
    assert not check_trace(trace)
    rows = trace.steps[0]["seqs"]
    assert [row.get("request_id", row["seq_id"]) for row in rows] == [rows[0]["seq_id"]] * 2
    seeds = [trace.requests[row["seq_id"]]["params"]["seed"] for row in rows]
    assert seeds == [5, 6]  # sample i draws with seed + i


def test_n_zero_is_one_line(capsys):
    assert main(["generate", "--model", "tiny", "--n", "0", "hi"]) == 2
    err = capsys.readouterr().err
    assert "n must be" in err and err.count("\n") == 1
