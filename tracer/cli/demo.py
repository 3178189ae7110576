"""`nanoengine demo NAME`: the command line of the classroom demos (tracer.teach.demos)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from nanoengine.config import EngineConfig
from tracer.cli.defaults import SHOWN, default_of
from tracer.replay.app import parse_terminal_size
from tracer.teach.demos import DEFAULT_SIZE, DEMOS, export_frames, look_for, run_demo


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
    vllm_trace = vs_vllm_trace(demo.name, args) if args.vs_vllm else None
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    runs = run_demo(demo, args.model, args.out_dir, console, threads=args.threads, engine=engine_overrides(args))
    console.print()
    demo.report(console, runs)
    guide = look_for(runs[0])
    console.print(Text.assemble(("Look for: ", "bold"), guide))
    if len(runs) > 1:
        guide += " " + other_runs_hint(demo, runs)
        console.print(other_runs_hint(demo, runs), soft_wrap=True, markup=False)
    if args.export:
        for run, variant in zip(runs, demo.variants):
            prefix = f"{variant or demo.name}-"
            wanted = steps or [run.focus_step]
            assert run.trace_path is not None, "demos always record a trace"
            paths = export_frames(run.trace_path, wanted, Path(args.export), prefix, size, console)
            console.print(f"{len(paths)} frame(s) of the {variant or demo.name} run → {escape(str(args.export))}")
        return 0
    assert runs[0].trace_path is not None, "demos always record a trace"
    if vllm_trace is not None:
        report_vs_vllm(console, runs[0].trace_path, vllm_trace)
    if args.no_tui:
        return 0
    from tracer.replay.app import run_replay

    return run_replay(
        runs[0].trace_path, start_step=runs[0].focus_step, predict=args.predict, guide=guide, compare=vllm_trace
    )


def vs_vllm_trace(name: str, args: argparse.Namespace) -> Path:
    """The committed trace of vLLM v1's scheduler on this demo (recorded from the tiny model's run)."""
    from tracer.vllm.scenarios import TRACES_DIR

    if args.model not in ("default", "tiny") or engine_overrides(args):
        raise ValueError(
            "--vs-vllm compares with vLLM's committed trace of the demo as it is: use it without --model "
            "and engine flags (it runs the tiny model)"
        )
    args.model = "tiny"
    return TRACES_DIR / f"demo-{name}.jsonl"


def report_vs_vllm(console: Console, ours: Path, theirs: Path) -> None:
    from tracer.trace.diff import diff_traces, first_difference_line
    from tracer.trace.trace_file import load_trace

    diff = diff_traces(load_trace(ours), load_trace(theirs))
    console.print(Text.assemble(("Beside vLLM v1: ", "bold"), first_difference_line(diff)))
    console.print(f"(nanoengine diff {ours} {theirs} lists every difference)", markup=False)


def other_runs_hint(demo, runs) -> str:
    """How to open the other variants' traces (the TUI shows one trace at a time)."""
    others = [
        f"the {variant} run: nanoengine replay {run.trace_path}" for variant, run in zip(demo.variants[1:], runs[1:])
    ]
    return "Compare with " + "; ".join(others) + " (in a second terminal, side by side)."


ENGINE_FLAGS = {  # flag -> the engine option it overrides in the demo's scenario
    "block_size": int,
    "num_kv_blocks": int,
    "max_num_batched_tokens": int,
    "max_num_seqs": int,
    "max_model_len": int,
}


def engine_overrides(args: argparse.Namespace) -> dict:
    """The engine flags given on the command line (the others keep the demo's own values)."""
    options = {name: getattr(args, name) for name in ENGINE_FLAGS if getattr(args, name) is not None}
    if args.no_prefix_caching:
        options["enable_prefix_caching"] = False
    for name, value in options.items():
        if value is not False and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    return options


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="nanoengine demo",
        description="Classroom demos: deterministic scenarios "
        "that record a trace and open the replay TUI at the step that matters.",
    )
    p.add_argument("name", help=f"list, or one of: {', '.join(DEMOS)}")
    p.add_argument(
        "--model",
        default=default_of(EngineConfig, "model"),
        help=f"'default' (SmolLM2-135M, real text) or 'tiny' (instant) {SHOWN}",
    )
    p.add_argument("--no-tui", action="store_true", help="record and report only")
    p.add_argument("--predict", action="store_true", help="open the TUI in predict (quiz) mode")
    p.add_argument("--export", metavar="DIR", default=None, help="write SVG frames here instead of opening the TUI")
    p.add_argument("--steps", default=None, help="steps to export, e.g. 3,7,12 (default: the focus step)")
    p.add_argument("--size", default=f"{DEFAULT_SIZE[0]}x{DEFAULT_SIZE[1]}", help="terminal size of the frames")
    p.add_argument("--out-dir", type=Path, default=Path("traces"), help="where to write the trace(s)")
    for name in ENGINE_FLAGS:  # the engine flags of generate and trace; unset ones keep the demo's values
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=None, help="(default: the demo's own)")
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument(
        "--vs-vllm",
        action="store_true",
        help="open the demo beside vLLM v1's own scheduler on the same requests (its committed trace; tiny model)",
    )
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
