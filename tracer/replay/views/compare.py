"""`nanoengine replay A --compare B`: the same step of a second run of the workload (e.g. vLLM v1's
scheduler beside nanoengine), one line per request, differences marked with `≠` (a symbol, not
only colour), and the diff's why for each difference at this step.

    compare  A = run24.jsonl │ B = run48.jsonl · num_kv_blocks 24 vs 48   step 0: 2 differences
      req 1  A: 16 tok from 0, RUNNING  B: 4 tok from 12, RUNNING ≠ tokens, prefix_hit

Each side is named by its file, then what tells them apart (side_labels.py).
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text
from textual.widgets import Static

from tracer.i18n import _, ngettext
from tracer.replay.colors import DIM
from tracer.replay.views.side_labels import side_labels
from tracer.trace.diff import Side, TraceDiff

LABEL = "bold #c8d0da"
DIFFERS = "bold #ffd23f"
MAX_WHY = 3  # why-lines shown per step; `nanoengine diff` lists them all


def row_text(side: Side, i: int) -> str:
    if side.step is None:
        return _("run ended")
    row = side.rows().get(i)
    if row is None:
        return _("not added")
    status = row.get("vllm_status_after") or row["status_after"]
    return _("{tokens} tok from {cached}, {status}").format(
        tokens=row["num_scheduled_tokens"], cached=row["num_cached_tokens"], status=status
    )


def padded(text: str, width: int) -> str:
    """text and spaces to width cells (a Chinese character takes two)."""
    return text + " " * max(0, width - cell_len(text))


def compare_text(diff: TraceDiff, a: Side, b: Side, index: int, step_number: int) -> Text:
    here = diff.at(index)
    label_a, label_b, differences = side_labels(a.trace, b.trace)
    text = Text()
    text.append(_("compare") + "  ", LABEL)
    text.append(f"A = {label_a} │ B = {label_b} · {differences}", DIM)
    text.append("   " + _("step {step}:").format(step=step_number) + " ", LABEL)
    count = ngettext("≠ {count} difference", "≠ {count} differences", len(here)).format(count=len(here))
    text.append(count if here else _("= same decisions"), DIFFERS if here else DIM)
    kinds: dict[int | None, list[str]] = {}
    for d in here:
        kinds.setdefault(d.request, []).append(d.kind)
    for i in sorted(set(a.rows()) | set(b.rows())):
        marked = i in kinds
        text.append("\n  " + padded(_("req {request}").format(request=i), 7), DIFFERS if marked else LABEL)
        text.append(f"A: {padded(row_text(a, i), 30)} B: {padded(row_text(b, i), 30)}")
        if marked:
            text.append(" ≠ " + ", ".join(kinds[i]), DIFFERS)
    first = {d.request: d for d in reversed(here)}  # each request's first difference: its why
    for n, (request, d) in enumerate(sorted(first.items(), key=lambda kv: kv[0] or 0)):
        if n == MAX_WHY:
            more = _("… {count} more requests differ (nanoengine diff A B)").format(count=len(first) - MAX_WHY)
            text.append("\n  " + more, DIM)
            break
        what = _("≠ request {request} ({kinds}):").format(request=request, kinds=", ".join(kinds[request]))
        text.append("\n  " + what + " ", DIFFERS)
        text.append(f"A {d.a} │ B {d.b}", DIM)
    return text


class CompareView(Static):
    shown = ""  # the plain text last drawn

    def show_pair(self, diff: TraceDiff, a: Side, b: Side, index: int, step_number: int) -> None:
        text = compare_text(diff, a, b, index, step_number)
        self.shown = text.plain
        self.update(text)
