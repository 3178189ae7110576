"""The replay TUI driven with Pilot on the fixed trace tests/data/replay_small.jsonl.

The trace (tiny model, 16 blocks of 4 slots, 12-token budget, 14 steps): seq 0 (A) and 1 (B)
prefill in chunks; seq 2 (C) arrives before step 4, reuses A's prompt blocks, and is preempted
at steps 6 and 8. No step has a violation (tests inject their own).
"""

from __future__ import annotations

import asyncio
import copy
import difflib
import json
import re
import time
from pathlib import Path

import pytest
from conftest import run_async
from textual.widgets import Input

from tracer.replay.app import ReplayApp, run_replay
from tracer.replay.marks import EVENT_KINDS
from tracer.replay.predict import PredictScreen
from tracer.replay.views.batch import LABEL_WIDTH, BatchView
from tracer.replay.views.kv_pages import CELL, KVPagesView
from tracer.replay.views.state_machine import StateMachineView
from tracer.replay.views.timeline import TimelineView
from tracer.trace.trace_file import TraceError, load_lazy, load_trace, marks_from_step

TRACE = Path(__file__).parents[1] / "data" / "replay_small.jsonl"
SIZE = (100, 30)


@pytest.fixture(scope="module")
def trace():
    return load_trace(TRACE)


def make_app(trace, tmp_path=None, **kwargs) -> ReplayApp:
    return ReplayApp(trace, animations=False, screenshot_dir=tmp_path or ".", **kwargs)


def text_of(strip) -> str:
    return "".join(segment.text for segment in strip)


@run_async
async def test_arrow_keys_home_and_end_move_the_step(trace):
    app = make_app(trace)
    async with app.run_test(size=SIZE) as pilot:
        assert app.step_index == 0
        await pilot.press("right", "right", "right")
        assert app.step_index == 3
        await pilot.press("left")
        assert app.step_index == 2
        await pilot.press("end")
        assert app.step_index == len(trace.steps) - 1
        await pilot.press("right")  # stays on the last step
        assert app.step_index == len(trace.steps) - 1
        await pilot.press("home", "left")
        assert app.step_index == 0


