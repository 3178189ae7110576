"""The README's classroom example, exported with the defaults, in Debian's headless Chromium: one
frame size for the whole export (a long narration scrolls in its own three lines), terminal text
of at least 14 px at 1280x720, a title whose descenders are not cut, speaker notes in a window of
their own (`s`), and `--no-code` frames without the code panel. Skips like test_browser.py when
Chromium is missing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from headless_chromium import launch, require_browser

from tracer.cli.main import main

sync_api = require_browser()
pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Name three primary colours.",
    "Explain what a KV cache is.",
]
NOTES = "# class\n## step 0\nAsk: which block do all four share?\n\n## step 2\nOne token each.\n"


@pytest.fixture(scope="module")
def classroom(tmp_path_factory) -> tuple[Path, Path]:
    """The README's 4-prompt trace (tiny model), exported with the default size and with speaker notes."""
    folder = tmp_path_factory.mktemp("classroom")
    trace = folder / "class.jsonl"
    assert main(["trace", *PROMPTS, "--model", "tiny", "--max-tokens", "6", "--out", str(trace), "--no-tui"]) == 0
    (folder / "notes.md").write_text(NOTES, encoding="utf-8")
    out = folder / "class.html"
    assert main(["export", str(trace), "--html", str(out), "--steps", "0-3", "--notes", str(folder / "notes.md")]) == 0
    bare = folder / "bare.html"
    assert main(["export", str(trace), "--html", str(bare), "--steps", "0-1", "--no-code"]) == 0
    return out, bare


@pytest.fixture(scope="module")
def browser(classroom):  # after the export: Playwright's sync API holds an event loop, Textual needs its own
    with sync_api.sync_playwright() as playwright:
        browser = launch(playwright)
        yield browser
        browser.close()


def open_page(browser, path: Path, width: int, height: int):
    page = browser.new_page(viewport={"width": width, "height": height})
    page.goto(path.as_uri())
    page.wait_for_selector("body[data-ready=true]", timeout=60_000)
    return page


def frame_box(page) -> list[float]:
    return page.eval_on_selector(
        "#frame svg", "e => { const r = e.getBoundingClientRect(); return [r.width, r.height]; }"
    )


def frame_text(page) -> str:
    return page.eval_on_selector("#frame svg", "e => e.textContent").replace("\xa0", " ")


@pytest.mark.parametrize("width, height", [(1280, 720), (1920, 1080)])
def test_one_frame_size_for_every_step_and_readable_text(browser, classroom, width, height):
    page = open_page(browser, classroom[0], width, height)
    page.keyboard.press("Home")
    narration = page.eval_on_selector("#narration", "e => [e.scrollHeight, e.clientHeight]")
    assert narration[0] > narration[1]  # step 0 narrates four admissions: more than its three lines
    assert "more" in page.get_attribute("#narration", "class")  # faded: there is more to scroll to
    boxes = []
    for _ in range(4):
        boxes.append(frame_box(page))
        page.keyboard.press("ArrowRight")
    assert all(box == boxes[0] for box in boxes), boxes
    text_px = page.eval_on_selector("#frame svg text", "t => 20 * t.getScreenCTM().a")
    assert text_px >= (14 if height == 720 else 21), text_px
    title = page.eval_on_selector(
        "h1", "e => [e.scrollHeight, e.clientHeight, e.getBoundingClientRect().top, e.getBoundingClientRect().bottom]"
    )
    header_bottom = page.eval_on_selector("header", "e => e.getBoundingClientRect().bottom")
    assert title[0] <= title[1] and title[2] >= 0 and title[3] <= header_bottom  # nothing of the title cut
    assert page.evaluate("document.documentElement.scrollHeight") <= height
    page.close()


def test_speaker_notes_open_in_their_own_window_and_follow_the_step(browser, classroom):
    page = open_page(browser, classroom[0], 1280, 720)
    page.keyboard.press("Home")
    assert page.is_visible("#notes")
    with page.expect_popup() as popup_info:
        page.keyboard.press("s")
    notes = popup_info.value
    assert notes.inner_text("#step").startswith("Step 0")
    assert notes.inner_text("#notes") == "Ask: which block do all four share?"
    page.keyboard.press("ArrowRight")
    assert notes.inner_text("#notes") == "(no notes for this step)"
    notes.keyboard.press("ArrowRight")  # the presenter steps from the notes window
    assert page.inner_text("#counter").startswith("Step 2")
    assert notes.inner_text("#notes") == "One token each."
    assert "Ask:" not in page.inner_text("body")  # never on the projected page
    page.close()


def test_no_code_leaves_the_code_panel_out(browser, classroom):
    with_code, bare = classroom
    page = open_page(browser, with_code, 1280, 720)
    assert "code that decided" in frame_text(page) and "▶" in frame_text(page)
    page.close()
    page = open_page(browser, bare, 1280, 720)
    assert "code that decided" not in frame_text(page) and "batch (flat step inputs)" in frame_text(page)
    assert not page.is_visible("#notes")  # no notes given: no notes button
    page.close()


def test_notes_for_a_step_the_trace_lacks_are_one_line_errors(classroom, tmp_path, capsys):
    notes = tmp_path / "notes.md"
    notes.write_text("## step 999\nlate\n", encoding="utf-8")
    trace = classroom[0].with_name("class.jsonl")
    assert main(["export", str(trace), "--html", str(tmp_path / "x.html"), "--notes", str(notes)]) == 2
    assert "--notes: class.jsonl has no step 999" in capsys.readouterr().err
    notes.write_text("no headings here\n", encoding="utf-8")
    assert main(["export", str(trace), "--html", str(tmp_path / "x.html"), "--notes", str(notes)]) == 2
    assert "no '## step N' heading" in capsys.readouterr().err
