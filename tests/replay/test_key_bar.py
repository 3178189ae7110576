"""The footer's key bar at 80 columns: the replay's and the live app's keys that matter (live: space,
a, x; and ? and q) are on screen, not cut off at the right edge (←/→, n/p and +/- share one label)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from conftest import make_tiny_engine
from textual.widgets import Footer

from nanoengine.sampling_params import SamplingParams
from tracer.live.session import LiveSession
from tracer.loop.arrivals import Arrival
from tracer.replay.app import ReplayApp
from tracer.trace.trace_file import load_trace

TRACE = Path(__file__).parents[1] / "data" / "replay_small.jsonl"
PARAMS = SamplingParams(max_tokens=40, ignore_eos=True)


async def footer_row(pilot, app) -> str:
    """The footer's row once its keys are drawn (the footer composes them after a refresh)."""
    footer = app.query_one(Footer)
    for _ in range(50):
        await pilot.pause(0.02)
        row = "".join(segment.text for segment in app.screen._compositor.render_strips()[footer.region.y])
        if "quit" in row or "help" in row:
            break
    return row.rstrip()


def test_the_replay_key_bar_fits_80_columns():
    async def run() -> str:
        app = ReplayApp(load_trace(TRACE), animations=False)
        async with app.run_test(size=(80, 24)) as pilot:
            return await footer_row(pilot, app)

    row = asyncio.run(run())
    for label in ("←→ step", "space play", "np event", "c code", "? help", "q quit"):
        assert label in row, row


def test_the_live_key_bar_shows_x_and_q_at_80_columns(tmp_path, one_torch_thread):
    engine = make_tiny_engine(num_kv_blocks=200, max_num_seqs=2)
    session = LiveSession.start(engine, tmp_path / "live.jsonl", PARAMS, [Arrival("hi", PARAMS, 0, 0)], paused=True)

    async def run() -> str:
        app = session.app(animations=False)
        async with app.run_test(size=(80, 24)) as pilot:
            return await footer_row(pilot, app)

    try:
        row = asyncio.run(run())
    finally:
        session.close()
    for label in ("End follow", "space pause/run", "a add", "x abort", "? help", "q quit"):
        assert label in row, row
