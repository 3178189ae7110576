"""`nanoengine demo NAME`: the command line of the classroom demos (tracer.teach.demos)."""

from __future__ import annotations

import argparse
import os
import subprocess
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
    vllm_trace = vs_vllm_trace(demo.name, args, console) if args.vs_vllm else None
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
    if vllm_trace == RECORD_NOW:
        vllm_trace = record_vllm(runs[0].trace_path, console)
    if vllm_trace is not None:
        report_vs_vllm(console, runs[0].trace_path, vllm_trace)
    if args.no_tui:
        return 0
    from tracer.replay.app import run_replay

    return run_replay(
        runs[0].trace_path, start_step=runs[0].focus_step, predict=args.predict, guide=guide, compare=vllm_trace
    )


RECORD_NOW = Path("<record vLLM on this run>")  # vs_vllm_trace: no committed trace fits, the recorder is here
VLLM_PYTHON = "NANOENGINE_VLLM_PYTHON"  # a python with vllm==0.33.0 (docs/vllm.md)


def vs_vllm_trace(name: str, args: argparse.Namespace, console: Console) -> Path:
    """vLLM v1's scheduler on this demo's requests, as the run's own model tokenizes them: the
    committed trace of that model's token ids (demo-NAME.jsonl: tiny, demo-NAME.default.jsonl:
    default), else RECORD_NOW when $NANOENGINE_VLLM_PYTHON can record it from the run; else the
    tiny model's, said so."""
    from tracer.vllm.scenarios import DEFAULT_SUFFIX, TRACES_DIR

    committed = TRACES_DIR / f"demo-{name}{'' if args.model == 'tiny' else DEFAULT_SUFFIX}.jsonl"
    fits = args.model in ("default", "tiny") and not engine_overrides(args)
    if fits and committed.exists():
        return committed
    if os.environ.get(VLLM_PYTHON):
        return RECORD_NOW
    if not fits:
        raise ValueError(
            f"--vs-vllm with --model {args.model} or engine flags needs vLLM's scheduler recorded on this run: set "
            f"{VLLM_PYTHON} to a python with vllm==0.33.0 (docs/vllm.md), or leave them out"
        )
    console.print(
        f"vLLM's trace of this demo on the {args.model} model's token ids is not recorded yet (docs/vllm.md; or set "
        f"{VLLM_PYTHON} to record it now): comparing on the tiny model, whose text is random bytes.",
        markup=False,
    )
    args.model = "tiny"
    return TRACES_DIR / f"demo-{name}.jsonl"


def record_vllm(ours: Path, console: Console) -> Path:
    """Record vLLM's scheduler on this run's requests and sampled tokens (no weights needed), beside it."""
    theirs = ours.with_name(ours.stem + ".vllm.jsonl")
    console.print(f"recording vLLM v1's scheduler on the same requests → {theirs} ...", markup=False)
    root = Path(__file__).resolve().parents[2]  # the recorder imports tracer.vllm from this checkout
    env = {**os.environ, "PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu"}
    command = [os.environ[VLLM_PYTHON], "-m", "tracer.vllm.record", str(ours), "-o", str(theirs)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=root)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ValueError(f"the vLLM recorder ({os.environ[VLLM_PYTHON]}) failed: {last}")
    return theirs


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
        help="open the demo beside vLLM v1's own scheduler on the same requests (its committed trace of this "
        "model's token ids, or recorded now with $NANOENGINE_VLLM_PYTHON)",
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
