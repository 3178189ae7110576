"""`nanoengine diff A.jsonl B.jsonl`: where two traces of the same workload first differ, and why.

Exit 0 when every step takes the same decisions, 1 when they differ, 2 on a file it cannot read
or two traces of different workloads.
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from tracer.trace.diff import KINDS, DiffError, TraceDiff, diff_traces, first_difference_line
from tracer.trace.readable import printable


def diff_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="nanoengine diff",
        description="Per step, where two traces of the same workload differ (tokens scheduled per "
        "request, admissions, victims, prefix hits, finishes, blocks), with each side's why.",
    )
    p.add_argument("a", help="a trace (e.g. nanoengine's run)")
    p.add_argument("b", help="a trace of the same workload (e.g. tracer/vllm/traces/NAME.jsonl)")
    p.add_argument("--first", action="store_true", help="only the first step that differs")
    p.add_argument("--only", default=None, help=f"only these kinds, comma-separated: {', '.join(KINDS)} (default: all)")
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
    print_diff(console, diff, printable(args.a), printable(args.b), first_only=args.first)
    return 1 if diff.differences or diff.num_steps[0] != diff.num_steps[1] else 0


def parse_kinds(text: str | None) -> tuple[str, ...]:
    if not text:
        return KINDS
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"--only takes {', '.join(KINDS)}; got {', '.join(unknown)}")
    return kinds


def print_diff(console: Console, diff: TraceDiff, path_a: str, path_b: str, first_only: bool = False) -> None:
    console.print(f"A = {escape(diff.label_a)}: {escape(path_a)} ({diff.num_steps[0]} steps)")
    console.print(f"B = {escape(diff.label_b)}: {escape(path_b)} ({diff.num_steps[1]} steps)")
    if not diff.differences:
        same = "the same number of steps" if diff.num_steps[0] == diff.num_steps[1] else "different step counts"
        console.print(f"[green]no difference[/] in any step's decisions ({same})")
        return
    console.print(Text("First difference: " + first_difference_line(diff)))
    steps = diff.steps()[:1] if first_only else diff.steps()
    table = Table(title=f"{len(diff.steps())} of {max(diff.num_steps)} steps differ", title_justify="left")
    for col in ("step", "what", "request", "A: did, and why", "B: did, and why"):
        table.add_column(col, overflow="fold")
    for d in diff.differences:
        if d.step in steps:
            who = "" if d.request is None else str(d.request)
            table.add_row(str(d.step), d.kind, who, Text(d.a), Text(d.b))
    console.print(table)
