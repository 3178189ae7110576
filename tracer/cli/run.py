"""`nanoengine run SCENARIO.json`: record a teacher's own scenario (the lessons' and demos' format,
tracer/teach/scenarios.py: requests that may arrive at later steps), then summarise or replay it at
the scenario's focus step, with its look_for text (both kept in the trace's header for the HTML).

    nanoengine run SCENARIO.json [--model M] [engine flags] [--out FILE] [--no-tui] [--predict] [--live]
    nanoengine run --template [> my.json]     a commented example (comments on stderr, JSON on stdout)
"""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from tracer.cli.defaults import add_lang_arg
from tracer.cli.demo import ENGINE_FLAGS, engine_overrides
from tracer.cli.help_format import ArgumentParser
from tracer.cli.trace import add_live_arg, check_live_args, record_and_show, take_sigterm_as_ctrl_c
from tracer.i18n import _
from tracer.teach.scenarios import TEMPLATE, is_comment, load_scenario, scenario_arrivals


def run_main(argv: list[str]) -> int:
    p = ArgumentParser(
        prog="nanoengine run",
        description=_("Record a scenario file (requests, their arrival steps, engine options), then replay it."),
    )
    p.add_argument(
        "scenario", type=Path, nargs="?", help=_("a scenario .json file (see lessons/*/scenario.json, or --template)")
    )
    p.add_argument(
        "--template",
        action="store_true",
        help=_(
            "print a commented example scenario: the comments on stderr, the JSON on stdout "
            "(`nanoengine run --template > my.json` writes a file that runs)"
        ),
    )
    p.add_argument("--model", default=None, help=_("overrides the scenario's model ('default', 'tiny', a folder)"))
    for name in ENGINE_FLAGS:
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=None, help=_("(default: the scenario's own)"))
    p.add_argument("--no-prefix-caching", action="store_true", help=_("turn prefix caching off"))
    p.add_argument("--threads", type=int, default=None, help=_("torch CPU threads"))
    p.add_argument("--out", default=None, help=_("trace file (default: traces/trace-YYYYmmdd-HHMMSS.jsonl)"))
    p.add_argument("--no-tui", action="store_true", help=_("print a summary instead of opening the TUI"))
    p.add_argument("--predict", action="store_true", help=_("open the TUI in predict (quiz) mode"))
    add_live_arg(p)
    add_lang_arg(p)
    args = p.parse_args(argv)
    if args.template:
        return print_template()
    if args.scenario is None:
        p.error(_("give a scenario file, or --template for an example to start from"))
    take_sigterm_as_ctrl_c()
    check_live_args(args)
    scenario = load_scenario(args.scenario, name=args.scenario.stem)
    args.title = scenario.title
    arrivals = scenario_arrivals(scenario)
    options = {**scenario.engine, **engine_overrides(args)}
    if args.threads is not None:
        options["num_threads"] = args.threads
    from nanoengine.engine import LLMEngine

    console = Console(stderr=True)
    model = args.model or scenario.model
    with console.status(_("Loading model {model} ...").format(model=escape(model))):
        engine = LLMEngine(model, **options)
    return record_and_show(engine, arrivals, args, console, scenario)


def print_template() -> int:
    """Comments on stderr, JSON on stdout, line by line: in a terminal the two read as one commented
    example, and redirected, stdout alone is a scenario file (pure JSON, as the schema and every
    JSON tool read it: the loader need not learn a comment syntax)."""
    for line in TEMPLATE.splitlines():
        print(line, file=sys.stderr if is_comment(line) else sys.stdout, flush=True)
    return 0
