"""The narration bar at 100x30 holds 3 rows: a longer narration (lesson 1, step 1) ends its last row
with "… m: more" instead of stopping mid-word, `m` shows it whole and `m` again cuts it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tracer.replay.app import ReplayApp
from tracer.replay.narration import narrate
from tracer.replay.views.narration_bar import MORE, NarrationBar
from tracer.trace.trace_file import load_trace

LESSON_1 = Path(__file__).parents[2] / "lessons" / "01_request_life" / "scenario.json"


@pytest.fixture(scope="module")
def lesson1(tmp_path_factory):
    from tracer.teach.scenarios import load_scenario, run_scenario

    path = tmp_path_factory.mktemp("lesson1") / "01.jsonl"
    run_scenario(load_scenario(LESSON_1), path, model="tiny")
    return load_trace(path)


def shown(app: ReplayApp) -> str:
    return app.query_one(NarrationBar).shown


def test_a_cut_narration_says_so_and_m_shows_it_whole(lesson1):
    async def run() -> None:
        app = ReplayApp(lesson1, start_step=1, animations=False)
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.pause()
            whole = narrate(app.current_step, app.header)
            bar = app.query_one(NarrationBar)
            assert bar.cut and shown(app).endswith(MORE) and len(shown(app).splitlines()) == 3
            assert bar.region.height == 3
            await pilot.press("m")
            await pilot.pause()
            assert not bar.cut and shown(app) == whole and bar.region.height > 3
            await pilot.press("m")
            await pilot.pause()
            assert bar.cut and shown(app).endswith(MORE)
            app.go_to(len(app.steps) - 1)  # a short narration is shown whole, with no mark
            await pilot.pause()
            assert not bar.cut and MORE not in shown(app)

    asyncio.run(run())
