"""Chinese lesson texts: a line break between two Chinese characters is joined before markdown
renders it (markdown would show it as a space, which Chinese prose does not have)."""

import re

from rich.console import Console

from tracer.cli.lesson import join_wide_lines, show_markdown_text


def test_a_break_between_wide_characters_is_joined():
    assert join_wide_lines("这是第一行\n第二行接着。") == "这是第一行第二行接着。"


def test_code_lists_headings_and_english_keep_their_breaks():
    text = "段落\n\n```\n代码\n代码\n```\n- 列表\n- 第二项\n# 标题\n正文\nEnglish line\n中文"
    assert join_wide_lines(text) == text


def test_a_rendered_zh_lesson_has_no_space_between_two_chinese_characters_from_a_line_break():
    from tracer.teach.lessons import find_lesson

    lesson = find_lesson("06")
    source = (lesson.path / "README.zh.md").read_text(encoding="utf-8")
    console = Console(width=200, record=True, color_system=None)
    show_markdown_text(source, console)
    rendered = console.export_text()
    wide = r"[\u4e00-\u9fff，。：；、]"
    broken = re.findall(rf"({wide})\n\s*({wide})", source)  # breaks between two Chinese characters
    assert broken, "the test needs a lesson text with such breaks"
    for a, b in broken:
        assert f"{a} {b}" not in rendered or f"{a} {b}" in source, f"a space between {a} and {b}"
