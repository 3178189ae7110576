"""The translation catalogs (tracer/i18n): every message the code marks is translated, the committed
.mo is what the .po sources compile to, and each translation keeps its message's placeholders."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tracer.i18n.catalog import (
    KEYWORDS,
    code_files,
    compiled_bytes,
    compiled_path,
    extract_messages,
    languages_with_sources,
    merge_sources,
    source_files,
)

ROOT = Path(__file__).resolve().parents[2]
# {name}, {n:.2f}, {key!r}: str.format's fields ({{ and }} are literal braces, not fields)
BRACE_FIELD = re.compile(r"(?<!\{)\{([^{}]*)\}(?!\})|\{\{\{([^{}]*)\}\}\}")
PERCENT_FIELD = re.compile(r"%\([a-z_]+\)[a-z]|%[sdr]")


def fields(text: str) -> list[str]:
    return sorted([m.group(0) for m in BRACE_FIELD.finditer(text)] + PERCENT_FIELD.findall(text))


def brace_names(text: str) -> set[str]:
    """{n:.2f} -> n, {key!r} -> key."""
    return {re.split(r"[!:]", (m.group(1) or m.group(2) or ""))[0] for m in BRACE_FIELD.finditer(text)}


def format_keywords() -> dict[str, set[str]]:
    """msgid -> the keywords the code passes when it formats it: _("...").format(name=...)."""
    passed: dict[str, set[str]] = {}
    for path in code_files(ROOT):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format"):
                continue
            inner = node.func.value
            if isinstance(inner, ast.Call) and getattr(inner.func, "id", None) in KEYWORDS:
                for arg in inner.args:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        passed.setdefault(arg.value, set()).update(k.arg for k in node.keywords if k.arg)
    return passed


def test_zh_has_sources():
    assert "zh" in languages_with_sources()
    names = {p.name for p in source_files("zh")}
    assert {"cli.po", "teach.po"} <= names, names


def test_every_marked_message_is_translated_in_zh():
    merged = merge_sources("zh")
    extracted = extract_messages(ROOT)
    missing = {key: where for key, where in extracted.items() if merged.get(key) is None}
    translated = len(extracted) - len(missing)
    print(f"zh catalog coverage: {translated}/{len(extracted)} messages translated")
    listing = "\n".join(f"  {key!r}  ({', '.join(where[:2])})" for key, where in missing.items())
    assert not missing, (
        f"{len(missing)} of {len(extracted)} messages have no zh translation (python -m tracer.i18n.extract prints "
        f"them as .po entries to add to tracer/i18n/po/zh/<area>.po):\n{listing}"
    )


def test_the_committed_catalog_is_a_fresh_compile_of_the_sources():
    for lang in languages_with_sources():
        path = compiled_path(lang)
        assert path.is_file(), f"{path} is missing: run python -m tracer.i18n.compile"
        assert path.read_bytes() == compiled_bytes(lang), (
            f"{path.relative_to(ROOT)} is not what tracer/i18n/po/{lang}/*.po compile to: "
            f"run python -m tracer.i18n.compile and commit the .mo"
        )


def test_each_translation_keeps_its_placeholders():
    """A translation uses the English's %-fields exactly, and only {fields} the code fills in: the
    English's, or another keyword its .format() passes (第 {number} 个 where English says {ordinal})."""
    passed = format_keywords()
    wrong = []
    for lang in languages_with_sources():
        for message in merge_sources(lang):
            if not message.id:
                continue
            ids = message.id if isinstance(message.id, tuple) else (message.id,)
            strings = message.string if isinstance(message.string, tuple) else (message.string,)
            allowed = set().union(*(brace_names(i) for i in ids)) | passed.get(ids[0], set())
            for string in strings:
                unknown = brace_names(string) - allowed
                if unknown or PERCENT_FIELD.findall(string) != PERCENT_FIELD.findall(ids[-1]):
                    wrong.append(f"{lang}: {ids[-1]!r} -> {string!r}")
    assert not wrong, (
        "translations with a {field} the code does not fill in, or other %(fields)s than the English:\n"
        + "\n".join(wrong)
    )


def test_the_placeholder_pattern_reads_fields_and_not_literal_braces():
    assert fields("{n} of {total:.1f} for {key!r}") == ["{key!r}", "{n}", "{total:.1f}"]
    assert fields("usage: {{{commands}}} %(prog)s %s") == ["%(prog)s", "%s", "{{{commands}}}"]
    assert fields("a literal {{brace}}") == []


def calls_inside_fstrings(path: Path) -> list[str]:
    """_("...") inside an f-string: extraction cannot see it, so its message would never be checked
    (_(CONSTANT) there is fine: the constant is marked with N_ where it is defined)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.JoinedStr):
            for inner in ast.walk(node):
                if (
                    isinstance(inner, ast.Call)
                    and getattr(inner.func, "id", None) in KEYWORDS
                    and any(isinstance(a, ast.Constant) for a in inner.args)
                ):
                    found.append(f"{path.relative_to(ROOT)}:{inner.lineno}")
    return found


def test_no_translated_call_hides_inside_an_fstring():
    hidden = [where for path in code_files(ROOT) for where in calls_inside_fstrings(path)]
    assert not hidden, (
        "_() / ngettext() inside an f-string, where extraction does not look: build the text outside, e.g. "
        "_('...{x}...').format(x=...):\n" + "\n".join(hidden)
    )


def test_a_message_translated_two_ways_is_refused(tmp_path, monkeypatch):
    from tracer.i18n import catalog

    (tmp_path / "zh").mkdir()
    for name, text in (("a.po", "甲"), ("b.po", "乙")):
        (tmp_path / "zh" / name).write_text(f'msgid "same"\nmsgstr "{text}"\n', encoding="utf-8")
    monkeypatch.setattr(catalog, "PO_DIR", tmp_path)
    with pytest.raises(catalog.CatalogError, match="'same' is translated differently in a.po and b.po"):
        catalog.merge_sources("zh")


def test_untranslated_and_fuzzy_entries_stay_english(tmp_path, monkeypatch):
    import gettext
    import io

    from tracer.i18n import catalog

    (tmp_path / "zh").mkdir()
    (tmp_path / "zh" / "a.po").write_text(
        'msgid "done"\nmsgstr "完成"\n\nmsgid "empty"\nmsgstr ""\n\n#, fuzzy\nmsgid "unsure"\nmsgstr "不确定"\n',
        encoding="utf-8",
    )
    monkeypatch.setattr(catalog, "PO_DIR", tmp_path)
    translations = gettext.GNUTranslations(io.BytesIO(catalog.compiled_bytes("zh")))
    assert [translations.gettext(m) for m in ("done", "empty", "unsure")] == ["完成", "empty", "unsure"]
