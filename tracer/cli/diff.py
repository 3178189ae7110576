"""`nanoengine diff A.jsonl B.jsonl`: where two traces of the same workload first differ, and why.

One row per request and step: a preemption that also changes the tokens scheduled is one row
("tokens, preempted"), not two. `--summary` prints one line per kind of difference instead.
Exit 0 when every step takes the same decisions (block ids that differ only by a renaming, as
two free-list orders hand out other blocks, are said but no difference), 1 when they differ, 2 on
a file it cannot read or two traces of different workloads.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from tracer.cli.defaults import add_lang_arg
from tracer.cli.help_format import ArgumentParser
from tracer.i18n import N_, _
from tracer.trace.diff import KINDS, Difference, DiffError, TraceDiff, diff_traces, first_difference_line, summary
from tracer.trace.readable import printable

IDS_ONLY = N_(
    "Only block ids differ, and only by a renaming: every request holds as many blocks, shared the same way, so "
    "the decisions are the same. Which free block is handed out next is the free-list order: nanoengine takes the "
    "least recently freed, vLLM 0.33 a freed block without a hash first (lessons/README.md, 'One order for the "
    "free list')."
)


@dataclass(slots=True)
class Row:
    """The differences of one request at one step that share their whys, as one table row."""

    step: int
    kinds: list[str]
    request: int | None
    a: str
    b: str
    ids_only: bool


def diff_main(argv: list[str]) -> int:
    p = ArgumentParser(
        prog="nanoengine diff",
        description=_(
            "Per step, where two traces of the same workload differ (tokens scheduled per request, admissions, "
            "victims, prefix hits, finishes, blocks), with each side's why."
        ),
    )
    p.add_argument("a", help=_("a trace (e.g. nanoengine's run)"))
    p.add_argument("b", help=_("a trace of the same workload (e.g. tracer/vllm/traces/NAME.jsonl)"))
    p.add_argument("--first", action="store_true", help=_("only the first step that differs"))
    p.add_argument("--summary", action="store_true", help=_("one line per kind of difference, with its first step"))
    p.add_argument(
        "--only",
        default=None,
        help=_("only these kinds, comma-separated: {kinds} (default: all)").format(kinds=", ".join(KINDS)),
    )
    add_lang_arg(p)
    args = p.parse_args(argv)
    from tracer.cli.trace import err, load_or_report

    kinds = parse_kinds(args.only)
    a, b = load_or_report(args.a), load_or_report(args.b)
    if a is None or b is None:
        return 2
    try:
        diff = diff_traces(a, b)
    except DiffError as e:
        err(str(e))
        return 2
    diff.differences = [d for d in diff.differences if d.kind in kinds]
    console = Console(highlight=False)
    print_diff(console, diff, printable(args.a), printable(args.b), first_only=args.first, brief=args.summary)
    return 1 if diff.decisions_differ() else 0


def parse_kinds(text: str | None) -> tuple[str, ...]:
    if not text:
        return KINDS
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(
            _("--only takes {kinds}; got {unknown}").format(kinds=", ".join(KINDS), unknown=", ".join(unknown))
        )
    return kinds


def merged_rows(differences: list[Difference]) -> list[Row]:
    """One row per (step, request, whys): the kinds one decision shows up as are listed together."""
    rows: dict[tuple, Row] = {}
    for d in differences:
        key = (d.step, d.request, d.a, d.b)
        if key in rows:
            rows[key].kinds.append(d.kind)
        else:
            rows[key] = Row(d.step, [d.kind], d.request, d.a, d.b, d.ids_only)
    return list(rows.values())


def print_diff(
    console: Console, diff: TraceDiff, path_a: str, path_b: str, first_only: bool = False, brief: bool = False
) -> None:
    side = _("{side} = {label}: {path} ({n} steps)")
    console.print(side.format(side="A", label=escape(diff.label_a), path=escape(path_a), n=diff.num_steps[0]))
    console.print(side.format(side="B", label=escape(diff.label_b), path=escape(path_b), n=diff.num_steps[1]))
    for note in diff.notes:
        console.print(Text(note))
    if not diff.differences:
        console.print(
            _("[green]no difference[/] in any step's decisions (the same number of steps)")
            if diff.num_steps[0] == diff.num_steps[1]
            else _("[green]no difference[/] in any step's decisions (different step counts)")
        )
        return
    if not diff.decisions_differ():
        console.print(Text(_(IDS_ONLY), style="green"))
    console.print(Text(_("First difference: {line}").format(line=first_difference_line(diff))))
    if brief:
        for line in summary(diff):
            console.print(Text("  " + line))
        return
    steps = diff.steps()[:1] if first_only else diff.steps()
    title = _("{n} of {total} steps differ").format(n=len(diff.steps()), total=max(diff.num_steps))
    table = Table(title=title, title_justify="left")
    for col in (_("step"), _("what"), _("request"), _("A: did, and why"), _("B: did, and why")):
        table.add_column(col, overflow="fold")
    for row in merged_rows([d for d in diff.differences if d.step in steps]):
        who = "" if row.request is None else str(row.request)
        what = ", ".join(row.kinds) + (_(" (ids only)") if row.ids_only else "")
        table.add_row(str(row.step), what, who, Text(row.a), Text(row.b))
    console.print(table)
