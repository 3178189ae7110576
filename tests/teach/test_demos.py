"""Classroom demos on the tiny model: each runs headless, its traces pass the invariant checker,
and it shows what it claims to show. One test exports SVG frames."""

from __future__ import annotations

import pytest

from tracer.cli.demo import demo_main
from tracer.replay.colors import seq_letter
from tracer.teach.demos import DEMOS, look_for, run_demo
from tracer.trace.invariants import check_trace
from tracer.trace.trace_file import load_trace


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("demos")
    return {name: run_demo(demo, "tiny", out) for name, demo in DEMOS.items()}


@pytest.mark.parametrize("name", sorted(DEMOS))
def test_demo_traces_pass_the_invariant_checker(runs, name):
    for run in runs[name]:
        trace = load_trace(run.trace_path, validate="all")
        assert check_trace(trace) == [] and run.violations == []
        assert trace.header["focus_step"] == run.focus_step
        kind = run.scenario.focus.get("event")
        if kind:
            assert any(e["kind"] == kind for e in trace.steps[run.focus_step]["events"])


def test_prefix_sharing_reuses_blocks(runs):
    run = runs["prefix-sharing"][0]
    assert run.event_counts["prefix_hit"] == 3
    assert sum(run.prefix_hits.values()) > sum(len(o.prompt_token_ids) for o in run.outputs) // 2


def test_chunked_prefill_stays_within_budget_and_keeps_decoding(runs):
    run = runs["chunked-prefill"][0]
    budget = run.scenario.engine["max_num_batched_tokens"]
    assert max(s.num_batched_tokens for s in run.steps) <= budget
    chunk_steps = [s for s in run.steps if any(i == 2 and n > 1 for i, n in s.batch)]
    assert len(chunk_steps) >= 3
    assert all(any(i in (0, 1) and n == 1 for i, n in s.batch) for s in chunk_steps[:3])


def test_preemption_preempts_and_recomputes(runs):
    run = runs["preemption"][0]
    assert run.event_counts["preempted"] >= 1
    assert run.event_counts["admitted"] > len(run.outputs)  # someone came back
    assert all(o.finish_reason == "length" for o in run.outputs)


def test_static_batching_takes_more_steps_for_the_same_outputs(runs):
    continuous, static = runs["continuous-vs-static"]
    assert static.num_steps > continuous.num_steps
    assert [o.token_ids for o in static.outputs] == [o.token_ids for o in continuous.outputs]
    # static: nobody is admitted while a batch is still running
    for step in static.steps:
        admitted = {i for kind, i in step.events if kind == "admitted"}
        already_running = {i for i, _ in step.batch} - admitted
        assert not (admitted and already_running), f"step {step.step} admitted into a running batch"


def test_demo_cli_exports_svg_frames(tmp_path, capsys):
    export = tmp_path / "frames"
    code = demo_main(
        [
            "continuous-vs-static",
            "--model",
            "tiny",
            "--export",
            str(export),
            "--steps",
            "3,99",
            "--out-dir",
            str(tmp_path),
            "--size",
            "120x40",
        ]
    )
    assert code == 0
    names = sorted(p.name for p in export.iterdir())
    assert names == ["continuous-step-003.svg", "static-step-003.svg"]  # step 99 is past both traces: skipped
    svg = (export / "continuous-step-003.svg").read_text()
    assert svg.startswith("<svg") and "nanoengine" in svg
    printed = capsys.readouterr().out
    assert "Continuous batching needed" in printed and "skipping step(s) 99" in printed


def test_demo_list_and_errors(tmp_path, capsys):
    assert demo_main(["list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in DEMOS)
    with pytest.raises(ValueError, match="no demo 'nope'"):
        demo_main(["nope"])
    with pytest.raises(ValueError, match="--steps"):
        demo_main(["preemption", "--model", "tiny", "--steps", "a,b", "--no-tui", "--out-dir", str(tmp_path)])


@pytest.mark.real_model
def test_prefix_sharing_with_the_real_model(tmp_path):
    """SmolLM2's chat template and a shared note: every later request reuses the first one's blocks."""
    (run,) = run_demo(DEMOS["prefix-sharing"], "default", tmp_path)
    assert run.violations == [] and run.event_counts["prefix_hit"] == 3
    assert all(o.text.strip() for o in run.outputs)


@pytest.mark.parametrize("name", sorted(DEMOS))
def test_look_for_is_written_from_what_the_trace_shows(runs, name):
    run = runs[name][0]
    focus = load_trace(run.trace_path).steps[run.focus_step]
    event = next(e for e in focus["events"] if e["kind"] == run.scenario.focus["event"])
    text = look_for(run)
    assert text != run.scenario.look_for and text.startswith(f"Step {run.focus_step}:")
    assert f"seq {event['seq_id']} ({seq_letter(event['seq_id'])})" in text
    if name == "preemption":  # it names the sequence that needed the block, from the event's `by`
        needer = event["detail"]["by"]
        assert text.startswith(f"Step {run.focus_step}: seq {needer} ") and "needs a new KV block" in text


def test_demo_takes_the_shared_engine_flags(tmp_path, capsys):
    code = demo_main(
        ["preemption", "--model", "tiny", "--no-tui", "--out-dir", str(tmp_path), "--threads", "1"]
        + ["--block-size", "8", "--num-kv-blocks", "40", "--max-num-seqs", "2"]
    )
    assert code == 0
    config = load_trace(tmp_path / "demo-preemption.jsonl").header["config"]
    assert (config["block_size"], config["num_kv_blocks"], config["max_num_seqs"]) == (8, 40, 2)
    assert config["max_num_batched_tokens"] == DEMOS["preemption"].build(True).engine.get(
        "max_num_batched_tokens", config["max_num_batched_tokens"]
    )
    assert "Look for:" in capsys.readouterr().out
    with pytest.raises(ValueError, match="--block-size must be >= 1"):
        demo_main(["preemption", "--model", "tiny", "--no-tui", "--out-dir", str(tmp_path), "--block-size", "0"])


def test_continuous_vs_static_says_how_to_open_the_static_trace(tmp_path, capsys):
    assert demo_main(["continuous-vs-static", "--model", "tiny", "--no-tui", "--out-dir", str(tmp_path)]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert f"nanoengine replay {tmp_path / 'demo-continuous-vs-static-static.jsonl'}" in printed


def test_vs_vllm_without_the_models_vllm_trace_says_so_before_using_the_tiny_model(tmp_path, capsys, monkeypatch):
    """Issue 37: --vs-vllm on the default model no longer turns silently into a tiny-model run."""
    from tracer.vllm.scenarios import TRACES_DIR

    if (TRACES_DIR / "demo-preemption.default.jsonl").exists():
        pytest.skip("vLLM's trace of the demo on the default model's token ids is committed")
    monkeypatch.delenv("NANOENGINE_VLLM_PYTHON", raising=False)
    assert demo_main(["preemption", "--vs-vllm", "--no-tui", "--out-dir", str(tmp_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "not recorded yet" in out and "NANOENGINE_VLLM_PYTHON" in out and "model tiny" in out
    with pytest.raises(ValueError, match="NANOENGINE_VLLM_PYTHON"):
        demo_main(["preemption", "--vs-vllm", "--block-size", "8", "--no-tui", "--out-dir", str(tmp_path)])
