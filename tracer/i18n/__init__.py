"""Which language a learner reads: gettext catalogs under tracer/i18n/locale, English the fallback.

`_("text")` translates a message when it is shown (not when a module is imported, so the language
can be chosen after import); `N_("text")` only marks a module-level constant for extraction.
The language comes from --lang, else NANOENGINE_LANG, else the locale (LANG / LC_ALL /
LC_MESSAGES), else English.

argparse's own words (usage:, options, its error lines) come from the same catalog: argparse looks
them up through its module's `_` and `ngettext`, which set_language points at this catalog."""

from __future__ import annotations

import argparse
import gettext
import os
from pathlib import Path

DOMAIN = "nanoengine"
LOCALE_DIR = Path(__file__).parent / "locale"
LANGUAGES = ("en", "zh")

_translation: gettext.NullTranslations = gettext.NullTranslations()
_language = "en"


def language_from_env() -> str:
    """zh or en from NANOENGINE_LANG, else the locale's variables; en when nothing says zh."""
    for var in ("NANOENGINE_LANG", "LC_ALL", "LC_MESSAGES", "LANG"):
        value = os.environ.get(var, "").strip().lower()
        if value:
            return "zh" if value.startswith("zh") else "en"
    return "en"


def set_language(lang: str | None = None) -> str:
    """Use lang ('zh' or 'en'; None: from the environment). Returns the language in use."""
    global _translation, _language
    lang = language_from_env() if lang is None else lang.strip().lower()
    if lang not in LANGUAGES:
        raise ValueError(f"unknown language {lang!r}: use one of {', '.join(LANGUAGES)}")
    _language = lang
    _translation = (
        gettext.translation(DOMAIN, LOCALE_DIR, languages=[lang], fallback=True)
        if lang != "en"
        else gettext.NullTranslations()
    )
    argparse._ = _  # type: ignore[attr-defined]
    argparse.ngettext = ngettext  # type: ignore[attr-defined]
    return lang


def language() -> str:
    return _language


def _(message: str) -> str:
    return _translation.gettext(message)


def ngettext(singular: str, plural: str, n: int) -> str:
    return _translation.ngettext(singular, plural, n)


def N_(message: str) -> str:
    return message


def error_line(message: str) -> str:
    """'nanoengine: error: MESSAGE' in the reader's language: how every command words bad input
    (here, below every package, so the replay and the export can say it too)."""
    return _("nanoengine: error: {message}").format(message=message)


set_language()
