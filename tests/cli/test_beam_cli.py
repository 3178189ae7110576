"""`--beam-width K` on `nanoengine generate` and `trace`, and `nanoengine demo beam-search`: each beam
printed with its score under its own header, flags that make no sense with it refused in one line,
the search traced as one request's beams, the demo pointing at a fork, a copy and a pruned beam."""

from __future__ import annotations

import pytest
from conftest import one_line_error

from nanoengine import LLM, BeamSearchParams
from tracer.cli.demo import demo_main
from tracer.cli.main import main
from tracer.teach.demos import DEMOS
from tracer.trace.invariants import check_trace
from tracer.trace.trace_file import load_trace

pytestmark = pytest.mark.usefixtures("one_torch_thread")
FLAGS = ["--model", "tiny", "--threads", "1", "--max-tokens", "6", "--block-size", "4", "--ignore-eos"]


def test_generate_prints_each_beam_with_its_score_under_its_header(capsys):
    assert main(["generate", *FLAGS, "--beam-width", "3", "--length-penalty", "0.5", "Beams!"]) == 0
    out = capsys.readouterr().out
    (expected,) = LLM("tiny", num_threads=1, block_size=4).beam_search(
        ["Beams!"], BeamSearchParams(beam_width=3, max_tokens=6, ignore_eos=True, length_penalty=0.5)
    )
    headers = [line for line in out.splitlines() if line.startswith("--- [0]")]
    assert len(headers) == 3
    for rank, (header, beam) in enumerate(zip(headers, expected.sequences)):
        score = beam.cum_logprob / len(beam.tokens) ** 0.5  # the prompt counts, no EOS to leave out
        assert header == f"--- [0] (beam {rank}, score {score:.4f}, length) Beams!"
        assert f"{header}\n{beam.text}\n" in out
    scores = [float(h.split("score ")[1].split(",")[0]) for h in headers]
    assert scores == sorted(scores, reverse=True)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--beam-width", "2", "--n", "2"], "--n 2 draws 2 samples"),
        (["--beam-width", "2", "--top-p", "0.5", "--seed", "3"], "--top-p, --seed only shape a random draw"),
        (["--beam-width", "2", "--min-tokens", "2"], "--min-tokens"),
        (["--length-penalty", "2"], "give --beam-width too"),
        (["--beam-width", "0"], "beam_width must be"),
        (["--beam-width", "11"], "beam_width must be"),
    ],
)
def test_flags_that_make_no_sense_with_a_beam_search_are_one_line(capsys, argv, words):
    assert main(["generate", "--model", "tiny", *argv, "hi"]) == 2
    assert words in one_line_error(capsys.readouterr().err)


def test_trace_records_a_beam_search_as_one_request_of_beams(tmp_path, capsys):
    path = tmp_path / "beams.jsonl"
    assert main(["trace", *FLAGS, "--beam-width", "3", "--no-tui", "--out", str(path), "Beams!"]) == 0
    capsys.readouterr()
    trace = load_trace(path, validate="all")
    assert check_trace(trace) == []
    rows = [row for step in trace.steps for row in step["seqs"]]
    assert {row.get("beam_width") for row in rows} == {3}
    assert {row.get("request_id", row["seq_id"]) for row in rows} == {rows[0]["seq_id"]}
    kinds = {e["kind"] for step in trace.steps for e in step["events"]}
    assert {"forked", "copy_on_write"} <= kinds
    assert main(["trace", *FLAGS, "--beam-width", "3", "--live", "Beams!"]) == 2
    assert "cannot record a beam search" in one_line_error(capsys.readouterr().err)


def test_demo_beam_search_points_at_a_fork_a_copy_and_a_pruned_beam(tmp_path, capsys):
    assert demo_main(["beam-search", "--model", "tiny", "--no-tui", "--threads", "1", "--out-dir", str(tmp_path)]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    trace = load_trace(tmp_path / "demo-beam-search.jsonl", validate="all")
    assert check_trace(trace) == []
    focus = trace.header["focus_step"]
    assert any(e["kind"] == "copy_on_write" for e in trace.steps[focus]["events"])
    look_for = printed.split("Look for: ", 1)[1]
    assert look_for.startswith(f"Step {focus}: ") and "gets a copy" in look_for
    assert "was forked from" in look_for and "is pruned" in look_for
    assert "the 3 beams, best first" in printed and "blocks copied on write" in printed
    assert trace.header["look_for"].startswith(f"Step {focus}: ")


def test_demo_beam_search_is_listed_and_refuses_vs_vllm_in_one_line(tmp_path, capsys):
    assert demo_main(["list"]) == 0
    assert "beam-search" in capsys.readouterr().out and "beam-search" in DEMOS
    with pytest.raises(ValueError, match="vLLM v1's scheduler runs no beam search"):
        demo_main(["beam-search", "--model", "tiny", "--vs-vllm", "--no-tui", "--out-dir", str(tmp_path)])
