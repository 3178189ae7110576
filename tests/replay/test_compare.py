"""`nanoengine replay A --compare B` and `nanoengine demo NAME --vs-vllm`: the same step of a second
run of the workload (here vLLM v1's committed trace) beside the replay, differences marked."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path

from tracer.cli.main import main
from tracer.replay.app import ReplayApp
from tracer.replay.views.compare import CompareView
from tracer.trace.trace_file import load_trace

ROOT = Path(__file__).parents[2]
VLLM = ROOT / "tracer" / "vllm" / "traces"


def old_rule(trace):
    """Lesson 10 as nanoengine scheduled it before issue 26: B computes all 16 tokens in step 0."""
    planted = copy.copy(trace)
    planted.steps = copy.deepcopy(list(trace.steps))
    b = planted.steps[0]["inputs"]["seq_ids"][1]
    row = next(r for r in planted.steps[0]["seqs"] if r["seq_id"] == b)
    row["num_cached_tokens"], row["num_scheduled_tokens"] = 0, 16
    return planted


def test_the_compare_panel_marks_the_differences_of_each_step(lesson10):
    theirs = load_trace(VLLM / "10_sampling.jsonl")
    assert app_diff(load_trace(lesson10), theirs) == []  # issue 26: the same decisions as vLLM v1
    ours = old_rule(load_trace(lesson10))

    async def panels() -> list[str]:
        app = ReplayApp(ours, animations=False, compare=theirs)
        shown = []
        async with app.run_test(size=(140, 50)) as pilot:
            for i in range(len(ours.steps)):
                app.go_to(i)
                await pilot.pause()
                shown.append(app.query_one(CompareView).shown)
        return shown

    shown = asyncio.run(panels())
    assert "A = 10.jsonl │ B = 10_sampling.jsonl · nanoengine 0.1.0 vs vllm 0.33.0, num_kv_blocks 24 vs 25" in shown[0]
    assert (
        "≠ " in shown[0] and "req 1" in shown[0] and "A: 16 tok from 0" in shown[0] and "B: 4 tok from 12" in shown[0]
    )
    assert "same-step hit" in shown[0]
    differing = {d.step for d in app_diff(ours, theirs)}
    for i, text in enumerate(shown):
        assert ("= same decisions" in text) == (i not in differing), (i, text)


def app_diff(a, b):
    from tracer.trace.diff import diff_traces

    return diff_traces(a, b).differences


def test_compare_with_another_workload_is_one_line_and_exit_2(lesson10, capsys):
    assert main(["replay", str(lesson10), "--compare", str(VLLM / "08_preemption.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--compare" in err and "same workload" in err


def test_demo_vs_vllm_reports_the_first_difference(tmp_path, capsys):
    assert main(["demo", "preemption", "--vs-vllm", "--no-tui", "--out-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out.replace("\n", " ")
    assert "Beside vLLM v1:" in out and "blocks of request" in out
    assert main(["demo", "preemption", "--vs-vllm", "--block-size", "8", "--no-tui"]) == 2


def test_the_sides_are_named_by_file_with_the_config_differences(lesson10, tmp_path):
    """Two nanoengine runs share the engine's name: each side is its file, then what differs."""
    from tracer.teach.scenarios import load_scenario, run_scenario

    scenario = load_scenario(ROOT / "lessons" / "10_sampling" / "scenario.json")
    scenario.engine["num_kv_blocks"] = 48
    bigger = run_scenario(scenario, tmp_path / "48.jsonl", model="tiny").trace_path
    ours, theirs = load_trace(lesson10), load_trace(bigger)
    blocks = ours.header["config"]["num_kv_blocks"]

    async def shown() -> tuple[str, str, bool]:
        app = ReplayApp(ours, animations=False, compare=theirs)
        async with app.run_test(size=(200, 50)) as pilot:
            await pilot.pause()
            b_pool = app.query_one("#kv-b")
            return app.query_one(CompareView).shown, str(b_pool.border_title), b_pool.display

    text, b_title, side_by_side = asyncio.run(shown())
    assert f"A = 10.jsonl │ B = 48.jsonl · num_kv_blocks {blocks} vs 48" in text
    assert "nanoengine 0.1.0 │" not in text
    assert b_title == "KV pages · B = 48.jsonl" and side_by_side  # 200 columns: B's pool beside A's


def test_the_html_export_compares_a_with_b(lesson10, tmp_path):
    out = tmp_path / "ab.html"
    theirs = VLLM / "10_sampling.jsonl"
    assert main(["export", str(lesson10), "--html", str(out), "--compare", str(theirs), "--steps", "0-1"]) == 0
    page = out.read_text(encoding="utf-8")
    assert "A = 10.jsonl vs B = 10_sampling.jsonl" in page  # the title names both sides
    assert main(["export", str(lesson10), "--html", str(out), "--compare", str(VLLM / "08_preemption.jsonl")]) == 2
