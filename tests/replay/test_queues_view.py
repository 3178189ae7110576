"""The queue line: the running list and the waiting queue as each step found them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

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
