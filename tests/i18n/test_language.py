"""The language choice: --lang on every command, NANOENGINE_LANG, the locale; English the fallback."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.conftest import one_line_error
from tracer.cli.main import main, split_lang
from tracer.i18n import _, language, language_from_env, ngettext, set_language


@pytest.fixture
def english_after() -> Iterator[None]:
    """main() sets the language for the whole process: put English back after the test."""
    try:
        yield
    finally:
        set_language("en")


def environment(**values: str) -> dict[str, str]:
    """os.environ without any language variable, plus values."""
    names = ("NANOENGINE_LANG", "LC_ALL", "LC_MESSAGES", "LANG", "LANGUAGE")
    return {**{k: v for k, v in os.environ.items() if k not in names}, **values}


@pytest.mark.parametrize(
    "values, expected",
    [
        ({}, "en"),
        ({"LANG": "zh_CN.UTF-8"}, "zh"),
        ({"LANG": "zh_TW.UTF-8"}, "zh"),
        ({"LANG": "de_DE.UTF-8"}, "en"),
        ({"LANG": "zh_CN.UTF-8", "LC_ALL": "C"}, "en"),  # LC_ALL wins over LANG, as for any program
        ({"LANG": "zh_CN.UTF-8", "NANOENGINE_LANG": "en"}, "en"),
        ({"LANG": "C.UTF-8", "NANOENGINE_LANG": "zh"}, "zh"),
    ],
)
def test_the_language_comes_from_nanoengine_lang_then_the_locale(monkeypatch, values, expected):
    for name in ("NANOENGINE_LANG", "LC_ALL", "LC_MESSAGES", "LANG"):
        monkeypatch.delenv(name, raising=False)
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    assert language_from_env() == expected


def test_the_suite_reads_english():
    assert language() == "en" and _("interrupted") == "interrupted"


def test_chinese_translates_and_an_unknown_message_stays_english(zh):
    assert _("interrupted") == "已中断"
    assert _("a message nobody translated") == "a message nobody translated"


def test_plural_forms(zh):
    one, many = "expected %s argument", "expected %s arguments"
    assert ngettext(one, many, 1) % 1 == "需要 1 个参数"
    assert ngettext(one, many, 3) % 3 == "需要 3 个参数"
    set_language("en")
    assert ngettext(one, many, 1) % 1 == "expected 1 argument"
    assert ngettext(one, many, 3) % 3 == "expected 3 arguments"


def test_an_unknown_language_is_one_line_and_exit_2(capsys, english_after):
    assert main(["--lang", "xx", "lesson", "list"]) == 2
    err = one_line_error(capsys.readouterr().err)
    assert "'xx'" in err and "zh" in err and "en" in err
    assert main(["lesson", "list", "--lang"]) == 2
    assert "--lang zh" in one_line_error(capsys.readouterr().err)


def test_lang_is_taken_wherever_it_stands_before_a_double_dash():
    assert split_lang(["--lang", "zh", "lesson", "show", "1"]) == ("zh", ["lesson", "show", "1"])
    assert split_lang(["lesson", "show", "1", "--lang=en"]) == ("en", ["lesson", "show", "1"])
    assert split_lang(["generate", "--", "--lang", "zh"]) == (None, ["generate", "--", "--lang", "zh"])


def test_the_help_screen_in_chinese(capsys, english_after):
    assert main(["--lang", "zh", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("用法：nanoengine") and "课程与练习" in out and "--lang zh|en" in out
    with pytest.raises(SystemExit):
        main(["lesson", "--help", "--lang", "zh"])
    out = capsys.readouterr().out
    assert "用法：nanoengine lesson" in out and "显示此帮助信息并退出" in out and "--lang" in out


def test_argparse_errors_read_chinese_too(capsys, english_after):
    with pytest.raises(SystemExit) as exit:
        main(["lesson", "check", "1", "--bogus", "--lang", "zh"])
    assert exit.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == "nanoengine lesson: 错误：无法识别的参数：--bogus"


def test_a_common_mistake_in_chinese_is_one_whole_chinese_line(capsys, english_after):
    assert main(["demo", "no-such-demo", "--lang", "zh"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("nanoengine: 错误：没有名为 'no-such-demo' 的演示") and "\n" not in err, err


def test_every_learner_command_takes_lang(capsys, english_after):
    """--lang is listed in the help of each command a learner reads."""
    for command in (["trace"], ["run"], ["replay"], ["check"], ["demo"], ["lesson"], ["lesson", "show"], ["generate"]):
        with pytest.raises(SystemExit):
            main([*command, "--help"])
        assert "--lang" in capsys.readouterr().out, command


def test_nanoengine_lang_zh_in_a_child_process():
    """The installed command, as a learner runs it: NANOENGINE_LANG=zh, nothing else."""
    done = subprocess.run(
        [sys.executable, "-m", "tracer.cli.main", "--help"],
        env=environment(NANOENGINE_LANG="zh"),
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.startswith("用法：nanoengine")
    done = subprocess.run(
        [sys.executable, "-m", "tracer.cli.main", "--help"],
        env=environment(LANG="zh_CN.UTF-8", LC_ALL="zh_CN.UTF-8"),
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.startswith("用法：nanoengine")


def test_chinese_help_lines_fit_the_terminal(capsys, monkeypatch, english_after):
    """Chinese characters are two cells wide: the help wraps by cells, never inside a word."""
    from rich.cells import cell_len

    monkeypatch.setenv("COLUMNS", "80")
    for command in (["trace"], ["lesson", "check"], ["demo"], ["export"], ["serve"]):
        with pytest.raises(SystemExit):
            main([*command, "--help", "--lang", "zh"])
        out = capsys.readouterr().out
        wide = [line for line in out.splitlines() if cell_len(line) > 80]
        assert not wide, (command, wide)
    assert "--lang" in out and "选项" in out


def test_wrapping_by_cells_breaks_between_characters_not_inside_words():
    from rich.cells import cell_len

    from tracer.cli.help_format import wrap_cells

    text = "每个请求最多生成的新 token 数，num_cached_tokens 是已计算的 token 数（默认：64）"
    lines = wrap_cells(text, 20)
    assert all(cell_len(line) <= 20 for line in lines), lines
    assert "".join(lines).replace(" ", "") == text.replace(" ", "")  # nothing lost
    assert any("num_cached_tokens" in line for line in lines)  # an identifier stays whole
    assert not any(line.startswith(("，", "）", "：")) for line in lines)
    assert wrap_cells("plain English words here", 11) == ["plain", "English", "words here"]


def test_a_commands_own_parser_takes_lang_too(capsys, english_after):
    """`python -m tracer.cli.lesson show 99 --lang zh`: the command's parser sets the language."""
    from tracer.cli.lesson import lesson_main

    assert lesson_main(["show", "99", "--lang", "zh"]) == 2
    assert "没有课 '99'" in capsys.readouterr().out
