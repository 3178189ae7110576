"""tracer/bench/sharing.py: KV blocks the n samples of a request save by sharing the prompt, read from
two traces of one workload (prefix caching on and off), split into the samples' own sharing and the
prompts' (the chat template's system prompt)."""

from __future__ import annotations

import pytest

from tracer.bench.sharing import SharingSpec, for_model, main, measure, own_copies, usage_of

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = SharingSpec(num_prompts=3, n=3, max_tokens=6, block_size=4)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return measure(SMALL, tmp_path_factory.mktemp("sharing"))


def test_sharing_holds_fewer_blocks_and_says_who_shares(report):
    shared, alone = report["sharing"], report["no_sharing"]
    assert shared["peak"] < alone["peak"] and shared["mean"] < alone["mean"]
    assert alone["saved_by_samples"] == alone["saved_across_prompts"] == 0  # nothing shared with caching off
    assert shared["saved_by_samples"] > 0 and shared["saved_across_prompts"] > 0  # the system prompt
    assert 0 < report["saved_peak_pct"] < 100 and report["samples_share_pct"] > report["prompts_share_pct"]


def test_every_copy_sharing_saves_is_a_block_the_unshared_run_holds(report):
    """Same schedule in both runs (every prompt fits one step's budget): at every step the sharing run's
    blocks plus the copies its sharing saves are exactly the blocks the run without sharing holds."""
    shared, alone = report["sharing"], report["no_sharing"]
    assert shared["steps"] == alone["steps"]
    assert shared["block_steps"] + shared["saved_by_samples"] + shared["saved_across_prompts"] == alone["block_steps"]


def test_the_samples_of_one_prompt_share_its_full_blocks(tmp_path):
    from tracer.bench.sharing import default_model_prompts, record

    prompts = for_model(default_model_prompts(1), "tiny")
    usage = usage_of(record(SharingSpec(1, 4, 3, "tiny", 4), prompts, tmp_path / "t.jsonl", True))
    full = (len(prompts[0]) - 1) // 4  # the last prompt token is always computed: its block is not hit
    held = usage.steps - 1  # at the last step all four have finished and hold nothing
    assert usage.saved_by_samples == 3 * full * held and usage.saved_across_prompts == 0
    assert own_copies(usage) == usage.block_steps + 3 * full * held


def test_folding_into_the_tiny_vocabulary_keeps_equal_ids_equal():
    folded = for_model([[5, 49000, 5], [49000, 7]], "tiny")
    assert folded[0][0] == folded[0][2] and folded[0][1] == folded[1][0]
    assert all(3 <= t < 260 for p in folded for t in p)
    assert for_model([[49000]], "default") == [[49000]]


def test_a_bad_count_is_one_line(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--n", "0"])
    assert info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("--n must be at least 1, got 0")


def test_beams_hold_fewer_blocks_than_their_own_copies_and_fork_and_copy(tmp_path):
    from tracer.bench.sharing import beam_usage_of, default_model_prompts, record
    from tracer.trace.trace_file import load_trace

    spec = SharingSpec(num_prompts=2, max_tokens=8, block_size=4, beam_width=3)
    path = record(spec, for_model(default_model_prompts(2), "tiny"), tmp_path / "beams.jsonl", False)
    usage = beam_usage_of(path)
    assert usage.forks > 0 and usage.copies_on_write > 0
    assert usage.peak < usage.peak_own_copies and usage.mean < usage.mean_own_copies
    for step in load_trace(path, validate="none").steps:  # each holder's own copy: the sum of ref counts
        listed = sum(len(r["block_table_after"]) for r in step["seqs"] if r["status_after"] != "FINISHED")
        assert listed == sum(step["pool"]["ref_counts"])


def test_a_bad_beam_width_is_one_line(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--beam-width", "11"])
    assert info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("--beam-width must be in [1, 10], got 11")
