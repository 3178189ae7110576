"""The HTML export in Chinese (`nanoengine export TRACE --html OUT --lang zh`) of a committed
preemption trace: the page's words come from the catalog (the template holds none), the frames are
the Chinese TUI with every run of text sized by its cells (Rich sizes it by its characters: a run
with Chinese in it would be squeezed), and in Debian's Chromium the controls read Chinese and the
frame's rows stay inside the frame. The browser test skips like test_browser.py without Chromium.
"""

from __future__ import annotations

import base64
import gzip
import html
import json
import re
from pathlib import Path

import pytest
from conftest import HANG_S
from headless_chromium import launch, require_browser
from rich.cells import cell_len

from tracer.cli.main import main
from tracer.export.frame_pack import expand_ops
from tracer.i18n import language, set_language
from tracer.replay.svg_cells import fit_wide_text

TRACE = Path(__file__).parents[1] / "data" / "scenario_v3.jsonl"
STEPS = "5-7"  # step 6: D is preempted, C needed the block
RUN = re.compile(r'<text\b[^>]*\bx="([\d.]+)"[^>]*\btextLength="([\d.]+)"[^>]*>([^<]*)</text>')
CJK = re.compile(r"[\u4e00-\u9fff]")
CHAR_WIDTH = 12.2  # Rich's SVG cell: 0.61 of its 20 px font


@pytest.fixture(scope="module")
def zh_page(tmp_path_factory) -> Path:
    before = language()
    out = tmp_path_factory.mktemp("html-zh") / "replay.zh.html"
    try:
        assert main(["export", str(TRACE), "--html", str(out), "--steps", STEPS, "--lang", "zh"]) == 0
    finally:
        set_language(before)
    return out


def payload(page: str) -> dict:
    data = re.search(r'<script id="frames-data" type="application/octet-stream">(.*?)</script>', page, re.S)
    assert data is not None
    unpacked = json.loads(gzip.decompress(base64.b64decode(data.group(1))))
    return unpacked | {"frames": expand_ops(unpacked["frame_ops"])}


def strings(page: str) -> dict[str, str]:
    table = re.search(r'<script id="strings" type="application/json">(.*?)</script>', page, re.S)
    assert table is not None
    return json.loads(table.group(1))


def test_the_page_words_come_from_the_catalog(zh_page):
    page = zh_page.read_text(encoding="utf-8")
    assert '<html lang="zh-CN">' in page
    words = strings(page)
    assert words["play"] == "▶ 播放" and words["counter"] == "第 {step} 步 · {index}/{count}"
    assert all(CJK.search(text) for key, text in words.items() if key not in ("speed",)), words
    template = (Path(__file__).parents[2] / "tracer" / "export" / "player.html").read_text(encoding="utf-8")
    assert not CJK.search(template), "player.html must hold no words of its own"
    assert "预算 8 个 token" in page  # the subtitle
    narration = payload(page)["narration"]
    assert narration[1].startswith("第 6 步：序列 3 (D) 被抢占，退回 WAITING（序列 2 (C) 需要 1 个块")


def test_every_run_of_frame_text_is_sized_by_its_cells(zh_page):
    data = payload(zh_page.read_text(encoding="utf-8"))
    wide = 0
    for frame in data["frames"]:
        svg = "".join(data["pieces"][n] for n in frame)
        assert re.search(r"第 [567] 步", html.unescape(svg).replace("\xa0", " "))  # the TUI's timeline, in Chinese
        for _x, length, text in RUN.findall(svg):
            cells = cell_len(html.unescape(text))
            assert float(length) == pytest.approx(CHAR_WIDTH * cells, abs=0.05), text
            wide += cells != len(html.unescape(text))
    assert wide > 10  # runs with Chinese in them were checked


def test_fit_wide_text_sizes_a_chinese_run_by_its_cells():
    svg = '<text class="r1" x="12.2" y="44.4" textLength="61" clip-path="url(#l1)">第&#160;6&#160;步</text>'
    assert 'textLength="85.4"' in fit_wide_text(svg)  # 7 cells, not 5 characters
    ascii_run = '<text class="r1" x="0" y="0" textLength="24.4">ab</text>'
    assert fit_wide_text(ascii_run) == ascii_run


def test_the_zh_page_in_a_browser(zh_page):
    sync_api = require_browser()
    with sync_api.sync_playwright() as playwright:
        browser = launch(playwright)
        page = browser.new_page(viewport={"width": 1280, "height": 720})
        page.goto(zh_page.as_uri())
        page.wait_for_selector("body[data-ready=true]", timeout=HANG_S * 1000)
        assert page.inner_text("#play") == "▶ 播放"
        assert page.inner_text("#speed") == "每秒 2 步"
        assert re.fullmatch(r"第 \d+ 步 · \d+/3", page.inner_text("#counter")), page.inner_text("#counter")
        assert page.get_attribute("#next-event", "title").startswith("下一个事件")
        assert "事件" in page.inner_text("#next-event")
        page.keyboard.press("Home")
        page.keyboard.press("ArrowRight")
        assert page.inner_text("#counter").startswith("第 6 步")
        assert page.inner_text("#narration").startswith("第 6 步：")
        # play, then pause, in one turn of the page's event loop: no timer can step in between
        labels = page.evaluate(
            "() => { KEYS[' '](); const playing = $('play').textContent; KEYS[' ']();"
            " return [playing, $('play').textContent]; }"
        )
        assert labels == ["❚❚ 暂停", "▶ 播放"]
        # every run of text ends inside the frame's view box, and is as long as its cells
        runs = page.eval_on_selector_all(
            "#frame svg text",
            "ts => ts.map(t => [t.x.baseVal[0].value, t.textLength.baseVal.value, t.textContent])",
        )
        right = page.eval_on_selector("#frame svg", "s => s.viewBox.baseVal.x + s.viewBox.baseVal.width")
        assert any(CJK.search(text) for _x, _length, text in runs)
        for x, length, text in runs:
            assert x + length <= right + 0.5, text
            assert length == pytest.approx(CHAR_WIDTH * cell_len(text), abs=0.05), text
        browser.close()
