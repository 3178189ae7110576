"""The n samples of a request in the replay (tracer/replay/samples.py): one bracket and request.sample
in the sequences panel, a why for a sample's hit on its sibling's blocks, a new token's logprob where
the trace recorded it; a trace of one-sample requests replays as before.

The trace is the committed vLLM v1 trace of issue 33's parallel-sampling workload: seq 0 alone, seqs
1-4 the four samples of request 1 (2-4 admitted at step 2, hitting 1's seven full prompt blocks),
seqs 5-6 the two samples of request 5 (admitted together at step 4)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_async

from nanoengine import SamplingParams
from tracer.replay.app import ReplayApp
from tracer.replay.narration import narrate
from tracer.replay.samples import Sample, group_label, logprob_label, samples_of, sibling_hit
from tracer.replay.views.sequences import SequencesView, plain, text_cell
from tracer.trace.recorder import record_run
from tracer.trace.trace_file import load_trace

TRACE = Path(__file__).parents[2] / "tracer" / "vllm" / "traces" / "parallel-sampling.jsonl"
SMALL = Path(__file__).parents[1] / "data" / "replay_small.jsonl"


@pytest.fixture(scope="module")
def trace():
    return load_trace(TRACE)


def test_samples_are_grouped_by_request_in_seq_id_order(trace):
    samples = samples_of(trace.steps[-1]["seqs"])
    assert sorted(samples) == [1, 2, 3, 4, 5, 6]  # seq 0 is a request of one: no label
    assert samples[3] == Sample(1, 2, 4) and samples[6] == Sample(5, 1, 2)
    labels = [group_label(samples.get(s)) for s in range(7)]
    assert labels == ["", "┌1.0", "├1.1", "├1.2", "└1.3", "┌5.0", "└5.1"]


def test_a_one_sample_trace_gets_no_labels():
    small = load_trace(SMALL)
    assert all(samples_of(step["seqs"]) == {} for step in small.steps)


def test_a_samples_hit_on_its_siblings_blocks_says_why(trace):
    text = narrate(trace.steps[2], trace.header)
    for i, seq in ((1, 2), (2, 3), (3, 4)):
        assert (
            f"seq {seq} ({'ABCDE'[seq]}) was admitted to RUNNING, reused 28 cached tokens" in text
            and f"sample {i} of request 1 shares the prompt's 7 full blocks with sample 0: n samples are n "
            "sequences that meet in the prefix cache, as in vLLM v1"
            in text
        )


def test_a_hit_on_another_requests_blocks_is_not_called_a_siblings(trace):
    """Request 5's sample 0 hits request 1's prompt blocks; its sample 1 then shares them with it."""
    seqs = {s["seq_id"]: s for s in trace.steps[4]["seqs"]}
    hits = {e["seq_id"]: e["detail"]["blocks"] for e in trace.steps[4]["events"] if e["kind"] == "prefix_hit"}
    assert sibling_hit(hits[5], seqs[5], seqs) is None
    assert "sample 1 of request 5 shares the prompt's 6 full blocks with sample 0" in (
        sibling_hit(hits[6], seqs[6], seqs) or ""
    )
    assert sibling_hit(hits[5], seqs[0], seqs) is None  # a request of one sequence


@run_async
async def test_the_sequences_panel_draws_the_group(trace):
    app = ReplayApp(trace, start_step=4, animations=False)
    async with app.run_test(size=(140, 30)):
        view = app.query_one(SequencesView)
        tags = [plain(row[0]) for row in view.rows]
    assert tags == ["A#0", "B#1 ┌1.0", "C#2 ├1.1", "D#3 ├1.2", "E#4 └1.3", "F#5 ┌5.0", "G#6 └5.1"]


def test_a_new_tokens_logprob_is_shown_beside_it(tmp_path):
    path, _ = record_run(
        ["hi", "yo"],
        [SamplingParams(max_tokens=3, logprobs=0), SamplingParams(max_tokens=3)],
        tmp_path / "t.jsonl",
        model="tiny",
        num_threads=1,
    )
    step = load_trace(path).steps[1]
    asked, plain_row = step["seqs"]
    (value,) = asked["new_token_logprobs"]
    assert logprob_label(asked) == f" logprob {value:.2f}" and value <= 0
    assert logprob_label(plain_row) == ""
    assert plain(text_cell(asked, [], 60)).endswith(f"logprob {value:.2f}")
    assert "logprob" not in plain(text_cell(plain_row, [], 60))
