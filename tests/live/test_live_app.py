"""The live app on a running tiny-model engine, driven with Pilot: pause stops the engine, → runs
exactly one step, `a` adds a request, `x` aborts the selected sequence, a violation pauses the
engine, and quitting leaves a trace that `nanoengine check` passes.

Nothing here waits a fixed time. "The engine is paused" is acknowledged by the loop itself: a
command it runs between two steps (loop.call) reports the step count, and while the engine runs
two such round trips always have a step between them, so an unchanged count proves the pause.
"""

from __future__ import annotations

import pytest
from conftest import HANG_S, make_tiny_engine, run_async, wait_until
from textual.widgets import Input

from nanoengine.sampling_params import SamplingParams
from tracer.cli.trace import check_main
from tracer.live.session import LiveSession
from tracer.loop.arrivals import Arrival
from tracer.trace.invariants import check_trace
from tracer.trace.trace_file import load_trace

SIZE = (110, 34)
PARAMS = SamplingParams(max_tokens=1500, ignore_eos=True)  # runs far longer than any test: it never runs dry
PROMPTS = ["hello world", "abc def"]  # no shared prefix: an aborted one's blocks are its own


def engine_steps(session: LiveSession) -> int:
    """The engine's step count, read in the loop thread between two steps."""
    return session.loop.call(lambda engine: engine.num_steps).result(HANG_S)


@pytest.fixture
def session(tmp_path, one_torch_thread):
    engine = make_tiny_engine(num_kv_blocks=800, max_num_seqs=2)
    arrivals = [Arrival(p, PARAMS, 0, i) for i, p in enumerate(PROMPTS)]
    session = LiveSession.start(engine, tmp_path / "live.jsonl", PARAMS, arrivals, title="live test", paused=True)
    yield session
    session.close()


async def run_steps(pilot, app, session, n: int) -> int:
    """While paused: → n times, each waiting for its step to be shown; the engine's step count."""
    for _ in range(n):
        seen = len(app.steps)
        await pilot.press("right")
        await wait_until(pilot, app, lambda seen=seen: len(app.steps) == seen + 1, "the single step")
    return engine_steps(session)


async def paused_at(pilot, app, session) -> int:
    """Press space (pause), let the loop acknowledge, and wait until the app shows the last step taken."""
    await pilot.press("space")
    assert session.control.paused
    count = engine_steps(session)
    await wait_until(pilot, app, lambda: len(app.steps) == count, "the app to show the last step")
    return count


@run_async
async def test_pause_holds_the_engine_and_right_runs_exactly_one_step(session):
    app = session.app(animations=False)
    async with app.run_test(size=SIZE) as pilot:
        assert engine_steps(session) == 0 and not app.steps  # started paused
        assert await run_steps(pilot, app, session, 1) == 1
        await pilot.press("space")  # resume
        assert not session.control.paused
        await wait_until(pilot, app, lambda: len(app.steps) >= 5, "the engine to run")
        count = await paused_at(pilot, app, session)
        await pilot.pause()
        assert engine_steps(session) == count  # were it running, a step would lie between two round trips
        app.poll()
        assert len(app.steps) == count and app.step_index == count - 1 and app.model.following
        assert "PAUSED" in session.control.state() and "PAUSED" in app.badge().plain
        await pilot.press("right")
        await wait_until(pilot, app, lambda: len(app.steps) == count + 1, "the single step")
        assert engine_steps(session) == count + 1 and engine_steps(session) == count + 1
        app.poll()
        assert len(app.steps) == count + 1 and app.step_index == count  # following: the new step is shown


@run_async
async def test_browsing_history_while_the_engine_steps_and_end_follows_again(session):
    app = session.app(animations=False)
    async with app.run_test(size=SIZE) as pilot:
        await run_steps(pilot, app, session, 4)
        await pilot.press("home", "right")
        assert app.step_index == 1 and not app.model.following
        session.loop.step_once()  # the engine moves on while the view stays in the past
        session.loop.step_once()
        await wait_until(pilot, app, lambda: len(app.steps) == 6, "two more steps")
        assert app.step_index == 1 and app.current_step["step"] == 1
        await pilot.press("right")  # → in history browses; it runs no step
        assert app.step_index == 2 and engine_steps(session) == 6
        await pilot.press("end")
        assert app.model.following and app.step_index == 5


