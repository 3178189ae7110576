"""`vllm:NAME`: the committed vLLM traces by name, from any folder (issue 37, item 2)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import one_line_error

import tracer
from tracer.cli.main import main
from tracer.cli.vllm_traces import resolve_trace, vllm_trace, vllm_trace_names
from tracer.teach.lessons import find_lesson

TRACES = Path(tracer.__file__).parent / "vllm" / "traces"


def test_the_names_are_the_committed_traces_and_resolve_to_their_files():
    assert vllm_trace_names() == sorted(p.stem for p in TRACES.glob("*.jsonl"))
    assert vllm_trace("08_preemption").read_bytes() == (TRACES / "08_preemption.jsonl").read_bytes()
    assert resolve_trace("vllm:08_preemption.jsonl") == vllm_trace("08_preemption")
    assert resolve_trace("a/vllm:x.jsonl") == Path("a/vllm:x.jsonl")  # only the prefix names one


def test_replay_check_and_diff_read_a_vllm_name_from_a_lessons_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the student's folder: no tracer/vllm/traces/ below it
    assert main(["replay", "vllm:08_preemption", "--step", "3", "--text"]) == 0
    assert "preempted" in capsys.readouterr().out
    assert main(["check", "vllm:15_vs_vllm"]) == 0
    assert "vllm:15_vs_vllm" in capsys.readouterr().out
    assert main(["diff", "vllm:15_vs_vllm", "vllm:15_vs_vllm"]) == 0


@pytest.mark.parametrize(
    "argv", [["replay", "vllm:08_preemptoin"], ["check", "vllm:"], ["replay", "x.jsonl", "--compare", "vllm:no"]]
)
def test_an_unknown_name_is_one_line_listing_the_names(tmp_path, monkeypatch, capsys, argv):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    message = one_line_error(capsys.readouterr().err)
    assert "no committed vLLM trace" in message and "08_preemption, " in message and "demo-preemption" in message


def test_lesson_15_names_the_traces_in_a_form_that_works_anywhere():
    lesson = find_lesson("15")
    texts = "\n".join(p.read_text(encoding="utf-8") for p in (lesson.readme, lesson.exercise))
    paths = re.findall(r"tracer/vllm/traces/[\w-]+\.jsonl", texts)
    assert not paths, "a path works only from the repository's root"
    names = re.findall(r"vllm:([\w-]+)", texts)
    assert "08_preemption" in names and "15_vs_vllm" in names
    assert set(names) - {"NAME"} <= set(vllm_trace_names())
