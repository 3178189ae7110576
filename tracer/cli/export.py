"""`nanoengine export`: a trace out of the terminal (dispatched from tracer.cli.main).

    nanoengine export FILE --perfetto OUT.json [--logical] [--steps A-B]
    nanoengine export FILE --html OUT.html [--steps A-B] [--size 140x33] [--no-code] [--notes NOTES.md]
                                           [--compare B]     A vs B: a second run of the same workload

Exit codes: 0 written; 2 bad input (one-line error); 130 interrupted.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from tracer.cli.defaults import add_lang_arg
from tracer.cli.help_format import ArgumentParser
from tracer.cli.trace import err, load_or_report
from tracer.i18n import _
from tracer.trace.diff import DiffError, check_same_workload
from tracer.trace.trace_file import Trace

STEP_RANGE = re.compile(r"^\s*(\d*)\s*(?:-\s*(\d*))?\s*$")


def export_main(argv: list[str]) -> int:
    p = ArgumentParser(
        prog="nanoengine export",
        description=_(
            "Export a trace: a Perfetto / chrome://tracing timeline, or one HTML file that replays it in a browser "
            "(no server, no network)."
        ),
    )
    p.add_argument("file", help=_("a trace (*.jsonl) from `nanoengine trace` or `nanoengine demo`"))
    p.add_argument("--perfetto", metavar="OUT.json", help=_("write Chrome Trace Event JSON (open in Perfetto UI)"))
    p.add_argument("--html", metavar="OUT.html", help=_("write a self-contained HTML replay"))
    p.add_argument("--steps", metavar="A-B", help=_("only steps A to B (step numbers, inclusive; 'A-' or '-B' too)"))
    p.add_argument("--logical", action="store_true", help=_("Perfetto timestamps: one step = 1 ms, not the wall time"))
    p.add_argument(
        "--size",
        default="140x33",
        metavar="WIDTHxHEIGHT",
        help=_(
            "HTML: the replay's terminal size in the frames (default: 14 px text at 1280x720; 120x26: larger "
            "text, 160x48: more rows)"
        ),
    )
    p.add_argument("--no-code", action="store_true", help=_("HTML: leave the code panel out of the frames"))
    p.add_argument(
        "--notes", metavar="NOTES.md", help=_("HTML: speaker notes, '## step N' then the text ('s' in the page)")
    )
    p.add_argument("--compare", metavar="B", help=_("HTML: a second run of the same workload, compared step by step"))
    add_lang_arg(p)
    args = p.parse_args(argv)
    if not args.perfetto and not args.html:
        err(_("say what to write: --perfetto OUT.json and/or --html OUT.html"))
        return 2
    from tracer.replay.app import parse_terminal_size

    try:
        size = parse_terminal_size(args.size)
    except ValueError as e:
        err(str(e))
        return 2
    for out in (args.perfetto, args.html):
        if out and Path(out).is_dir():
            example = Path(out) / ("run.json" if out == args.perfetto else "run.html")
            err(_("{path} is a folder: give a file name, e.g. {example}").format(path=out, example=example))
            return 2
    trace = load_or_report(args.file)
    compare = load_or_report(args.compare) if args.compare else None
    if trace is None or (args.compare and compare is None):
        return 2
    try:
        indices = select_steps(trace, args.steps)
        notes = read_notes(trace, args.notes)
        if compare is not None:
            check_same_workload(trace, compare)
    except DiffError as e:
        err(f"--compare: {e}")
        return 2
    except ValueError as e:
        err(str(e))
        return 2
    console = Console(stderr=True)
    if args.perfetto:
        write_perfetto_file(trace, indices, Path(args.perfetto), args.logical, console)
    if args.html:
        write_html_file(trace, indices, Path(args.html), HtmlOptions(size, not args.no_code, notes, compare), console)
    return 0


@dataclass(slots=True)
class HtmlOptions:
    size: tuple[int, int]
    code: bool = True
    notes: dict[int, str] | None = None
    compare: Trace | None = None


def read_notes(trace: Trace, path: str | None) -> dict[int, str] | None:
    """--notes: the speaker notes by step number; ValueError (one line) for a bad file."""
    if path is None:
        return None
    from tracer.export.html import check_notes
    from tracer.export.notes import parse_notes

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(
            _("--notes {path}: cannot read it ({error})").format(path=path, error=f"{type(e).__name__}: {e}")
        ) from None
    notes = parse_notes(text)
    check_notes(trace, notes)
    return notes


def select_steps(trace: Trace, spec: str | None) -> list[int]:
    """Indices of the steps whose numbers lie in spec ('A-B', 'A-', '-B', 'N'; None: all)."""
    numbers = [marks.step for marks in trace.marks]
    if not numbers:
        raise ValueError(_("{path} has a header but no steps: nothing to export").format(path=trace.path))
    if spec is None:
        return list(range(len(numbers)))
    match = STEP_RANGE.match(spec)
    if not match or not (match.group(1) or match.group(2)):
        raise ValueError(
            _("--steps {spec!r}: give step numbers as A-B, e.g. --steps 3-20 (or 3-, -20, 7)").format(spec=spec)
        )
    first = int(match.group(1)) if match.group(1) else numbers[0]
    last = int(match.group(2)) if match.group(2) else (numbers[-1] if "-" in spec else first)
    if first > last:
        raise ValueError(
            _("--steps {spec}: the first step is after the last; write {last}-{first}").format(
                spec=spec, last=last, first=first
            )
        )
    indices = [i for i, n in enumerate(numbers) if first <= n <= last]
    if not indices:
        raise ValueError(
            _("--steps {spec}: no steps in that range; {name} has steps {first}-{last}").format(
                spec=spec, name=trace.path.name, first=numbers[0], last=numbers[-1]
            )
        )
    return indices


def write_perfetto_file(trace: Trace, indices: list[int], out: Path, logical: bool, console: Console) -> None:
    from tracer.export.perfetto import perfetto_trace

    start = time.perf_counter()
    with console.status(_("Writing the Perfetto timeline ...")):
        data = perfetto_trace(trace, [trace.steps[i] for i in indices], logical)
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("w", encoding="utf-8") as file:
            json.dump(data, file, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    message = _(
        "Wrote [bold]{path}[/]: {events:,} events over {steps} steps, {size} in {seconds:.1f} s. "
        "Open it in Perfetto UI (Open trace file) or chrome://tracing."
    )
    console.print(
        message.format(
            path=out,
            events=len(data["traceEvents"]),
            steps=len(indices),
            size=human_size(out.stat().st_size),
            seconds=time.perf_counter() - start,
        )
    )


def write_html_file(trace: Trace, indices: list[int], out: Path, options: HtmlOptions, console: Console) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from tracer.export.html import write_html

    start = time.perf_counter()
    with Progress(
        TextColumn(_("Rendering frames")), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=console
    ) as progress:
        task = progress.add_task("frames", total=len(indices))
        num_bytes = write_html(
            trace,
            indices,
            out,
            options.size,
            on_frame=lambda n: progress.update(task, completed=n),
            code=options.code,
            notes=options.notes,
            compare=options.compare,
        )
    message = _(
        "Wrote [bold]{path}[/]: {steps} steps, {size} in {seconds:.1f} s. Open it in any browser: one file, "
        "no server, no network."
    )
    console.print(
        message.format(path=out, steps=len(indices), size=human_size(num_bytes), seconds=time.perf_counter() - start)
    )


def human_size(num_bytes: int) -> str:
    if num_bytes < 1024:
        return f"{num_bytes} bytes"
    if num_bytes < 1024**2:
        return f"{num_bytes / 1024:.0f} KB"
    return f"{num_bytes / 1024**2:.1f} MB"
