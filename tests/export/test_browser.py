"""The HTML export in a real browser: Debian's Chromium, headless, driven by Playwright.

Skips, with the reason in pytest's summary, when Playwright or Chromium is missing
(`pip install -e '.[test]'`; `apt-get install chromium`). CI installs both (.ci/run).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import HANG_S
from headless_chromium import launch, require_browser

from tracer.cli.main import main

sync_api = require_browser()
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def exported(tiny_trace_path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("browser") / "replay.html"
    assert main(["export", str(tiny_trace_path), "--html", str(out), "--steps", "0-8"]) == 0
    return out


@pytest.fixture(scope="module")
def browser(exported):  # after the export: Playwright's sync API holds an event loop, Textual needs its own
    with sync_api.sync_playwright() as playwright:
        browser = launch(playwright)
        yield browser
        browser.close()


def step_on_counter(page) -> int:
    match = re.match(r"Step (\d+) · (\d+) of (\d+)", page.inner_text("#counter"))
    assert match, page.inner_text("#counter")
    return int(match.group(1))


def test_arrow_keys_step_through_the_replay(browser, exported, tmp_path):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.goto(exported.as_uri())
    page.wait_for_selector("body[data-ready=true]", timeout=HANG_S * 1000)
    first, narration = step_on_counter(page), page.inner_text("#narration")
    assert narration.startswith(f"Step {first}:")
    for _ in range(3):
        page.keyboard.press("ArrowRight")
    assert step_on_counter(page) == first + 3
    assert page.inner_text("#narration") != narration
    assert page.inner_text("#narration").startswith(f"Step {first + 3}:")
    screen = page.inner_text("#frame").replace("\xa0", " ")
    assert f"step {first + 3} of" in screen  # the TUI's own timeline, in the frame
    shot = tmp_path / "replay-step3.png"
    page.screenshot(path=str(shot))
    assert shot.stat().st_size > 10_000
    page.keyboard.press("End")
    assert step_on_counter(page) == 8
    page.keyboard.press("Home")
    assert step_on_counter(page) == first
    assert [url for url in requests if not url.startswith("file:")] == []  # opens from disk, no network
    page.close()
