"""`python -m tracer.i18n.compile`: merge each language's .po sources (tracer/i18n/po/<lang>/*.po)
into the catalog gettext reads (tracer/i18n/locale/<lang>/LC_MESSAGES/nanoengine.mo).

`--check` writes nothing: exit 1 when a committed catalog is not what its sources compile to."""

from __future__ import annotations

import argparse
import sys

from tracer.i18n.catalog import CatalogError, compiled_bytes, compiled_path, languages_with_sources


def compile_language(lang: str, check: bool) -> bool:
    """Write (or, with check, compare) lang's catalog; True when it was already up to date."""
    path = compiled_path(lang)
    fresh = compiled_bytes(lang)
    current = path.read_bytes() if path.is_file() else None
    if check or current == fresh:
        return current == fresh
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(fresh)
    return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tracer.i18n.compile", description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="compare only: exit 1 when a catalog is out of date")
    args = p.parse_args(argv)
    stale = []
    try:
        for lang in languages_with_sources():
            if not compile_language(lang, args.check):
                stale.append(lang)
    except CatalogError as e:
        print(f"tracer.i18n.compile: error: {e}", file=sys.stderr)
        return 2
    for lang in stale:
        verb = "is out of date: run python -m tracer.i18n.compile" if args.check else "written"
        print(f"{compiled_path(lang)} {verb}", file=sys.stderr if args.check else sys.stdout)
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
