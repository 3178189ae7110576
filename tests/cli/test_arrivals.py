"""Late arrivals without a server: `nanoengine trace --arrive` and `nanoengine run SCENARIO.json`."""

from __future__ import annotations

import json

import pytest
from conftest import one_line_error

from tracer.cli.main import main
from tracer.trace.invariants import check_trace
from tracer.trace.trace_file import load_trace

pytestmark = pytest.mark.usefixtures("one_torch_thread")
FLAGS = ["--model", "tiny", "--max-tokens", "12", "--ignore-eos", "--block-size", "4", "--threads", "1", "--no-tui"]


def first_steps(path) -> dict[str, tuple[int, int]]:
    """prompt -> (the step it joined, the step it was asked to join)."""
    return {r["prompt"]: (r["first_step"], r["arrive"]) for r in load_trace(path, "all").requests.values()}


def test_trace_arrive_adds_each_prompt_at_its_step(tmp_path, capsys):
    out = tmp_path / "late.jsonl"
    prompts = ["hello", "world", "late", "later"]
    assert main(["trace", *prompts, "--arrive", "0,0,4,9", "--out", str(out), *FLAGS]) == 0
    assert first_steps(out) == {"hello": (0, 0), "world": (0, 0), "late": (4, 4), "later": (9, 9)}
    assert check_trace(load_trace(out, "all")) == []


def test_a_prompt_due_after_the_others_finished_joins_at_once(tmp_path):
    out = tmp_path / "idle.jsonl"
    assert main(["trace", "hello", "much later", "--arrive", "0,500", "--out", str(out), *FLAGS]) == 0
    joined, asked = first_steps(out)["much later"]
    assert asked == 500 and joined == 12  # hello's 12 tokens took steps 0-11: no empty steps before it


@pytest.mark.parametrize(
    "arrive, expected",
    [("0,x", "one step number per prompt"), ("0", "1 steps for 2 prompts"), ("0,-1", "must be >= 0")],
)
def test_a_bad_arrive_is_one_line_and_writes_nothing(tmp_path, capsys, arrive, expected):
    out = tmp_path / "never.jsonl"
    assert main(["trace", "hello", "world", "--arrive", arrive, "--out", str(out), *FLAGS]) == 2
    assert expected in one_line_error(capsys.readouterr().err)
    assert not out.exists()


def test_a_late_prompt_that_cannot_run_fails_before_any_file(tmp_path, capsys):
    out = tmp_path / "never.jsonl"
    argv = ["trace", "hello", "x" * 100, "--arrive", "0,3", "--max-model-len", "50", "--out", str(out), *FLAGS]
    assert main(argv) == 2
    assert "max_model_len is 50" in one_line_error(capsys.readouterr().err)
    assert not out.exists()


def test_run_records_a_scenario_file_with_its_arrivals(tmp_path, capsys):
    scenario = {
        "title": "a late arrival",
        "model": "tiny",
        "engine": {"block_size": 4, "num_kv_blocks": 16},
        "params": {"max_tokens": 5, "ignore_eos": True},
        "requests": [{"prompt": "Hi!"}, {"prompt": "Hello, engine!", "arrive": 2, "max_tokens": 3}],
    }
    path = tmp_path / "class.json"
    path.write_text(json.dumps(scenario))
    out = tmp_path / "class.jsonl"
    assert main(["run", str(path), "--out", str(out), "--no-tui", "--threads", "1"]) == 0
    trace = load_trace(out, "all")
    assert trace.title == "a late arrival" and trace.header["config"]["num_kv_blocks"] == 16
    assert first_steps(out) == {"Hi!": (0, 0), "Hello, engine!": (2, 2)}
    late = next(r for r in trace.requests.values() if r["arrive"] == 2)
    assert late["params"]["max_tokens"] == 3 and check_trace(trace) == []
    assert "Trace written to" in capsys.readouterr().out


def test_run_engine_flags_override_the_scenario(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"model": "tiny", "engine": {"block_size": 4}, "requests": ["Hi!"]}))
    out = tmp_path / "s.jsonl"
    assert main(["run", str(path), "--block-size", "8", "--out", str(out), "--no-tui", "--threads", "1"]) == 0
    assert load_trace(out).header["config"]["block_size"] == 8


@pytest.mark.parametrize(
    "content, expected",
    [
        ("{not json", "is not valid JSON"),
        ('{"requests": []}', "non-empty 'requests' list"),
        ('{"requests": [{"prompt": "a", "colour": 1}]}', "unknown field(s) colour"),
        ('{"requests": [{"prompt": "a", "max_tokens": 0}]}', "max_tokens must be an integer >= 1"),
    ],
)
def test_run_refuses_a_bad_scenario_in_one_line(tmp_path, capsys, content, expected):
    path = tmp_path / "bad.json"
    path.write_text(content)
    assert main(["run", str(path), "--no-tui", "--out", str(tmp_path / "x.jsonl")]) == 2
    assert expected in one_line_error(capsys.readouterr().err)
    assert not (tmp_path / "x.jsonl").exists()


def test_run_on_a_missing_file_is_one_line(tmp_path, capsys):
    assert main(["run", str(tmp_path / "nope.json"), "--no-tui"]) == 2
    assert "cannot read scenario" in one_line_error(capsys.readouterr().err)
