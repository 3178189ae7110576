"""`python -m tracer.i18n.extract`: the messages the code marks (_, ngettext, N_) that no .po source
of the language translates yet, printed as .po entries to paste into the area's file
(tracer/i18n/po/<lang>/<area>.po) and translate.

    python -m tracer.i18n.extract              missing zh messages, as .po entries
    python -m tracer.i18n.extract --pot FILE   every message, as a template (.pot)"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from babel.messages.catalog import Catalog
from babel.messages.pofile import write_po

from tracer.i18n import DOMAIN
from tracer.i18n.catalog import FIXED_DATE, Message, extract_messages, merge_sources

ROOT = Path(__file__).resolve().parents[2]


def missing_messages(lang: str, root: Path = ROOT) -> dict[Message, list[str]]:
    """The extracted messages lang's catalog lacks (or leaves untranslated), with where they are used."""
    merged = merge_sources(lang)
    return {key: where for key, where in extract_messages(root).items() if merged.get(key) is None}


def as_catalog(messages: dict[Message, list[str]], lang: str | None) -> Catalog:
    catalog = Catalog(
        locale=lang,
        domain=DOMAIN,
        project="nanoengine",
        creation_date=FIXED_DATE,
        revision_date=FIXED_DATE,
        fuzzy=False,
    )
    for key, where in messages.items():
        locations = [(w.rsplit(":", 1)[0], int(w.rsplit(":", 1)[1])) for w in where]
        catalog.add(key, ("", "") if isinstance(key, tuple) else "", locations=locations)
    return catalog


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tracer.i18n.extract", description=__doc__.splitlines()[0])
    p.add_argument("--lang", default="zh", help="the language whose missing messages to list (default: zh)")
    p.add_argument("--pot", type=Path, help="write every message as a template to this file instead")
    args = p.parse_args(argv)
    if args.pot:
        with args.pot.open("wb") as f:
            write_po(f, as_catalog(extract_messages(ROOT), None), width=120, omit_header=False)
        return 0
    missing = missing_messages(args.lang)
    write_po(sys.stdout.buffer, as_catalog(missing, args.lang), width=120, omit_header=True)
    print(f"# {len(missing)} message(s) without a {args.lang} translation", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
