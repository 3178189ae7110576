"""The HTML export as a classroom projects it: Debian's Chromium, headless, at 1280x720 and
1920x1080. The page fits the screen (frame, narration and controls inside the viewport, nothing
below the fold), opens at the trace's focus step with its "Look for" text, its terminal text is
at least 24 px at 1920x1080 with `--size 120x26`, and `n` / `p` / `f` go to the next event, the
previous event and the focus step. Skips like test_browser.py when Chromium is missing.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from headless_chromium import launch, require_browser

from tracer.cli.main import main

sync_api = require_browser()
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def step_on_counter(page) -> int:
    match = re.match(r"Step (\d+) · (\d+) of (\d+)", page.inner_text("#counter"))
    assert match, page.inner_text("#counter")
    return int(match.group(1))


@pytest.fixture(scope="module")
def demo_page(tmp_path_factory) -> tuple[Path, dict]:
    """The preemption demo (tiny model): its trace header has focus_step and look_for."""
    from tracer.teach.demos import DEMOS, run_demo
    from tracer.trace.trace_file import load_trace

    folder = tmp_path_factory.mktemp("demo")
    (run,) = run_demo(DEMOS["preemption"], "tiny", folder, threads=1)
    out = folder / "preemption.html"
    assert main(["export", str(run.trace_path), "--html", str(out), "--size", "120x26"]) == 0
    return out, load_trace(run.trace_path).header


@pytest.fixture(scope="module")
def demo_browser(demo_page):
    with sync_api.sync_playwright() as playwright:
        browser = launch(playwright)
        yield browser
        browser.close()


def inside(page, selector: str) -> bool:
    box = page.eval_on_selector(
        selector, "e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; }"
    )
    width, height = page.viewport_size["width"], page.viewport_size["height"]
    return box[0] >= 0 and box[1] >= 0 and box[2] <= width and box[3] <= height and box[3] > box[1]


def frame_font_px(page) -> float:
    """The terminal text's size on the screen: Rich draws it at 20 px in SVG units, scaled by the view box."""
    return page.eval_on_selector("#frame svg text", "t => 20 * t.getScreenCTM().a")


@pytest.mark.parametrize("width, height", [(1280, 720), (1920, 1080)])
def test_the_page_fits_a_16_9_screen_and_opens_at_the_focus_step(demo_browser, demo_page, width, height, tmp_path):
    out, header = demo_page
    page = demo_browser.new_page(viewport={"width": width, "height": height})
    page.goto(out.as_uri())
    page.wait_for_selector("body[data-ready=true]", timeout=60_000)
    assert step_on_counter(page) == header["focus_step"]  # opens where the demo says to look
    assert page.inner_text("#look-for").startswith("Look for: " + header["look_for"][:40])
    for selector in ("#frame svg", "#narration", "#controls", "#next-event", "#counter", "#look-for"):
        assert inside(page, selector), f"{selector} is outside the {width}x{height} viewport"
    assert page.evaluate("document.documentElement.scrollHeight") <= height  # nothing below the fold
    frame = page.inner_html("#frame")
    assert "<circle" not in frame and "nanoengine&nbsp;replay" not in frame  # no imitation window
    if (width, height) == (1920, 1080):  # readable from the back of the room
        assert frame_font_px(page) >= 24, frame_font_px(page)
        assert float(page.eval_on_selector("#narration", "e => parseFloat(getComputedStyle(e).fontSize)")) >= 24
    page.screenshot(path=str(tmp_path / f"page-{width}x{height}.png"))
    page.close()


def test_n_and_p_go_to_the_next_and_previous_events_step(demo_browser, demo_page):
    out, header = demo_page
    from tracer.replay.marks import EVENT_KINDS
    from tracer.trace.trace_file import load_trace

    trace = load_trace(Path(str(out).replace("preemption.html", "demo-preemption.jsonl")))
    events = [s["step"] for s in trace.steps if {e["kind"] for e in s["events"]} & EVENT_KINDS or s["violations"]]
    page = demo_browser.new_page(viewport={"width": 1280, "height": 720})
    page.goto(out.as_uri())
    page.wait_for_selector("body[data-ready=true]", timeout=60_000)
    focus = step_on_counter(page)
    page.keyboard.press("n")
    assert step_on_counter(page) == min(s for s in events if s > focus)
    page.keyboard.press("p")
    assert step_on_counter(page) == focus  # the focus step is an event step (a preemption)
    page.keyboard.press("Home")
    page.click("#next-event")
    assert step_on_counter(page) == min(s for s in events if s > 0)
    page.keyboard.press("End")
    page.keyboard.press("f")
    assert step_on_counter(page) == header["focus_step"]
    page.keyboard.press("x")
    assert not page.is_visible("#look-for")
    page.close()
