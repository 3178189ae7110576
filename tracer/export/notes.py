"""Speaker notes for the HTML export (`nanoengine export FILE --html OUT.html --notes NOTES.md`):
what the teacher wants to say at a step, shown in a separate notes window (`s` in the page), never
on the projected frame.

    parse_notes(text) -> {step number: notes}

The file is Markdown-like text: a line `## step N` starts step N's notes, which run to the next such
line; anything before the first heading is ignored (a title, say).

    ## step 0
    Four prompts arrive at once. Ask: which one is admitted first?
    ## step 8
    B is preempted: count the free blocks first.
"""

from __future__ import annotations

import re

from tracer.i18n import _

HEADING = re.compile(r"^#{1,6}\s*step\s+(\d+)\s*:?\s*$", re.IGNORECASE)


def parse_notes(text: str) -> dict[int, str]:
    notes: dict[int, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        match = HEADING.match(line.strip())
        if match:
            step = int(match.group(1))
            if step in notes:
                raise ValueError(
                    _("--notes: step {step} has two '## step {step}' headings; merge them").format(step=step)
                )
            current = notes[step] = []
        elif current is not None:
            current.append(line)
    if not notes:
        raise ValueError(_("--notes: no '## step N' heading found; start each step's notes with one"))
    return {step: "\n".join(lines).strip() for step, lines in notes.items()}
