"""A scenario file that is not what it should be is one line naming what is wrong, before any run;
`nanoengine run` on it exits 2 without a traceback."""

from __future__ import annotations

import json

import pytest
from conftest import one_line_error

from tracer.cli.main import main
from tracer.teach.scenarios import ScenarioError, scenario_from_dict

GOOD = {"title": "t", "requests": ["hello"]}


@pytest.mark.parametrize(
    "data, words",
    [
        (None, ["a JSON object"]),
        (5, ["a JSON object"]),
        ([{"prompt": "a"}], ["a JSON object"]),
        ({"requests": "abc"}, ["'requests'", "list"]),
        ({"requests": []}, ["'requests'"]),
        ({"requests": [5]}, ["request 0"]),
        ({"requests": [None]}, ["request 0"]),
        ({"requests": [{"prompt": "a", "arrive": -1}]}, ["arrive", "-1"]),
        ({"requests": [{"prompt": "a", "arrive": 1.5}]}, ["arrive", "1.5"]),
        ({"requests": [{"prompt": "a", "arrive": True}]}, ["arrive", "True"]),
        ({"requests": [{"prompt": "a", "arrive": "2"}]}, ["arrive"]),
        ({**GOOD, "reqests": []}, ["'reqests'", "requests"]),
        ({**GOOD, "title": 5}, ["'title'", "string"]),
        ({**GOOD, "model": ["tiny"]}, ["'model'", "string"]),
        ({**GOOD, "engine": "fast"}, ["'engine'", "object"]),
        ({**GOOD, "params": [1]}, ["'params'", "object"]),
        ({**GOOD, "focus": 3}, ["'focus'", "object"]),
        ({**GOOD, "max_steps": 0}, ["'max_steps'"]),
        ({**GOOD, "max_steps": "9"}, ["'max_steps'"]),
        ({**GOOD, "focus": {"step": "x"}}, ["focus"]),
    ],
)
def test_a_malformed_scenario_is_one_line(data, words):
    with pytest.raises(ScenarioError) as e:
        scenario_from_dict(data, "s", source="s.json")
    message = str(e.value)
    assert "\n" not in message and message.startswith("s.json: ")
    assert all(w in message for w in words), message


def test_a_well_formed_scenario_still_loads():
    scenario = scenario_from_dict(
        {**GOOD, "requests": ["a", [1, 2], {"prompt": "b", "arrive": 3, "max_tokens": 2}]}, "s"
    )
    assert [r.arrive for r in scenario.requests] == [0, 0, 3] and scenario.title == "t"


@pytest.mark.parametrize(
    "data",
    [
        {"requests": "abc"},
        None,
        {**GOOD, "title": 5},
        {"requests": [{"prompt": "a", "arrive": -2}]},
    ],
    ids=["requests a string", "null", "title a number", "negative arrive"],
)
def test_run_on_a_malformed_scenario_exits_2_with_one_line(tmp_path, capsys, data):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    assert main(["run", str(path), "--model", "tiny", "--no-tui", "--out", str(tmp_path / "t.jsonl")]) == 2
    message = one_line_error(capsys.readouterr().err)
    assert "nan" not in message.lower().split(), message
