"""The replay in Chinese (--lang zh / NANOENGINE_LANG=zh) on a committed preemption trace
(tests/data/scenario_v3.jsonl: at step 6, D is preempted because C needs a block and none is free).

SVG snapshots at 80×24 and 160×48 of that step (narration with its why) and of the help screen;
every rendered row exactly as wide as the terminal at every step (a Chinese character takes two
cells); the narration and the `--text` lines Chinese prose around intact identifiers.

Update the baselines after an intended visual change:
    .venv/bin/python -m pytest tests/replay/test_app_zh.py --snapshot-update
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from conftest import wait_until
from rich.cells import cell_len

from tracer.i18n import language, set_language
from tracer.replay.app import ReplayApp
from tracer.replay.decision_code import step_code_text
from tracer.replay.model import viewer_header
from tracer.replay.narration import narrate
from tracer.trace.trace_file import load_trace

TRACE = Path(__file__).parents[1] / "data" / "scenario_v3.jsonl"
PREEMPTION_STEP = 6
SIZES = {"80x24": (80, 24), "160x48": (160, 48)}
CJK = re.compile(r"[\u4e00-\u9fff]")
QUOTED = re.compile(r"'[^']*'|⟨[^⟩]*⟩|`[^`]*`|\([^()]*\.py[^()]*\)")  # tokens, code, upstream paths
# An English word of prose: lower-case letters only (an identifier has _ . or digits, a status is
# upper case); the words that stay English in Chinese technical text are allowed.
WORD = re.compile(r"(?<![\w./])[a-z]{3,}(?![\w./(])")
KEPT = {"token", "prompt", "logits", "prefill", "decode", "nano", "vllm", "stop", "length", "abort", "tiny"}


@pytest.fixture
def zh():
    before = language()
    set_language("zh")
    yield
    set_language(before)


@pytest.fixture(scope="module")
def trace():
    return load_trace(TRACE)


def english_words(text: str) -> list[str]:
    return [w for w in WORD.findall(QUOTED.sub("", text)) if w not in KEPT]


def screen_rows(app: ReplayApp) -> list[str]:
    """The characters of every row on the screen, as the terminal receives them."""
    strips = app.screen._compositor.render_strips()  # what the driver writes: the screen's rows
    return ["".join(segment.text for segment in strip) for strip in strips]


@pytest.mark.parametrize("size", list(SIZES))
def test_zh_preemption_step_snapshot(snap_compare, zh, trace, size):
    app = ReplayApp(trace, start_step=PREEMPTION_STEP, animations=False)
    assert snap_compare(app, terminal_size=SIZES[size])


@pytest.mark.parametrize("size", list(SIZES))
def test_zh_help_screen_snapshot(snap_compare, zh, trace, size):
    app = ReplayApp(trace, start_step=PREEMPTION_STEP, animations=False)
    assert snap_compare(app, terminal_size=SIZES[size], press=["question_mark"])


@pytest.mark.parametrize("size", list(SIZES))
def test_no_row_is_wider_or_narrower_than_the_terminal_in_zh(zh, trace, size):
    width, height = SIZES[size]

    async def run() -> None:
        app = ReplayApp(trace, animations=False)
        async with app.run_test(size=(width, height)) as pilot:
            for index in range(len(trace.steps)):
                app.go_to(index)
                if index == PREEMPTION_STEP:
                    await pilot.press("c")  # the code panel too
                await pilot.pause()
                rows = screen_rows(app)
                assert len(rows) == height
                for y, row in enumerate(rows):
                    assert cell_len(row) == width, f"step {index}, row {y}: {cell_len(row)} cells: {row!r}"
                if index == PREEMPTION_STEP:
                    await pilot.press("c")
            assert CJK.search("".join(rows)), "the screen shows no Chinese: is the zh catalog compiled?"
            await pilot.press("question_mark")
            await pilot.pause()
            for row in screen_rows(app):
                assert cell_len(row) == width, row

    asyncio.run(run())


def test_the_screen_speaks_chinese_at_the_preemption(zh, trace):
    texts = ("第 6 步：序列 3 (D) 被抢占，退回 WAITING（序列 2 (C) 需要 1 个块", "帮助", "状态机", "KV 页", "抢占")

    async def run() -> list[str]:
        app = ReplayApp(trace, start_step=PREEMPTION_STEP, animations=False)
        async with app.run_test(size=SIZES["160x48"]) as pilot:
            # a busy machine can take more than one pause to lay out and paint the first screen
            def painted() -> bool:
                screen = "\n".join(screen_rows(app))
                return all(text in screen for text in texts)

            await wait_until(pilot, app, painted, "the Chinese screen at the preemption")
            return screen_rows(app)

    screen = "\n".join(asyncio.run(run()))
    for text in texts:
        assert text in screen, text
    assert "▶ RUNNING" in screen and "block_table" in screen  # statuses and identifiers stay English


def test_every_narration_is_chinese_prose_with_identifiers_intact(zh, trace):
    header = viewer_header(trace)
    for step in trace.steps:
        text = narrate(step, header)
        assert text.startswith(f"第 {step['step']} 步："), text
        assert english_words(text) == [], text
    text = narrate(trace.steps[PREEMPTION_STEP], header)
    assert "WAITING" in text and "序列 2 (C) 需要 1 个块，空闲块只有 0 个" in text


def test_the_text_replay_is_chinese(zh, trace):
    """`nanoengine replay TRACE --step 6 --text --lang zh`: the narration, then the code panel."""
    header = viewer_header(trace)
    lines = step_code_text(trace.steps[PREEMPTION_STEP], header)
    prose = [line for line in lines if line and not re.match(r"[ ▶›]\s*\d+ │", line)]  # not the source lines
    assert "代码：" in prose
    assert any("由 Scheduler.make_room 第" in line and "行决定" in line for line in prose), prose
    for line in prose:
        assert english_words(line) == [], line


def test_english_is_back_after_zh(trace):
    """The language is per process, chosen once: tests that switch it switch it back."""
    assert narrate(trace.steps[PREEMPTION_STEP], viewer_header(trace)).startswith("Step 6: seq 3 (D) was preempted")
