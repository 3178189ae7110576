"""`nanoengine run SCENARIO.json` honours the scenario's focus and look_for, and `--template`
prints an example that runs (issue 37, item 11)."""

from __future__ import annotations

import json

import pytest
from conftest import one_line_error

from tracer.cli.main import main
from tracer.teach.scenarios import TEMPLATE, is_comment, template_json
from tracer.trace.trace_file import load_trace

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def event_steps(path, kind: str) -> list[int]:
    return [i for i, step in enumerate(load_trace(path, "all").steps) if any(e["kind"] == kind for e in step["events"])]


def test_the_template_prints_json_on_stdout_and_its_comments_on_stderr(capsys):
    assert main(["run", "--template"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == json.loads(template_json())
    comments = err.splitlines()
    assert comments and all(line.lstrip().startswith("//") for line in comments)
    lines = TEMPLATE.splitlines()
    keys = [i for i, line in enumerate(lines) if line.startswith('  "')]
    assert len(keys) == len(json.loads(out))  # every key has a line of its own, with a comment just above
    assert all(is_comment(lines[i - 1]) for i in keys)


def test_a_teacher_runs_the_template_and_the_trace_opens_at_its_focus_with_its_look_for(tmp_path, capsys):
    scenario = tmp_path / "class.json"
    assert main(["run", "--template"]) == 0
    scenario.write_text(capsys.readouterr().out)
    out = tmp_path / "class.jsonl"
    assert main(["run", str(scenario), "--out", str(out), "--no-tui", "--threads", "1"]) == 0
    header = load_trace(out).header
    wanted = json.loads(scenario.read_text())
    assert header["focus_step"] == event_steps(out, "prefix_hit")[0] == 3  # the late request's hit
    assert header["look_for"] == wanted["look_for"]
    printed = capsys.readouterr().out.replace("\n", " ")
    assert "The step that matters: 3" in printed and "Look for:" in printed and "prefix" in printed


def test_a_focus_on_one_request_counts_only_its_events(tmp_path):
    scenario = {
        "model": "tiny",
        "engine": {"block_size": 4},
        "params": {"max_tokens": 4, "ignore_eos": True},
        "requests": ["Hi!", {"prompt": "Later", "arrive": 2}],
        "focus": {"event": "admitted", "request": 1},
    }
    path = tmp_path / "s.json"
    path.write_text(json.dumps(scenario))
    out = tmp_path / "s.jsonl"
    assert main(["run", str(path), "--out", str(out), "--no-tui", "--threads", "1"]) == 0
    header = load_trace(out).header
    assert event_steps(out, "admitted") == [0, 2] and header["focus_step"] == 2
    assert "look_for" not in header or header["look_for"] is None


@pytest.mark.parametrize(
    "focus, words",
    [
        ({"evnet": "finished"}, ["'evnet'", "step, or event"]),
        ({"step": 1, "event": "finished"}, ["not both"]),
        ({"event": "finished", "nth": 0}, ["nth", ">= 1"]),
        ({"event": "done"}, ["'done'", "preempted"]),
    ],
)
def test_a_focus_it_cannot_honour_is_refused_in_one_line_before_the_model_loads(tmp_path, capsys, focus, words):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"requests": ["Hi!"], "focus": focus}))
    assert main(["run", str(path), "--no-tui", "--out", str(tmp_path / "x.jsonl")]) == 2
    message = one_line_error(capsys.readouterr().err)
    assert all(w in message for w in words), message
    assert not (tmp_path / "x.jsonl").exists()


def test_run_without_a_scenario_says_what_to_give(capsys):
    with pytest.raises(SystemExit) as e:
        main(["run"])
    assert e.value.code == 2 and "--template" in capsys.readouterr().err
