"""`python -m tracer.vllm.compare_all`: nanoengine as it is now beside the committed vLLM traces
(whether a scenario differs depends on nanoengine's rules: issue 26 changes lesson 10's)."""

from __future__ import annotations

import re

from tracer.vllm.compare_all import main

LINE = re.compile(r"^(same  (\S+) \((\d+) vs \3 steps\)|DIFF  (\S+) \((\d+) vs (\d+) steps\): step \d+, \w+ of .+)$")


def test_compare_all_says_for_each_scenario_whether_and_where_it_differs(capsys):
    code = main(["09_flat_batch", "10_sampling", "--markdown"])
    out = capsys.readouterr().out.splitlines()
    verdicts = out[:2]
    assert [LINE.match(v) is not None for v in verdicts] == [True, True], verdicts
    assert [v.split()[1] for v in verdicts] == ["09_flat_batch", "10_sampling"]
    differ = [v.split()[1] for v in verdicts if v.startswith("DIFF")]
    assert out[-1] == f"{len(differ)} of 2 scenarios differ from vLLM v1 (tokens)"
    assert code == (1 if differ else 0)
    rows = [line for line in out if line.startswith("| ") and not line.startswith("| scenario")]
    assert {r.split(" | ")[0][2:] for r in rows} == set(differ)


def test_compare_all_refuses_an_unknown_scenario_in_one_line(capsys):
    assert main(["no-such-scenario"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_n_samples_are_scheduled_as_vllm_v1_schedules_its_child_requests(capsys):
    """Issue 33: vLLM's front end fans n out into child requests (ParentRequest); driven as such into
    vLLM's scheduler they get nanoengine's schedule, step for step (block ids aside: see the trace's test)."""
    assert main(["parallel-sampling"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "same  parallel-sampling (14 vs 14 steps)"
