"""The queue line: the running list and the waiting queue as each step found them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from rich.console import Console
from textual.widgets import Static

from tracer.replay.app import ReplayApp
from tracer.replay.views.queues import QueuesView, queues_text
from tracer.trace.trace_file import load_trace

DATA = Path(__file__).parents[1] / "data"


@pytest.fixture(scope="module")
def trace():
    return load_trace(DATA / "replay_small.jsonl")


def test_a_preempted_request_is_shown_back_at_the_head_of_the_queue(trace):
    steps = trace.steps
    preempting = next(i for i, s in enumerate(steps) if any(e["kind"] == "preempted" for e in s["events"]) and i > 6)
    victim = next(e["seq_id"] for e in steps[preempting]["events"] if e["kind"] == "preempted")
    during = queues_text(steps[preempting], steps[preempting - 1]).plain
    after = queues_text(steps[preempting + 1], steps[preempting]).plain
    assert f"✗C#{victim}" in during.split("│")[0]  # preempted from the running list, marked
    waiting = after.split("waiting head→ ")[1]
    assert waiting.startswith(f"↩+C#{victim}")  # next step: at the head, and admitted again


def test_every_step_lists_both_queues_in_order(trace):
    for i, step in enumerate(trace.steps):
        text = queues_text(step, trace.steps[i - 1] if i else None).plain
        running, waiting = text.split("│")
        for sid in step["queues"]["running"]:
            assert f"#{sid}" in running
        assert [int(part.split("#")[1]) for part in waiting.split("head→ ")[1].split() if "#" in part] == list(
            step["queues"]["waiting"]
        )


def test_a_version_1_trace_replays_and_says_the_queues_were_not_recorded():
    async def run() -> str:
        app = ReplayApp(load_trace(DATA / "trace_v1.jsonl"), start_step=3, animations=False)
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.press("right", "right")
            await pilot.pause()
            assert app.step_index == 5
            return str(app.query_one(QueuesView).render())

    assert "not recorded" in asyncio.run(run())


def test_the_queue_line_says_it_shows_the_steps_start_and_help_explains_its_marks(trace):
    """Step 2 admits B: the table shows B RUNNING (the step's end) while the queue line, labelled
    as the step's start, still has it waiting, marked +; `?` explains +, ✗ and ↩. At 80 columns
    the labels shorten and every id still fits."""

    async def run(size: tuple[int, int], start: int = 2) -> tuple[str, str, str]:
        app = ReplayApp(trace, start_step=start, animations=False)
        async with app.run_test(size=size) as pilot:
            view = app.query_one(QueuesView)
            line = str(view.render())
            assert len(line) <= view.content_size.width
            status = app.seqs.rows[1][1].plain
            await pilot.press("question_mark")
            await pilot.pause()
            console = Console(width=300, record=True)
            for widget in app.screen.query(Static):
                console.print(widget.content)
            help_text = " ".join(console.export_text().split())
            return line, status, help_text

    line, status, help_text = asyncio.run(run((120, 36)))
    assert line.startswith("queues at the step's start") and "waiting head→ +B#1" in line
    assert "RUNNING" in status
    for mark, meaning in (
        ("+A#0", "admitted by this step"),
        ("✗A#0", "preempted by this step"),
        ("↩A#0", "previous step"),
    ):
        assert mark in help_text and meaning in help_text
    assert "vLLM v1 has none" in help_text
    narrow, _, _ = asyncio.run(run((80, 24), start=8))  # the long form would cut the waiting queue off
    queues = trace.steps[8]["queues"]
    assert narrow.startswith("at step start:") and "…" not in narrow
    assert all(f"#{seq_id}" in narrow for seq_id in queues["running"] + queues["waiting"])
