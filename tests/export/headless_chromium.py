"""Debian's Chromium, headless, driven by Playwright: shared by the browser tests.

sync_api = require_browser()      Playwright's sync API, or the test module is skipped with the reason
launch(playwright) -> Browser
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import HANG_S

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Headless as root, and quiet: this machine's network is closed, so no background connections.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def require_browser():
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="Playwright for Python is not installed (pip install -e '.[test]')"
    )
    if not Path(CHROMIUM).exists():
        pytest.skip(
            "no Chromium for the browser test: apt-get install chromium (Debian's package, /usr/bin/chromium)",
            allow_module_level=True,
        )
    return sync_api


def launch(playwright):
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=HANG_S * 1000)
