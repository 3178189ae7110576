"""Wide characters in the replay's SVG pictures (the HTML export's frames, the `s` screenshot).

Rich's SVG export places each run of text at its cell offset, but sizes the run by its characters
(textLength = char width × len(text)), so a run with Chinese characters, two cells each, is squeezed
into half its cells: its glyphs overlap and a gap opens before the next run. fit_wide_text(svg)
sizes every run by its cells instead, so the picture lines up as the terminal does.
"""

from __future__ import annotations

import html
import re

from rich.cells import cell_len

TEXT_RUN = re.compile(r'(<text\b[^>]*?\btextLength=")([\d.]+)("[^>]*>)([^<]*)(</text>)')


def fit_wide_text(svg: str) -> str:
    return TEXT_RUN.sub(fit_run, svg)


def fit_run(match: re.Match) -> str:
    text = html.unescape(match.group(4))
    chars, cells = len(text), cell_len(text)
    if not chars or cells == chars:
        return match.group(0)
    length = round(float(match.group(2)) / chars * cells, 2)
    return f"{match.group(1)}{length:g}{match.group(3)}{match.group(4)}{match.group(5)}"
