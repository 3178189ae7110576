"""`nanoengine replay FILE --web`: the real TUI served by textual-serve on localhost, in headless Chromium."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from conftest import HANG_S
from headless_chromium import launch, require_browser

from tracer.cli.main import main

pytest.importorskip("textual_serve", reason="textual-serve is not installed (pip install -e '.[test]')")
sync_api = require_browser()
DRAWN_PNG_BYTES = 50_000


def test_a_bad_trace_is_refused_before_serving(tmp_path, capsys):
    assert main(["replay", str(tmp_path / "nope.jsonl"), "--web"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no such trace file" in err and len(err.splitlines()) == 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_page(url: str, server: subprocess.Popen, timeout: float = HANG_S) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"the --web server exited with {server.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.read().decode("utf-8")
        except OSError:
            time.sleep(0.3)
    pytest.fail(f"no page at {url} after {timeout:.0f} s")


def settled_screenshot(page, timeout: float = HANG_S, differs_from: bytes | None = None) -> bytes:
    """A screenshot once the terminal has drawn the TUI (a blank one packs into a few KB) and two
    in a row are the same (animations over); with differs_from, a new picture."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        time.sleep(0.5)
        shot = page.screenshot()
        if shot == last and shot != differs_from and len(shot) > DRAWN_PNG_BYTES:
            return shot
        last = shot
    pytest.fail("the served TUI never settled" + (" on a new picture" if differs_from else ""))


def test_the_tui_runs_in_the_browser_and_follows_the_keys(tiny_trace_path, tmp_path):
    port = free_port()
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "tracer.cli.main", "replay", str(tiny_trace_path), "--web", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: the app processes it starts end with it
    )
    try:
        assert "textual.js" in wait_for_page(f"http://localhost:{port}/", server)
        with sync_api.sync_playwright() as playwright:
            browser = launch(playwright)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(f"http://localhost:{port}/")
            page.wait_for_selector("#terminal.-connected", timeout=HANG_S * 1000)
            page.focus(".xterm-helper-textarea")  # where xterm.js takes keys, as a click would
            first = settled_screenshot(page)
            pictures = [first]
            for key in ("ArrowRight", "ArrowLeft", "ArrowRight"):
                for _ in range(3):
                    page.keyboard.press(key)
                pictures.append(settled_screenshot(page, differs_from=pictures[-1]))
            (tmp_path / "web-step3.png").write_bytes(pictures[-1])
            assert pictures[3] == pictures[1]  # 3 steps on, 3 back, 3 on: the same step 3, drawn the same
            browser.close()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=HANG_S)
        log.close()
