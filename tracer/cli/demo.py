"""`nanoengine demo NAME`: the command line of the classroom demos (tracer.teach.demos)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tracer.replay.app import parse_terminal_size
from tracer.teach.demos import DEFAULT_SIZE, DEMOS, export_frames, run_demo


def demo_main(argv: list[str]) -> int:
    args = parse_args(argv)
    console = Console(highlight=False)
    if args.name == "list":
        return list_demos(console)
    demo = DEMOS.get(args.name)
    if demo is None:
        raise ValueError(f"no demo {args.name!r}; choose one of: {', '.join(DEMOS)} (or `nanoengine demo list`)")
    steps = parse_steps(args.steps)
    size = parse_terminal_size(args.size)
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    runs = run_demo(demo, args.model, args.out_dir, console, threads=args.threads)
    console.print()
    demo.report(console, runs)
    console.print(f"[bold]Look for:[/] {runs[0].scenario.look_for}")
    if args.export:
        for run, variant in zip(runs, demo.variants):
            prefix = f"{variant or demo.name}-"
            wanted = steps or [run.focus_step]
            assert run.trace_path is not None, "demos always record a trace"
            paths = export_frames(run.trace_path, wanted, Path(args.export), prefix, size, console)
            console.print(f"{len(paths)} frame(s) of the {variant or demo.name} run → {args.export}")
        return 0
    if args.no_tui:
        return 0
    from tracer.replay.app import run_replay

    assert runs[0].trace_path is not None, "demos always record a trace"
    return run_replay(runs[0].trace_path, start_step=runs[0].focus_step, predict=args.predict)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="nanoengine demo",
        description="Classroom demos: deterministic scenarios "
        "that record a trace and open the replay TUI at the step that matters.",
    )
    p.add_argument("name", help=f"list, or one of: {', '.join(DEMOS)}")
    p.add_argument("--model", default="default", help="'default' (SmolLM2-135M, real text) or 'tiny' (instant)")
    p.add_argument("--no-tui", action="store_true", help="record and report only")
    p.add_argument("--predict", action="store_true", help="open the TUI in predict (quiz) mode")
    p.add_argument("--export", metavar="DIR", default=None, help="write SVG frames here instead of opening the TUI")
    p.add_argument("--steps", default=None, help="steps to export, e.g. 3,7,12 (default: the focus step)")
    p.add_argument("--size", default=f"{DEFAULT_SIZE[0]}x{DEFAULT_SIZE[1]}", help="terminal size of the frames")
    p.add_argument("--out-dir", type=Path, default=Path("traces"), help="where to write the trace(s)")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: torch's choice; 1 is much faster on a busy machine)",
    )
    return p.parse_args(argv)


def parse_steps(text: str | None) -> list[int]:
    if not text:
        return []
    try:
        steps = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--steps takes step numbers separated by commas, e.g. 3,7,12; got {text!r}") from None
    if any(s < 0 for s in steps):
        raise ValueError(f"--steps must be >= 0, got {text!r}")
    return steps


def list_demos(console: Console) -> int:
    table = Table(title="nanoengine demos", title_justify="left")
    table.add_column("name")
    table.add_column("shows")
    for demo in DEMOS.values():
        table.add_row(demo.name, demo.summary)
    console.print(table)
    console.print(
        "Run one with [bold]nanoengine demo NAME[/] (add --model tiny for an instant run, "
        "--no-tui to only record, --export DIR --steps 3,7 for SVG frames, --threads 1 on a busy "
        "machine)."
    )
    return 0
