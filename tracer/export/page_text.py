"""Every word the HTML export's page shows around the frames (buttons, their tooltips, the counter,
the notes window), in the reader's language: a JSON table the page reads (player.html holds no
words of its own, so one page template serves every language).

    page_strings() -> {key: text}      translated now; '{step}'-style fields are filled in by the page
    page_language() -> 'en' | 'zh-CN'  the page's lang attribute (the browser picks CJK fonts by it)
"""

from __future__ import annotations

import json

from tracer.i18n import N_, _, language

# key -> English text; in player.html an element with data-t="key" gets the text, data-t-title="key"
# its tooltip; the script fills {step}, {index}, {count} and {speed} itself.
PAGE_TEXT = {
    "frame_label": N_("the replay screen at the current step"),
    "loading": N_("Loading frames…"),
    "look_for": N_("Look for:"),
    "hide_look_for": N_("(x hides this)"),
    "first": N_("first step (Home)"),
    "prev": N_("previous step (←)"),
    "play_title": N_("play / pause (space)"),
    "play": N_("▶ play"),
    "pause": N_("❚❚ pause"),
    "next": N_("next step (→)"),
    "last": N_("last step (End)"),
    "prev_event_title": N_("previous event: admit, prefix hit, prefill done, preempt, finish, violation (p)"),
    "next_event_title": N_("next event: admit, prefix hit, prefill done, preempt, finish, violation (n)"),
    "event": N_("event"),
    "focus_title": N_("the step that matters (f)"),
    "focus": N_("focus"),
    "notes_title": N_("speaker notes in a window of their own (s)"),
    "notes": N_("notes"),
    "slider": N_("step"),
    "speed_title": N_("+ / - change the speed"),
    "speed": N_("{speed} steps/s"),
    "counter_empty": N_("Step –"),
    "counter": N_("Step {step} · {index} of {count}"),
    "notes_window": N_("Speaker notes"),
    "no_notes": N_("(no notes for this step)"),
    "no_decompression": N_(
        "This browser cannot unpack the frames (no DecompressionStream): "
        "open the file in a current Chrome, Edge, Firefox or Safari."
    ),
}


def page_strings() -> dict[str, str]:
    return {key: _(text) for key, text in PAGE_TEXT.items()}


def page_language() -> str:
    return "zh-CN" if language() == "zh" else "en"


def strings_json() -> str:
    """The table as JSON that is safe inside a <script> element (no '</script>' can close it)."""
    return json.dumps(page_strings(), ensure_ascii=False, allow_nan=False).replace("<", "\\u003c")
