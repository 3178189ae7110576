"""Lessons in Chinese: every English lesson text has its Chinese twin, and `lesson show / hint / list`
read the twin when the language is zh (the English text, said so, while a twin is missing)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from tracer.cli.lesson import lesson_main, say_if_untranslated, short_title
from tracer.i18n import set_language
from tracer.teach.lessons import Lesson, all_lessons, lessons_root, twin

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ("README.md", "hint.md", "solved.md")  # a lesson's English texts; solved.md: bug hunts only


def english_texts() -> list[Path]:
    root = lessons_root()
    return [root / "README.md"] + [lesson.path / name for lesson in all_lessons() for name in TEXTS]


def test_every_english_lesson_text_has_its_chinese_twin():
    missing = [p.relative_to(ROOT) for p in english_texts() if p.is_file() and not twin(p, "zh").is_file()]
    assert not missing, "English lesson texts without a Chinese twin (NAME.zh.md beside NAME.md):\n" + "\n".join(
        map(str, missing)
    )


def test_the_twin_of_a_text_sits_beside_it():
    assert twin(Path("lessons/01_x/README.md"), "zh") == Path("lessons/01_x/README.zh.md")
    assert twin(Path("lessons/01_x/hint.md"), "zh") == Path("lessons/01_x/hint.zh.md")


def make_lesson(folder: Path, chinese: bool) -> Lesson:
    folder.mkdir()
    (folder / "README.md").write_text("# Lesson 1. The life of a request\n\ntext\n", encoding="utf-8")
    (folder / "hint.md").write_text("# Hints\n\n## Where to start\n\nnudge\n\n## Code\n\ncode\n", encoding="utf-8")
    if chinese:
        (folder / "README.zh.md").write_text("# 第 1 课。一个请求的一生\n\n正文\n", encoding="utf-8")
        (folder / "hint.zh.md").write_text("# 提示\n\n## 从哪里入手\n\n方向\n\n## 代码\n\n代码\n", encoding="utf-8")
    return Lesson(1, "01_request_life", folder)


def test_zh_reads_the_twin_and_english_reads_the_english(tmp_path, zh):
    lesson = make_lesson(tmp_path / "01_request_life", chinese=True)
    assert lesson.localized_readme().name == "README.zh.md"
    assert lesson.localized_title() == "第 1 课。一个请求的一生"
    assert lesson.hint_tiers()[0].startswith("## 从哪里入手")
    assert lesson.title == "Lesson 1. The life of a request"  # traces and reports keep the English title
    set_language("en")
    assert lesson.localized_readme().name == "README.md"
    assert lesson.localized_title() == "Lesson 1. The life of a request"
    assert lesson.hint_tiers()[0].startswith("## Where to start")


def test_a_lesson_without_its_twin_is_shown_in_english_with_one_line_that_says_so(tmp_path, zh):
    lesson = make_lesson(tmp_path / "01_request_life", chinese=False)
    assert lesson.localized_readme() == lesson.readme and lesson.localized_title() == lesson.title
    console = Console(record=True, width=100)
    say_if_untranslated(lesson.readme, lesson.localized_readme(), console)
    assert console.export_text().strip() == "这一课还没有中文版，下面是英文原文。"
    set_language("en")
    console = Console(record=True, width=100)
    say_if_untranslated(lesson.readme, lesson.localized_readme(), console)
    assert console.export_text() == ""


def test_lesson_list_titles_drop_the_lesson_number():
    assert short_title("Lesson 1. The life of a request") == "The life of a request"
    assert short_title("第 1 课。一个请求的一生") == "一个请求的一生"
    assert short_title("1. 一个请求的一生") == "一个请求的一生"
    assert short_title("2. Three counters: num_tokens") == "Three counters: num_tokens"
    assert short_title("15. nanoengine vs vLLM v1") == "nanoengine vs vLLM v1"
    assert short_title("nanoengine vs vLLM v1: no number") == "nanoengine vs vLLM v1: no number"


def test_lesson_show_1_in_chinese_end_to_end():
    """NANOENGINE_LANG=zh nanoengine lesson show 1: the Chinese text, no "not translated" line."""
    readme = all_lessons()[0].path / "README.zh.md"
    if not readme.is_file():
        pytest.fail(f"{readme.relative_to(ROOT)} is missing")
    env = {**os.environ, "NANOENGINE_LANG": "zh", "COLUMNS": "100"}
    done = subprocess.run(
        [sys.executable, "-m", "tracer.cli.main", "lesson", "show", "1"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    heading = next(line[2:].strip() for line in readme.read_text(encoding="utf-8").splitlines() if line[:2] == "# ")
    assert heading in done.stdout and "还没有中文版" not in done.stdout


def test_lesson_list_in_chinese_names_the_lessons_by_their_twins(tmp_path, capsys, zh):
    assert lesson_main(["list", "--dir", str(tmp_path / "none")]) == 0
    out = capsys.readouterr().out
    assert "nanoengine 课程" in out and "未开始" in out
    for lesson in all_lessons():
        if twin(lesson.readme, "zh").is_file():
            assert short_title(lesson.localized_title())[:6] in out, lesson.name