async def wait_until(pilot, condition, what: str, limit_s: float = 120) -> None:
    """Let the app run until condition() holds: however long a busy machine takes, never a fixed wait."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"waited {limit_s:.0f} s for {what}")
        await pilot.pause(0.02)


@run_async
async def test_play_advances_then_pauses(trace):
    app = make_app(trace)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("space")  # 1 step per second: 12 more ticks before the end
        assert app.playing
        await wait_until(pilot, lambda: app.step_index >= 1, "the first tick")
        await pilot.press("space")
        assert not app.playing and app.play_timer is None
        reached = app.step_index
        assert 1 <= reached < len(trace.steps) - 1
        await pilot.press("plus", "plus", "plus")  # a new speed does not restart a paused player
        await pilot.pause(0.3)
        assert app.step_index == reached and not app.playing


@run_async
async def test_play_stops_at_the_end(trace):
    app = make_app(trace, start_step=len(trace.steps) - 3)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press(*["plus"] * 6)
        await pilot.press("space")
        await wait_until(pilot, lambda: not app.playing, "the player to stop")
        assert app.step_index == len(trace.steps) - 1 and app.play_timer is None


@run_async
async def test_g_jumps_to_a_typed_step(trace):
    app = make_app(trace)
    async with app.run_test(size=SIZE) as pilot:
        await type_in_goto_box(pilot, app, "1", "1", "enter")
        assert app.current_step["step"] == 11
        await type_in_goto_box(pilot, app, "5", "escape")  # cancel keeps the step
        assert app.current_step["step"] == 11
        await type_in_goto_box(pilot, app, "2", "left", "1", "enter")  # ← moves the cursor in the box
        assert app.current_step["step"] == 12


async def type_in_goto_box(pilot, app: ReplayApp, *keys: str) -> None:
    """`g`, then keys once the go-to box has the focus, then wait for it to close (on a busy machine
    it can still be opening when the next key comes, or closing when the test looks)."""
    await pilot.press("g")
    await wait_until(pilot, lambda: isinstance(app.focused, Input), "the go-to box to take the keys")
    await pilot.press(*keys)
    await wait_until(pilot, lambda: len(app.screen_stack) == 1, "the go-to box to close")


@run_async
async def test_n_and_p_land_on_event_steps(trace):
    events = [
        i for i, s in enumerate(trace.steps) if s["violations"] or any(e["kind"] in EVENT_KINDS for e in s["events"])
    ]
    app = make_app(trace, start_step=2)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("n")
        assert app.step_index == min(i for i in events if i > 2)
        assert any(e["kind"] in EVENT_KINDS for e in app.current_step["events"])
        first = app.step_index
        await pilot.press("n")
        assert app.step_index == min(i for i in events if i > first)
        await pilot.press("p")
        assert app.step_index == first


@run_async
async def test_selecting_a_sequence_numbers_its_blocks_in_block_table_order(trace):
    app = make_app(trace, start_step=6)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("tab", "tab")  # state machine -> KV pages -> sequences
        assert app.focused is app.seqs
        await pilot.press("down", "down")  # select A, then B
        assert app.selected_seq == 1
        table = next(s for s in app.current_step["seqs"] if s["seq_id"] == 1)["block_table_after"]
        assert app.kv.table_index == {block: i for i, block in enumerate(table)}  # logical blocks from 0
        columns = app.kv.columns()
        for position, block in enumerate(table):
            line = text_of(app.kv.render_line(1 + block // columns - app.kv.scroll_offset.y))
            start = app.kv.label_width() + (block % columns) * CELL
            assert line[start] == "B" and line[start + 2 : start + 4] == f"{position:>2}"
        await pilot.press("escape")
        assert app.selected_seq is None and app.kv.table_index == {}


@run_async
async def test_clicking_a_block_selects_its_owner(trace):
    app = make_app(trace, start_step=9)
    async with app.run_test(size=SIZE) as pilot:
        kv = app.query_one(KVPagesView)
        block = 7  # B's first block at step 9
        x = kv.label_width() + (block % kv.columns()) * CELL + 1
        y = 1 + 1 + block // kv.columns()  # title line, summary line, then rows
        await pilot.click(KVPagesView, offset=(x, y))
        assert app.selected_block == block
        assert app.selected_seq == 1
        assert text_of(kv.render_line(0)).startswith("block 7: B#1")


@run_async
async def test_clicking_a_chip_or_a_batch_column_selects_that_sequence(trace):
    app = make_app(trace, start_step=6)
    async with app.run_test(size=SIZE) as pilot:
        ((x, y),) = [cell for cell, seq_id in app.machine.chip_cells.items() if seq_id == 1]
        await pilot.click(StateMachineView, offset=(x, y + 1))  # + the title line
        assert app.selected_seq == 1
        start = next(start for start, _, seq_id in app.batch.column_owner if seq_id == 2)
        await pilot.click(BatchView, offset=(LABEL_WIDTH + start, 1 + 2))
        assert app.selected_seq == 2


@run_async
async def test_s_saves_an_svg_screenshot(trace, tmp_path):
    app = make_app(trace, tmp_path, start_step=4)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("s")
        path = app.last_screenshot
        assert path is not None and path.parent == tmp_path and path.name == "nanoengine-step-4.svg"
        assert path.read_text(encoding="utf-8").lstrip().startswith("<svg")


@run_async
async def test_help_lists_the_keys_and_closes(trace):
    app = make_app(trace)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        assert type(app.screen).__name__ == "HelpScreen"
        await pilot.press("right", "space", "plus", "n", "end")  # the main view's keys do nothing under the dialog
        assert (app.step_index, app.playing, app.speed_index) == (0, False, 1)
        await pilot.press("escape")
        assert app.screen is app.screen_stack[0]
        await pilot.press("tab", "z")  # zoom the KV pages panel, then restore
        assert app.screen.maximized is app.kv
        await pilot.press("z")
        assert app.screen.maximized is None


@run_async
async def test_stepping_and_jumping_draw_the_same_screen(trace):
    """Views are memoryless: step 6 reached by stepping looks the same as step 6 reached by a jump."""
    stepped, jumped = make_app(trace), make_app(trace)
    async with stepped.run_test(size=SIZE) as pilot:
        await pilot.press(*["right"] * 6)
        first = await settled_screenshot(pilot, stepped, 6)
    async with jumped.run_test(size=SIZE) as pilot:
        await pilot.press("end")
        await type_in_goto_box(pilot, jumped, "6", "enter")
        second = await settled_screenshot(pilot, jumped, 6)
    assert first == second, "\n".join(screen_text_diff(first, second))


async def settled_screenshot(pilot, app: ReplayApp, step_index: int) -> str:
    """The screen once the app is back on its main screen at step_index and has handled what that
    queued (a busy machine can leave the go-to box's dismissal or a redraw pending after a key)."""
    await wait_until(
        pilot, lambda: app.step_index == step_index and len(app.screen_stack) == 1, f"step {step_index} shown"
    )
    await pilot.pause()
    return app.export_screenshot()


def screen_text_diff(first: str, second: str) -> list[str]:
    """The text of two SVG screenshots, line by line, where they differ (for a failure's message)."""
    a, b = (re.findall(r">([^<]*)</text>", svg) for svg in (first, second))
    return list(difflib.unified_diff(a, b, "stepped", "jumped", lineterm=""))[:60]


@run_async
async def test_violations_show_on_their_step_only(trace):
    trace = copy.deepcopy(trace)
    trace.steps[2]["violations"] = [
        {"step": 2, "seq_id": 1, "invariant": "slots_in_table", "message": "slot 99 is outside seq 1's blocks"}
    ]
    trace.steps[8]["violations"] = []
    app = make_app(trace, start_step=1)
    async with app.run_test(size=SIZE) as pilot:
        bar = app.query_one("#violations")
        assert not bar.display
        await pilot.press("right")
        assert bar.display
        assert "slots_in_table seq B#1: slot 99 is outside seq 1's blocks" in str(bar.render())
        await pilot.press("right")
        assert not bar.display


async def answer(pilot, question, right: bool) -> None:
    if question.choices:
        choice = question.answer if right else next(c for c in question.choices if c != question.answer)
        await pilot.press(*["down"] * question.choices.index(choice), "enter")
    else:
        await pilot.press(*(question.answer if right else str(int(question.answer) + 1)), "enter")


@run_async
async def test_predict_mode_asks_then_reveals_and_scores(trace):
    app = make_app(trace, predict=True)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("right")
        assert isinstance(app.screen, PredictScreen)
        assert app.step_index == 0  # the next step stays hidden
        await answer(pilot, app.screen.question, right=True)
        assert app.step_index == 1 and (app.quiz.right, app.quiz.asked) == (1, 1)
        await pilot.press("right")  # a question about step 2
        await answer(pilot, app.screen.question, right=False)
        assert app.step_index == 2 and (app.quiz.right, app.quiz.asked) == (1, 2)
        await pilot.press("right", "escape")  # Esc reveals without scoring
        assert app.step_index == 3 and app.quiz.asked == 2


@run_async
async def test_predict_asks_only_what_the_screen_determines_and_varies(trace):
    """Through the whole trace: the kind changes every question and all kinds come up; a slot
    question's answer follows from the block table on screen; a status question is about a
    sequence whose max_tokens the panel shows (gen/max) and whose EOS cannot surprise."""
    app = make_app(trace, predict=True)
    asked = []
    async with app.run_test(size=SIZE) as pilot:
        while app.step_index < len(trace.steps) - 1:
            shown = app.current_step
            cells = {app.seqs.row_ids[i]: row for i, row in enumerate(app.seqs.rows)}
            await pilot.press("right")
            if isinstance(app.screen, PredictScreen):
                asked.append((shown, cells, app.screen.question))
                await pilot.press("escape")
    kinds = [q.kind for _, _, q in asked]
    assert all(a != b for a, b in zip(kinds, kinds[1:])), kinds
    assert set(kinds) == {"status", "slot", "block", "scheduled", "batch"}, kinds
    params = {r["seq_id"]: r["params"] for r in trace.requests.values()}
    for shown, cells, question in asked:
        if question.kind == "slot":
            seq_id = next(s for s in params if f"#{s}'s token" in question.prompt)
            position = int(question.prompt.split("position ")[1].split(" ")[0])
            table = next(q["block_table_after"] for q in shown["seqs"] if q["seq_id"] == seq_id)
            assert int(question.answer) == table[position // 4] * 4 + position % 4
        if question.kind == "status":
            seq_id = next(s for s in params if f"#{s} have" in question.prompt)
            assert params[seq_id]["ignore_eos"] and not params[seq_id]["stop"]
            assert f"max_tokens {params[seq_id]['max_tokens']}" in question.prompt
            assert cells[seq_id][6].endswith(f"/{params[seq_id]['max_tokens']}")  # gen/max, on screen


@run_async
async def test_80x24_fits_every_panel(trace):
    app = make_app(trace, start_step=8)
    async with app.run_test(size=(80, 24)):
        for widget_id in ("topbar", "timeline", "narration", "machine", "kv", "seqs", "batch"):
            region = app.query_one(f"#{widget_id}").region
            assert region.height > 0 and region.bottom <= 23, widget_id
        assert app.machine.region.height >= 7


@run_async
async def test_truncated_trace_opens_its_prefix_with_a_warning(tmp_path):
    lines = TRACE.read_text(encoding="utf-8").splitlines()
    cut = tmp_path / "cut.jsonl"
    cut.write_text("\n".join(lines[:6]) + "\n" + lines[6][:100], encoding="utf-8")
    trace = load_trace(cut)
    assert trace.warning and len(trace.steps) == 5
    app = make_app(trace)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("end")
        assert app.current_step["step"] == 4
        banner = app.query_one("#banner")
        assert banner.display and "cut short" in str(banner.render())
        await pilot.press("x")
        assert not banner.display


@pytest.mark.parametrize(
    "content, expected",
    [
        ("", "is empty"),
        ("not json at all\n", "not a nanoengine trace"),
        (json.dumps({"type": "header", "schema_version": 1}) + "\n{broken\n", "line 2"),
    ],
)
def test_broken_trace_is_a_one_line_error(tmp_path, capsys, content, expected):
    path = tmp_path / "broken.jsonl"
    path.write_text(content, encoding="utf-8")
    assert run_replay(path) == 2
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1 and "Traceback" not in err


def test_missing_file_and_bad_start_step(tmp_path, capsys):
    assert run_replay(tmp_path / "nope.jsonl") == 2
    assert "no such trace file" in capsys.readouterr().err
    assert run_replay(TRACE, start_step=99) == 2
    assert "outside the trace" in capsys.readouterr().err


def test_lazy_opening_matches_the_full_loader(trace):
    lazy = load_lazy(TRACE)
    assert lazy.header == trace.header and lazy.requests == trace.requests
    assert list(lazy.steps) == trace.steps
    assert lazy.marks == [marks_from_step(step) for step in trace.steps]


def damage(line: str) -> str:
    """Break the JSON inside the long `seqs` part, where the lazy scan does not look."""
    assert '"seqs":[' in line
    return line.replace('"seqs":[', '"seqs":[[[', 1)


def test_lazy_opening_of_a_cut_and_a_damaged_file(tmp_path):
    lines = TRACE.read_text(encoding="utf-8").splitlines()
    cut = tmp_path / "cut.jsonl"
    cut.write_text("\n".join(lines[:6]) + "\n" + lines[6][:100], encoding="utf-8")
    lazy = load_lazy(cut)
    assert len(lazy.steps) == 5 and "cut short" in lazy.warning
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text("\n".join(lines[:4] + [damage(lines[4])] + lines[5:]) + "\n", encoding="utf-8")
    lazy = load_lazy(damaged)  # opens: only the first and last steps are parsed up front
    with pytest.raises(TraceError, match="line 5"):
        lazy.steps[3]


@run_async
async def test_a_damaged_step_of_a_lazy_trace_is_a_notice_not_a_crash(tmp_path):
    lines = TRACE.read_text(encoding="utf-8").splitlines()
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text("\n".join(lines[:4] + [damage(lines[4])] + lines[5:]) + "\n", encoding="utf-8")
    app = make_app(load_lazy(damaged))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("right", "right", "right")
        assert app.step_index == 2  # step index 3 (line 5) cannot be shown
        assert any("line 5" in n.message for n in app._notifications)
        await pilot.press("end", "left")
        assert app.step_index == len(lines) - 3


@pytest.mark.parametrize("num_steps, width", [(14, 98), (2, 80), (10_000, 120), (5, 5)])
def test_scrubber_maps_first_and_last_step_to_the_bar_ends(num_steps, width):
    timeline = TimelineView([""] * num_steps, list(range(num_steps)))
    last = num_steps - 1
    assert timeline.column_of(0, width) == 0 and timeline.column_of(last, width) == width - 1
    assert timeline.index_at(0, width) == 0 and timeline.index_at(width - 1, width) == last
    columns = [timeline.column_of(i, width) for i in range(num_steps)]
    assert columns == sorted(columns) and all(0 <= c < width for c in columns)


@run_async
async def test_the_banner_shows_the_look_for_text_until_dismissed(trace):
    app = make_app(trace, guide="the preemption at step 8")
    async with app.run_test(size=SIZE) as pilot:
        banner = app.query_one("#banner")
        assert banner.display and "Look for: the preemption at step 8" in str(banner.render())
        await pilot.click("#banner")
        assert not banner.display
    plain = make_app(trace)
    async with plain.run_test(size=SIZE):
        assert not plain.query_one("#banner").display


@run_async
async def test_a_shared_trace_shows_the_look_for_text_of_its_header(trace, tmp_path):
    """A lesson's or demo's trace keeps its Look for text in the header: `nanoengine replay` of the
    file alone shows it (and opens at its focus_step, as run_replay did before)."""
    lines = TRACE.read_text(encoding="utf-8").splitlines(keepends=True)
    header = json.loads(lines[0]) | {"focus_step": 8, "look_for": "C is preempted <b>here</b> [red]"}
    shared = tmp_path / "shared.jsonl"
    shared.write_text(json.dumps(header) + "\n" + "".join(lines[1:]), encoding="utf-8")
    app = make_app(load_trace(shared))
    async with app.run_test(size=SIZE):
        banner = app.query_one("#banner")
        assert banner.display and "Look for: C is preempted <b>here</b> [red]" in str(banner.render())


@run_async
async def test_step_counter_shows_the_range_of_step_numbers(trace):
    app = make_app(trace)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("end")
        last = app.step_numbers[-1]
        assert text_of(app.query_one(TimelineView).render_line(1)).startswith(f"step {last} of 0–{last}")


@run_async
async def test_predict_answer_is_shown_in_the_next_question_not_over_it(trace):
    app = make_app(trace, predict=True)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("right")
        await pilot.press(*app.screen.question.answer, "enter")
        assert app._notifications  # the verdict, as a toast
        await pilot.press("right")
        assert isinstance(app.screen, PredictScreen)
        assert not app._notifications  # cleared: it would cover the question
        assert "✓ right" in str(app.screen.query_one("#predict-previous").render())


@run_async
async def test_zoomed_sequences_panel_fills_the_screen(trace):
    app = make_app(trace, start_step=6)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("tab", "tab", "z")
        assert app.screen.maximized is app.seqs
        assert app.seqs.region.height >= SIZE[1] - 2


@run_async
async def test_a_terminal_too_small_gets_a_notice(trace):
    app = make_app(trace)
    async with app.run_test(size=(40, 12)):
        notice = app.query_one("#too-small")
        assert notice.display and "Make the terminal larger" in str(notice.render())
        assert not app.machine.display or app.machine.region.height == 0
    roomy = make_app(trace)
    async with roomy.run_test(size=SIZE):
        assert roomy.query_one("#too-small").region.height == 0


@run_async
async def test_byte_tokens_are_drawn_readably(trace):
    trace = copy.deepcopy(trace)
    seq = trace.steps[3]["seqs"][0]
    seq["new_token_ids"], seq["new_token_texts"] = [133], ["\ufffd"]
    seq["output_text"] = seq.get("output_text", "") + "\x03\ufffd"
    app = make_app(trace, start_step=3)
    async with app.run_test(size=(160, 40)):
        screen = app.export_screenshot()
        assert "\ufffd" not in screen and "\x03" not in screen
        assert "⟨id 133⟩" in str(app.query_one("#narration").render())


def test_the_narration_panel_says_why_each_decision_was_taken(tmp_path):
    """A version-3 trace: the TUI's narration carries the why-lines (what capped a chunk, the blocks
    an admission takes, why the waiting head was not admitted)."""
    from nanoengine.sampling_params import SamplingParams
    from tracer.trace.recorder import record_run

    path, _ = record_run(
        ["a" * 12, "b" * 12],
        SamplingParams(max_tokens=2, ignore_eos=True),
        tmp_path / "t.jsonl",
        model="tiny",
        block_size=4,
        max_num_batched_tokens=8,
        num_threads=1,
    )

    async def look() -> str:
        app = make_app(load_trace(path), tmp_path)
        async with app.run_test(size=(200, 50)):
            return str(app.query_one("#narration").render())

    text = asyncio.run(look())
    assert "(takes 2 of the " in text and "(chunk 1 of 2: the whole 8-token budget)" in text
    assert "was not admitted: the 8-token budget is spent" in text


def test_the_kv_pages_tell_a_block_hit_in_the_step_that_computes_it(tmp_path):
    from nanoengine.sampling_params import SamplingParams
    from tracer.replay.colors import seq_letter
    from tracer.trace.recorder import record_run

    params = SamplingParams(max_tokens=2, ignore_eos=True)
    path, _ = record_run(["twins share this"] * 3, params, tmp_path / "t.jsonl", model="tiny", block_size=4)
    trace = load_trace(path)
    view = KVPagesView()
    view.animations = False
    view.show(trace.steps[0], None, trace.header)
    a, b, c = (s["block_table"] for s in trace.steps[0]["seqs"])
    letters = ",".join(seq_letter(s["seq_id"]) for s in trace.steps[0]["seqs"][1:])
    assert view.block_details(a[0]).endswith(f"written this step and hit in it by {letters}")
    assert "hit in it" not in view.block_details(a[3])  # A's last block: B and C compute their own
    view.show(trace.steps[1], trace.steps[0], trace.header)
    assert "hit in it" not in view.block_details(a[0])


@run_async
async def test_a_trace_of_a_bfloat16_kv_cache_says_so_in_the_top_bar(trace, tmp_path):
    """kv_cache_dtype in the header's config (the recorder writes it where it is not auto) shows
    beside the block size, as text: a header's value is never read as markup."""
    lines = TRACE.read_text(encoding="utf-8").splitlines(keepends=True)
    header = json.loads(lines[0])
    assert "kv_cache_dtype" not in header["config"]
    app = make_app(trace)
    async with app.run_test(size=(160, 30)):
        assert "kv_cache_dtype" not in str(app.query_one("#topbar").render())
    header["config"]["kv_cache_dtype"] = "bfloat16[red]"
    narrow = tmp_path / "narrow.jsonl"
    narrow.write_text(json.dumps(header) + "\n" + "".join(lines[1:]), encoding="utf-8")
    app = make_app(load_trace(narrow))
    async with app.run_test(size=(160, 30)):
        assert "· kv_cache_dtype bfloat16[red]" in str(app.query_one("#topbar").render())
