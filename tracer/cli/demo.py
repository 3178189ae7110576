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
from tracer.cli.defaults import add_lang_arg, default_of, with_default
from tracer.cli.help_format import ArgumentParser
from tracer.i18n import _
from tracer.replay.app import parse_terminal_size
from tracer.teach.demos import DEFAULT_SIZE, DEMOS, export_frames, look_for, run_demo


def demo_main(argv: list[str]) -> int:
    args = parse_args(argv)
    console = Console(highlight=False)
    if args.name == "list":
        return list_demos(console)
    demo = DEMOS.get(args.name)
    if demo is None:
        raise ValueError(
            _("no demo {name!r}; choose one of: {names} (or `nanoengine demo list`)").format(
                name=args.name, names=", ".join(DEMOS)
            )
        )
    steps = parse_steps(args.steps)
    size = parse_terminal_size(args.size)
    if args.vs_vllm and any(r.is_beam_search for r in demo.build(args.model == "tiny").requests):
        raise ValueError(
            _(
                "--vs-vllm: vLLM v1's scheduler runs no beam search (its LLM.beam_search sends each step's beams "
                "as new requests), so there is no vLLM run of the {name} demo to compare with"
            ).format(name=demo.name)
        )
    vllm_trace = vs_vllm_trace(demo.name, args, console) if args.vs_vllm else None
    if args.threads is not None and args.threads < 1:
        raise ValueError(_("--threads must be >= 1, got {value}").format(value=args.threads))
    runs = run_demo(demo, args.model, args.out_dir, console, threads=args.threads, engine=engine_overrides(args))
    console.print()
    demo.report(console, runs)
    guide = look_for(runs[0])
    console.print(Text.assemble((_("Look for: "), "bold"), guide))
    if len(runs) > 1:
        guide += " " + other_runs_hint(demo, runs)
        console.print(other_runs_hint(demo, runs), soft_wrap=True, markup=False)
    if args.export:
        for run, variant in zip(runs, demo.variants):
            prefix = f"{variant or demo.name}-"
            wanted = steps or [run.focus_step]
            assert run.trace_path is not None, "demos always record a trace"
            paths = export_frames(run.trace_path, wanted, Path(args.export), prefix, size, console)
            message = _("{n} frame(s) of the {run} run → {folder}")
            console.print(message.format(n=len(paths), run=variant or demo.name, folder=escape(str(args.export))))
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
    console.print(Text.assemble((_("Beside vLLM v1: "), "bold"), first_difference_line(diff)))
    console.print(_("(nanoengine diff {a} {b} lists every difference)").format(a=ours, b=theirs), markup=False)


def other_runs_hint(demo, runs) -> str:
    """How to open the other variants' traces (the TUI shows one trace at a time)."""
    others = [
        _("the {variant} run: nanoengine replay {path}").format(variant=variant, path=run.trace_path)
        for variant, run in zip(demo.variants[1:], runs[1:])
    ]
    return _("Compare with {runs} (in a second terminal, side by side).").format(runs="; ".join(others))


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
            raise ValueError(_("--{flag} must be >= 1, got {value}").format(flag=name.replace("_", "-"), value=value))
    return options


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = ArgumentParser(
        prog="nanoengine demo",
        description=_(
            "Classroom demos: deterministic scenarios that record a trace and open the replay TUI at the step "
            "that matters."
        ),
    )
    p.add_argument("name", help=_("list, or one of: {names}").format(names=", ".join(DEMOS)))
    p.add_argument(
        "--model",
        default=default_of(EngineConfig, "model"),
        help=with_default(_("'default' (SmolLM2-135M, real text) or 'tiny' (instant) {shown}")),
    )
    p.add_argument("--no-tui", action="store_true", help=_("record and report only"))
    p.add_argument("--predict", action="store_true", help=_("open the TUI in predict (quiz) mode"))
    p.add_argument("--export", metavar="DIR", default=None, help=_("write SVG frames here instead of opening the TUI"))
    p.add_argument("--steps", default=None, help=_("steps to export, e.g. 3,7,12 (default: the focus step)"))
    p.add_argument("--size", default=f"{DEFAULT_SIZE[0]}x{DEFAULT_SIZE[1]}", help=_("terminal size of the frames"))
    p.add_argument("--out-dir", type=Path, default=Path("traces"), help=_("where to write the trace(s)"))
    for name in ENGINE_FLAGS:  # the engine flags of generate and trace; unset ones keep the demo's values
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=None, help=_("(default: the demo's own)"))
    p.add_argument("--no-prefix-caching", action="store_true", help=_("turn prefix caching off"))
    p.add_argument(
        "--vs-vllm",
        action="store_true",
        help=_(
            "open the demo beside vLLM v1's own scheduler on the same requests (its committed trace of this "
            "model's token ids, or recorded now with $NANOENGINE_VLLM_PYTHON)"
        ),
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help=_("torch CPU threads (default: torch's choice; 1 is much faster on a busy machine)"),
    )
    add_lang_arg(p)
    return p.parse_args(argv)


def parse_steps(text: str | None) -> list[int]:
    if not text:
        return []
    try:
        steps = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(
            _("--steps takes step numbers separated by commas, e.g. 3,7,12; got {text!r}").format(text=text)
        ) from None
    if any(s < 0 for s in steps):
        raise ValueError(_("--steps must be >= 0, got {text!r}").format(text=text))
    return steps


def list_demos(console: Console) -> int:
    table = Table(title=_("nanoengine demos"), title_justify="left")
    table.add_column(_("name"))
    table.add_column(_("shows"))
    for demo in DEMOS.values():
        table.add_row(demo.name, _(demo.summary))
    console.print(table)
    console.print(
        _(
            "Run one with [bold]nanoengine demo NAME[/] (add --model tiny for an instant run, "
            "--no-tui to only record, --export DIR --steps 3,7 for SVG frames, --threads 1 on a busy "
            "machine)."
        )
    )
    return 0
