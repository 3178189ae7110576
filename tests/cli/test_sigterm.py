"""`kill` (SIGTERM) ends a recording run as Ctrl-C does: the steps so far are kept in the trace,
never left behind in a .partial file, and no traceback. Sent at a point the child announces."""

from __future__ import annotations

import json
import os
import signal

import pytest
from interrupt_at import interrupted_at

from tracer.trace.trace_file import load_trace

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
TINY = ["--model", "tiny", "--max-tokens", "20", "--ignore-eos", "--num-kv-blocks", "32", "--threads", "1"]
THIRD_STEP = "call:nanoengine.engine:LLMEngine.step:3"


def scenario_file(tmp_path):
    path = tmp_path / "scenario.json"
    path.write_text(
        json.dumps({"title": "two", "params": {"max_tokens": 20, "ignore_eos": True}, "requests": ["a b", "c"]})
    )
    return path


@pytest.mark.parametrize("command", ["trace", "run"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_sigterm_keeps_the_steps_recorded_so_far_as_ctrl_c_does(tmp_path, command, sig):
    out = tmp_path / "cut.jsonl"
    what = ["hello there", *TINY] if command == "trace" else [str(scenario_file(tmp_path)), "--threads", "1"]
    result = interrupted_at(THIRD_STEP, [command, *what, "--out", str(out), "--no-tui"], ENV, sig=sig)
    assert result.returncode == 130, result.stderr
    assert "Traceback" not in result.stderr and f"nanoengine replay {out}" in " ".join(result.stderr.split())
    assert load_trace(out).num_steps == 2
    assert list(tmp_path.glob("*.partial")) == []


def test_a_command_run_in_process_gives_sigterm_back(tmp_path):
    """main() in a process that goes on (pytest's worker, a notebook) leaves SIGTERM as it found it."""
    from tracer.cli.main import main

    before = signal.getsignal(signal.SIGTERM)
    out = tmp_path / "t.jsonl"
    assert main(["trace", "hello", *TINY, "--out", str(out), "--no-tui"]) == 0
    assert signal.getsignal(signal.SIGTERM) is before and load_trace(out).num_steps > 0