@run_async
async def test_a_adds_a_waiting_request_and_x_aborts_the_selected_one(session):
    app = session.app(animations=False)
    async with app.run_test(size=SIZE) as pilot:
        count = await run_steps(pilot, app, session, 3)
        await pilot.press("a")
        await pilot.press(*"the new one", "enter")
        await pilot.press("right")
        await wait_until(pilot, app, lambda: len(app.steps) == count + 1, "the step after the add")
        step = app.current_step
        (new,) = step["new_requests"]
        assert new["prompt"] == "the new one" and new["arrive"] == count and new["added_by"] == "live"
        row = next(s for s in step["seqs"] if s["seq_id"] == new["seq_id"])
        assert row["status_after"] == "WAITING"  # max_num_seqs 2: both others still run
        victim = next(s for s in step["seqs"] if s["status_after"] == "RUNNING")
        blocks = victim["block_table_after"]
        assert blocks
        app.select(victim["seq_id"])
        await pilot.press("x", "right")
        await wait_until(pilot, app, lambda: len(app.steps) == count + 2, "the step after the abort")
        step = app.current_step
        row = next(s for s in step["seqs"] if s["seq_id"] == victim["seq_id"])
        assert row["status_after"] == "FINISHED" and row["finish_reason"] == "abort"
        assert row["block_table_after"] == []
        assert all(step["pool"]["ref_counts"][b] == 0 for b in blocks)  # its blocks are free
        admitted = next(s for s in step["seqs"] if s["seq_id"] == new["seq_id"])
        assert admitted["status_after"] == "RUNNING"  # the freed place went to the waiting one
        await pilot.press("q")
    session.close()
    assert check_main([str(session.recorder.path)]) == 0
    trace = load_trace(session.recorder.path, validate="all")
    assert not check_trace(trace)
    assert {r["prompt"] for r in trace.requests.values()} >= {*PROMPTS, "the new one"}


@run_async
async def test_a_request_too_long_for_the_pool_is_a_notice_not_a_crash(session):
    app = session.app(animations=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("a")
        app.screen.query_one("#add-prompt", Input).value = "x" * 3000  # the tiny model's max_model_len: 2048
        await pilot.press("enter")
        await wait_until(pilot, app, lambda: any("not run" in n.message for n in app._notifications), "a notice")
        notice = next(n.message for n in app._notifications if "not run" in n.message)
        assert "max_model_len" in notice and "\n" not in notice
        await pilot.press("a", *"hi", "tab", "0", "enter")  # refused before it reaches the engine
        await pilot.pause()
        assert any("not added" in n.message and "max_tokens" in n.message for n in app._notifications)
        assert app.is_running and not session.control.stopped


@run_async
async def test_x_without_a_selection_says_what_to_do(session):
    app = session.app(animations=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("x")
        assert any("select a sequence first" in n.message for n in app._notifications)


@run_async
async def test_a_poll_while_the_app_closes_does_nothing(session):
    """A poll timer's tick can land after the widgets are gone (seen under load): the engine's
    changed state must not be drawn into a screen that no longer has its timeline."""
    app = session.app(animations=False)
    async with app.run_test(size=SIZE) as pilot:
        await app.query_one("#timeline").remove()
        await pilot.pause()
        app.live.shown_state = "a state the screen has not shown"
        app.poll()  # raised NoMatches (no TimelineView) before


@run_async
async def test_a_violation_pauses_the_engine_at_that_step(session):
    app = session.app(animations=False)
    async with app.run_test(size=SIZE) as pilot:
        await run_steps(pilot, app, session, 2)
        await pilot.press("space")  # resume: the violation must stop it

        def leak_a_block(engine) -> None:  # a planted bug: a free block's ref count goes up
            bm = engine.block_manager  # the pool's last block: no allocation in this test reaches it
            assert bm.ref_counts[-1] == 0
            bm.ref_counts[-1] += 1

        session.loop.call(leak_a_block).result(HANG_S)
        await wait_until(pilot, app, lambda: session.control.paused, "the violation to pause the engine")
        count = engine_steps(session)
        app.poll()
        await pilot.pause()
        assert engine_steps(session) == count and len(app.steps) == count
        assert app.current_step["violations"]  # paused AT the violating step, shown
        assert any("invariant violation at step" in n.message for n in app._notifications)
        app.poll()
        assert f"PAUSED by an invariant violation at step {count - 1}" in app.status_text()


@run_async
async def test_a_request_too_big_for_the_pool_is_a_notice(tmp_path, one_torch_thread):
    engine = make_tiny_engine()  # 12 blocks of 4 slots
    session = LiveSession.start(engine, tmp_path / "small.jsonl", SamplingParams(max_tokens=100), paused=True)
    try:
        app = session.app(animations=False)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("a", *"hi", "enter")
            await wait_until(pilot, app, lambda: any("not run" in n.message for n in app._notifications), "a notice")
            notice = next(n.message for n in app._notifications if "not run" in n.message)
            assert "the pool has 12" in notice and "\n" not in notice
            assert app.is_running and not session.control.stopped
    finally:
        session.close()


@run_async
async def test_help_lists_the_live_keys(session):
    app = session.app(animations=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        assert app.screen.mode_keys is not None and app.screen.mode_keys[0].startswith("Live keys")
        assert {key for key, _ in app.screen.mode_keys[1]} >= {"space", "a", "x", "End"}
        await pilot.press("escape")
        footer_keys = {binding.key for _, binding, enabled, _ in app.screen.active_bindings.values() if binding.show}
        assert {"space", "a", "x", "end"} <= footer_keys
