"""`nanoengine trace --no-tui`, `nanoengine check` and `nanoengine replay` argument handling."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import (
    HANG_S,
    SCENARIO_PARAMS,
    SCENARIO_PROMPTS,
    make_tiny_engine,
    one_line_error,
    record_two_chunked,
)
from interrupt_at import interrupted_at

from tracer.cli.main import main
from tracer.trace.invariants import check_trace
from tracer.trace.recorder import TraceRecorder
from tracer.trace.trace_file import load_trace

pytestmark = pytest.mark.usefixtures("one_torch_thread")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
TINY_FLAGS = [
    "--model",
    "tiny",
    "--max-tokens",
    "6",
    "--ignore-eos",
    "--block-size",
    "4",
    "--num-kv-blocks",
    "12",
    "--max-num-batched-tokens",
    "8",
]


@pytest.fixture
def partial_trace(tmp_path) -> Path:
    """A real run stopped after 3 prefill steps: nothing has finished yet."""
    engine = make_tiny_engine()
    path = tmp_path / "partial.jsonl"
    with TraceRecorder(engine, path):
        for prompt in SCENARIO_PROMPTS:
            engine.add_request(prompt, SCENARIO_PARAMS)
        for _ in range(3):
            engine.step()
    return path


def test_trace_no_tui_writes_the_default_path_and_prints_a_summary(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["trace", "hello world, how are you", "hello world, how is it", "abc", *TINY_FLAGS, "--no-tui"]) == 0
    out = capsys.readouterr().out
    written = list((tmp_path / "traces").glob("trace-*.jsonl"))
    assert len(written) == 1 and f"traces/{written[0].name}" in out.replace("\n", "")
    for label in ("steps", "preemptions", "prefix-cache hits", "chunked prefills", "Requests"):
        assert label in out
    trace = load_trace(written[0])
    assert f"│ steps             │ {trace.num_steps}" in out
    assert ("No invariant violations" in out) == (check_trace(trace) == [])


def test_trace_out_and_title(tmp_path, capsys):
    out = tmp_path / "sub" / "mine.jsonl"
    assert main(["trace", "abc", *TINY_FLAGS, "--out", str(out), "--title", "my run", "--no-tui"]) == 0
    assert load_trace(out).title == "my run" and "my run" in capsys.readouterr().out


def test_trace_with_a_bad_prompt_fails_in_one_line_before_writing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["trace", "x" * 100, *TINY_FLAGS, "--max-model-len", "50", "--no-tui"]) == 2
    assert "max_model_len is 50" in one_line_error(capsys.readouterr().err)
    assert not (tmp_path / "traces").exists()


def test_check_passes_a_clean_trace(partial_trace, capsys):
    assert main(["check", str(partial_trace)]) == 0
    assert "OK" in capsys.readouterr().out


def test_check_fails_on_a_violation_and_shows_it(partial_trace, tmp_path, capsys):
    lines = partial_trace.read_text().splitlines()
    step = json.loads(lines[2])
    step["inputs"]["positions"][0] += 1
    lines[2] = json.dumps(step)
    broken = tmp_path / "broken.jsonl"
    broken.write_text("\n".join(lines) + "\n")
    assert main(["check", str(broken)]) == 1
    out = capsys.readouterr().out
    assert "Invariant violations" in out and "positions" in out and "invariant violations in 3 steps" in out


@pytest.mark.parametrize(
    "content, expected",
    [
        ("", "is empty"),
        ("not json\n", "not a nanoengine trace"),
        ('{"type": "header", "schema_version": 7}\n', "newer than this nanoengine reads"),
    ],
)
def test_check_on_a_broken_file_is_a_one_line_error(tmp_path, capsys, content, expected):
    path = tmp_path / "t.jsonl"
    path.write_text(content)
    assert main(["check", str(path)]) == 2
    assert expected in one_line_error(capsys.readouterr().err)


def test_check_full_validates_every_line(partial_trace, tmp_path, capsys):
    lines = partial_trace.read_text().splitlines()
    lines += lines[1:] * 3  # 12 steps, so line 3 is outside the default sample
    for i in range(1, len(lines)):
        step = json.loads(lines[i])
        step["step"] = i - 1
        if i == 6:
            step["wall_time"] = "slow"
        lines[i] = json.dumps(step)
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    main(["check", str(path)])
    capsys.readouterr()
    assert main(["check", str(path), "--full"]) == 2
    assert "line 7 does not match the trace schema" in one_line_error(capsys.readouterr().err)


def test_check_warns_about_a_cut_short_trace_and_checks_its_prefix(partial_trace, tmp_path, capsys):
    cut = tmp_path / "cut.jsonl"
    cut.write_text(partial_trace.read_text()[:-100])
    assert main(["check", str(cut)]) == 0
    captured = capsys.readouterr()
    assert "cut short" in captured.err and "2 steps" in captured.out


def test_replay_refuses_what_it_cannot_show(partial_trace, tmp_path, capsys):
    assert main(["replay", str(tmp_path / "missing.jsonl")]) == 2
    assert "no such trace file" in one_line_error(capsys.readouterr().err)
    assert main(["replay", str(partial_trace), "--step", "3"]) == 2
    assert "choose 0 .. 2" in one_line_error(capsys.readouterr().err)
    empty = tmp_path / "empty.jsonl"
    with TraceRecorder(make_tiny_engine(), empty):
        pass
    assert main(["replay", str(empty)]) == 2
    assert "no steps" in one_line_error(capsys.readouterr().err)


def test_replay_text_prints_a_steps_narration_with_its_whys(tmp_path, capsys):
    """`replay --step N --text` needs no terminal: the step's narration, each decision with its why."""
    path = record_two_chunked(tmp_path / "t.jsonl")
    assert main(["replay", str(path), "--step", "0", "--text"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Step 0: seq ") and "(takes 2 of the " in out
    assert "prefilled 8 of 12 prompt tokens (chunk 1 of 2: the whole 8-token budget)" in out
    assert "was not admitted: the 8-token budget is spent." in out
    assert main(["replay", str(path), "--step", "99", "--text"]) == 2
    assert "step 99 is outside the trace" in capsys.readouterr().err
    assert main(["replay", str(path), "--text", "--web"]) == 2
    assert "cannot be combined" in capsys.readouterr().err


def test_ctrl_c_during_trace_leaves_a_replayable_trace(tmp_path):
    out = tmp_path / "t.jsonl"
    argv = ["trace", "one", "two", *TINY_FLAGS, "--max-tokens", "40", "--no-tui", "--out", str(out)]
    # Ctrl-C in the middle of the 7th step's forward pass: steps 0-5 are recorded
    result = interrupted_at("call:nanoengine.model_runner:ModelRunner.run:7", argv, ENV)
    assert result.returncode == 130, result.stderr
    assert "Interrupted after 6 recorded steps" in result.stderr
    assert f"nanoengine replay {out}" in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr
    trace = load_trace(out)
    assert trace.num_steps == 6 and check_trace(trace) == []


def test_trace_without_a_terminal_prints_the_summary_and_replay_refuses(tmp_path):
    out = tmp_path / "t.jsonl"
    base = [sys.executable, "-m", "tracer.cli.main"]
    traced = subprocess.run(
        [*base, "trace", "hello", "--model", "tiny", "--max-tokens", "3", "--out", str(out)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=ENV,
    )
    assert traced.returncode == 0, traced.stderr
    assert "Not an interactive terminal" in traced.stderr and "violations" in traced.stdout
    replay = subprocess.run(
        [*base, "replay", str(out)], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=HANG_S, env=ENV
    )
    assert replay.returncode == 2
    assert "needs an interactive terminal" in replay.stderr and len(replay.stderr.strip().splitlines()) == 1


def test_check_list_names_every_invariant_with_its_rule(capsys, monkeypatch):
    from tracer.trace.invariants import INVARIANTS

    monkeypatch.setenv("COLUMNS", "300")
    assert main(["check", "--list"]) == 0
    out = capsys.readouterr().out
    for name, rule in INVARIANTS.items():
        assert name in out and rule in out, name
    assert main(["check"]) == 2
    assert "--list" in capsys.readouterr().err
