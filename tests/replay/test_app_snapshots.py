"""SVG snapshots of the replay TUI on the fixed trace tests/data/replay_small.jsonl (animations off).

Update the baselines after an intended visual change:
    .venv/bin/python -m pytest tests/test_app_snapshots.py --snapshot-update
Export the documentation screenshots (docs/screenshots/*.svg) of the same steps:
    .venv/bin/python tests/test_app_snapshots.py
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from tracer.replay.app import ReplayApp
from tracer.trace.trace_file import load_trace

TRACE = Path(__file__).parents[1] / "data" / "replay_small.jsonl"
SIZE = (100, 30)
STEPS = {"step0_admit": 0, "step3_chunked_prefill": 3, "step8_preempted": 8, "step13_end": 13}


@pytest.fixture(scope="module")
def trace():
    return load_trace(TRACE)


@pytest.mark.parametrize("name", list(STEPS))
def test_step_snapshot(snap_compare, trace, name):
    app = ReplayApp(trace, start_step=STEPS[name], animations=False)
    assert snap_compare(app, terminal_size=SIZE)


def test_selected_sequence_snapshot(snap_compare, trace):
    """Step 6 with seq C selected: its blocks numbered in block_table order, its batch columns marked."""
    app = ReplayApp(trace, start_step=6, animations=False)
    assert snap_compare(app, terminal_size=SIZE, press=["tab", "tab", "down", "down", "down"])


def test_small_terminal_snapshot(snap_compare, trace):
    app = ReplayApp(trace, start_step=8, animations=False)
    assert snap_compare(app, terminal_size=(80, 24))


async def export_screenshots(out: Path) -> None:
    trace = load_trace(TRACE)
    out.mkdir(parents=True, exist_ok=True)
    for name, step in STEPS.items():
        app = ReplayApp(trace, start_step=step, animations=False)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            app.save_screenshot(filename=f"replay_{name}.svg", path=str(out))
        print(out / f"replay_{name}.svg")


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parents[2] / "docs" / "screenshots"
    asyncio.run(export_screenshots(target))
