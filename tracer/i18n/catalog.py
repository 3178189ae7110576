"""The translation sources and the catalog gettext reads, built with Babel.

    po/<lang>/*.po                          the sources: one file per area (cli, teach, replay, export,
                                            serve), each kept by whoever translates that area
    locale/<lang>/LC_MESSAGES/nanoengine.mo the one compiled catalog, committed so that an installed
                                            wheel needs no build step

    merge_sources(lang) -> Catalog          every area's messages in one catalog (a conflict: a CatalogError)
    compiled_bytes(lang) -> bytes           that catalog as a .mo file (the same bytes for the same sources)
    extract_messages(root) -> {msgid: [where]}   every message the code marks with _(), ngettext() or N_(),
                                                 each lesson check's title (its docstring's first line)
                                                 and each lesson scenario's "look_for" text

Babel runs only here, when a catalog is built or tested; the program reads the .mo with the
standard library's gettext."""

from __future__ import annotations

import ast
import inspect
import io
import json
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from babel.messages.catalog import Catalog
from babel.messages.catalog import Message as BabelMessage
from babel.messages.extract import extract_from_file
from babel.messages.mofile import write_mo
from babel.messages.pofile import read_po

from tracer.i18n import DOMAIN, LOCALE_DIR

PO_DIR = Path(__file__).parent / "po"
# _("text"), ngettext("one", "many", n), N_("text"): the functions of tracer.i18n
KEYWORDS = {"_": None, "ngettext": (1, 2), "N_": None}
# The header's dates are fixed so that the same sources always compile to the same bytes.
FIXED_DATE = datetime(2026, 1, 1, tzinfo=timezone.utc)
Message = str | tuple[str, str]  # a msgid, or (singular, plural)


class CatalogError(ValueError):
    """The sources cannot be merged: one message translated two ways."""


class MergedCatalog(Catalog):
    """A catalog whose header names no Babel version, so that the .mo is the same bytes whichever
    Babel compiled it (the committed catalog is compared with a fresh compile)."""

    def __iter__(self) -> Iterator[BabelMessage]:
        header, *messages = super().__iter__()
        text = header.string if isinstance(header.string, str) else ""
        lines = [line for line in text.splitlines() if not line.startswith("Generated-By:")]
        yield BabelMessage("", "\n".join(lines), flags=header.flags)
        yield from messages


def source_files(lang: str) -> list[Path]:
    return sorted((PO_DIR / lang).glob("*.po"))


def read_source(path: Path, lang: str) -> Catalog:
    with path.open("rb") as f:
        return read_po(f, locale=lang, domain=DOMAIN)


def merge_sources(lang: str) -> Catalog:
    """Every source of lang in one catalog: fuzzy and untranslated entries left out (English is shown
    for those), a message translated differently in two files a CatalogError naming both."""
    merged = MergedCatalog(
        locale=lang,
        domain=DOMAIN,
        project="nanoengine",
        creation_date=FIXED_DATE,
        revision_date=FIXED_DATE,
        fuzzy=False,
        version="0",
        msgid_bugs_address="the nanoengine issue tracker",
        last_translator="nanoengine translators (tracer/i18n/po)",
        language_team="nanoengine",
    )
    origin: dict[Message, str] = {}
    for path in source_files(lang):
        for message in read_source(path, lang):
            if not message.id or message.fuzzy or message.string is None or not is_translated(message.string):
                continue
            key: Message = message.id if isinstance(message.id, str) else (message.id[0], message.id[1])
            earlier = merged.get(key)
            if earlier is not None and earlier.string != message.string:
                raise CatalogError(
                    f"{key!r} is translated differently in {origin[key]} and {path.name}: "
                    f"keep one translation (or give one of them a different English text)"
                )
            merged.add(key, message.string, flags=())
            origin.setdefault(key, path.name)
    return merged


def is_translated(string: str | tuple[str, ...] | list[str]) -> bool:
    strings = [string] if isinstance(string, str) else list(string)
    return bool(strings) and all(s.strip() for s in strings)


def compiled_bytes(lang: str) -> bytes:
    buffer = io.BytesIO()
    write_mo(buffer, merge_sources(lang))
    return buffer.getvalue()


def compiled_path(lang: str) -> Path:
    return LOCALE_DIR / lang / "LC_MESSAGES" / f"{DOMAIN}.mo"


def languages_with_sources() -> list[str]:
    return sorted(d.name for d in PO_DIR.iterdir() if d.is_dir()) if PO_DIR.is_dir() else []


def code_files(root: Path) -> list[Path]:
    """The files whose messages are translated: the tracer's code and the lessons' checks."""
    return sorted((root / "tracer").rglob("*.py")) + sorted((root / "lessons").glob("*/check.py"))


def extract_messages(root: Path) -> dict[Message, list[str]]:
    """Each message marked in the code, with the places ('tracer/cli/main.py:42') that use it."""
    found: dict[Message, list[str]] = {}
    for path in code_files(root):
        for lineno, message, _comments, _context in extract_from_file("python", path, keywords=KEYWORDS):
            key: Message = message if isinstance(message, str) else (message[0], message[1])
            found.setdefault(key, []).append(f"{path.relative_to(root)}:{lineno}")
        if path.name == "check.py":
            for lineno, title in check_titles(path):
                found.setdefault(title, []).append(f"{path.relative_to(root)}:{lineno}")
    for path in sorted((root / "lessons").glob("*/scenario.json")):
        text = json.loads(path.read_text(encoding="utf-8")).get("look_for")
        if isinstance(text, str) and text:
            found.setdefault(text, []).append(f"{path.relative_to(root)}:1")
    return found


def check_titles(path: Path) -> list[tuple[int, str]]:
    """(line, title) of each check in a lesson's check.py: the first docstring line of every
    check_* and engine_* function, which `lesson check` shows (translated) as the check's name."""
    titles = []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith(("check_", "engine_")):
            doc = ast.get_docstring(node)
            if doc:
                titles.append((node.lineno, inspect.cleandoc(doc).splitlines()[0]))
    return titles
