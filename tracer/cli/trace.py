"""`nanoengine trace`, `nanoengine replay` and `nanoengine check` (dispatched from tracer.cli.main).

    nanoengine trace "prompt" ["prompt" ...] [engine flags] [--arrive 0,0,4,9] [--out FILE] [--title T]
                     [--no-tui] [--predict] [--live]
    nanoengine run SCENARIO.json [--model M] [engine flags] [--out FILE] [--no-tui] [--predict] [--live]
    nanoengine replay FILE [--step N] [--text] [--predict] [--web [--port 8000]] [--follow] [--compare B]
    nanoengine check FILE [--full]
    nanoengine check --list

A trace FILE (or B) may be `vllm:NAME`: the committed vLLM trace NAME, from any folder
(tracer/cli/vllm_traces.py; `nanoengine replay vllm:` lists the names).

Exit codes: 0 fine; 1 `check` found an invariant violation; 2 bad input (one-line error);
130 interrupted (Ctrl-C, or `kill`: SIGTERM is taken as Ctrl-C, so the steps so far are kept).
"""

from __future__ import annotations

import argparse
import os
import signal
import stat
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from tracer.cli.beams import request_params
from tracer.cli.defaults import add_lang_arg
from tracer.cli.help_format import ArgumentParser
from tracer.cli.main import add_engine_args, engine_options, error_line, read_prompts
from tracer.cli.vllm_traces import resolve_trace
from tracer.i18n import N_, _
from tracer.loop.arrivals import Arrival, parse_arrive
from tracer.loop.drive import drive
from tracer.trace.readable import printable
from tracer.trace.trace_file import Trace, load_trace

if TYPE_CHECKING:
    from tracer.teach.scenarios import Scenario

TRACE_NUM_KV_BLOCKS = 128


def err(message: str) -> None:
    print(error_line(printable(message)), file=sys.stderr)


def take_sigterm_as_ctrl_c() -> None:
    """`kill` (SIGTERM, as from a process manager or a container stop) ends a recording as Ctrl-C
    does: a KeyboardInterrupt, so the trace is closed and kept, never killed midway."""
    signal.signal(signal.SIGTERM, raise_keyboard_interrupt)


def raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def trace_main(argv: list[str]) -> int:
    p = ArgumentParser(
        prog="nanoengine trace",
        description=_("Generate with the step recorder, then open the replay TUI."),
    )
    p.add_argument("prompts", nargs="+", help=_("prompts; `-` reads one from standard input"))
    add_engine_args(p)
    p.add_argument("--out", default=None, help=_("trace file (default: traces/trace-YYYYmmdd-HHMMSS.jsonl)"))
    p.add_argument("--title", default=None, help=_("a title shown by the viewer"))
    p.add_argument("--no-tui", action="store_true", help=_("print a summary instead of opening the TUI"))
    p.add_argument("--predict", action="store_true", help=_("open the TUI in predict (quiz) mode"))
    add_live_arg(p)
    p.add_argument(
        "--arrive",
        default=None,
        help=_(
            "the engine step each prompt joins at, e.g. 0,0,4,9 (default: all at step 0); an idle engine "
            "takes no empty steps, so a prompt due later joins as soon as the others have finished"
        ),
    )
    # A pool of 128 blocks (2,048 tokens at block size 16) fits a few requests and keeps the KV-page
    # view readable; the engine's own default (sized by memory, ~1,456 blocks) would be mostly empty.
    p.set_defaults(num_kv_blocks=TRACE_NUM_KV_BLOCKS)
    args = p.parse_args(argv)
    take_sigterm_as_ctrl_c()
    args.prompts = read_prompts(args.prompts)
    if args.live and args.beam_width is not None:
        raise ValueError(_("--live adds and aborts requests of its own: it cannot record a beam search yet"))
    check_live_args(args)
    from tracer.kernels.choose import build_engine

    if args.out:
        out_target(Path(args.out))  # refused before the model loads
    console = Console(stderr=True)
    params = request_params(args)
    steps = parse_arrive(args.arrive, len(args.prompts)) if args.arrive else [0] * len(args.prompts)
    with console.status(_("Loading model {model} ...").format(model=escape(args.model))):
        engine = build_engine(args.model, engine_options(args))
    arrivals = [Arrival(prompt, params, step, i) for i, (prompt, step) in enumerate(zip(args.prompts, steps))]
    return record_and_show(engine, arrivals, args, console)


def add_live_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--live",
        action="store_true",
        help=_(
            "watch the steps as they happen and drive the engine: space pauses it, → runs one step, "
            "a adds a request, x aborts the selected one (the trace is written as usual)"
        ),
    )


def check_live_args(args: argparse.Namespace) -> None:
    """--live needs a terminal and the TUI: refused in one line before the model loads."""
    if not args.live:
        return
    if args.no_tui or args.predict:
        raise ValueError(
            _("--live shows the run in the TUI as it happens: it cannot be combined with --no-tui or --predict")
        )
    if not (sys.stdin.isatty() and sys.stdout.isatty()) and "TEXTUAL_DRIVER" not in os.environ:
        raise ValueError(
            _("--live needs an interactive terminal (input or output is redirected): run it in a terminal")
        )


def record_and_show(
    engine, arrivals: list[Arrival], args: argparse.Namespace, console: Console, scenario: Scenario | None = None
) -> int:
    """Record the arrivals' run into args.out (or a default path), then summarise or open the replay.
    A scenario's focus and look_for go into the trace's header: the replay, the summary and the
    HTML export open at that step and say what to look for there."""
    from tracer.teach.scenarios import StepCollector, find_focus, mark_focus
    from tracer.trace.recorder import default_trace_path

    for arrival in arrivals:  # a bad request fails before any file (a late arrival joins mid-run)
        engine.input_processor.check_request(arrival.prompt, arrival.params)
    path = Path(args.out) if args.out else default_trace_path()
    target = out_target(path)
    if getattr(args, "live", False):
        return record_live(engine, arrivals, args, target, path)
    partial: Path | None = None
    steps = StepCollector()  # what each step did, by arrival index: where a scenario's focus is
    if scenario is not None:
        engine.add_step_hook(steps)
    ids = steps.ids  # arrival index -> seq_id, filled as the requests join
    try:
        partial = new_partial(target)
        finished = record(engine, partial, args.title, console, arrivals, ids)
    except OSError as e:  # e.g. the disk is full: say where, and still give the text
        err(
            _("could not write the trace to {path}: {error}; the generated text follows on standard output").format(
                path=path, error=e.strerror or e
            )
        )
        if partial is not None:
            discard(partial)
        finish_without_recorder(engine, arrivals, ids)
        return 2
    if not finished:
        assert partial is not None
        return keep_interrupted(partial, target, console)
    if scenario is not None:
        mark_focus(partial, scenario, find_focus(scenario.focus, steps.steps))
    publish(partial, target)  # only a complete trace replaces an existing --out file
    for seq_id in ids.values():
        engine.collect(seq_id)
    print(_("Trace written to {path}").format(path=printable(str(path))))
    if not args.no_tui and not (sys.stdin.isatty() and sys.stdout.isatty()):
        console.print(_("Not an interactive terminal: printing the summary instead of opening the replay."))
        args.no_tui = True
    if args.no_tui:
        return summarize_file(path)
    return open_replay(path, 0, args.predict)


def record_live(engine, arrivals: list[Arrival], args: argparse.Namespace, target: Path, path: Path) -> int:
    """--live: the live app records into a file of its own, published when the app quits."""
    from nanoengine.sampling_params import SamplingParams
    from tracer.live.session import run_live

    partial = new_partial(target)
    params = arrivals[0].params if arrivals else SamplingParams()
    assert isinstance(params, SamplingParams), "--live refuses a beam search (cli/beams.py)"
    try:
        code = run_live(engine, partial, params, arrivals, args.title, shown_as=path)
    except BaseException:
        print(printable(_("the recorded steps are in {path}").format(path=partial)), file=sys.stderr)
        raise
    publish(partial, target)
    print(_("Trace written to {path}").format(path=printable(str(path))))
    return code


FILE_KINDS = {stat.S_IFDIR: N_("a folder"), stat.S_IFIFO: N_("a named pipe (FIFO)"), stat.S_IFSOCK: N_("a socket")}


def out_target(path: Path) -> Path:
    """The file a trace at path is written to: a symlink's target. Refused (ValueError, one line)
    when what is there is not a regular file: a trace never replaces a pipe, a device or a folder."""
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        return target
    except OSError as e:
        raise ValueError(_("cannot write a trace to {path}: {error}").format(path=path, error=e.strerror)) from None
    if not stat.S_ISREG(mode):
        kind = _(FILE_KINDS.get(stat.S_IFMT(mode), N_("a device")))
        raise ValueError(
            _(
                "{path} is {kind}, not a regular file: a trace never replaces it; give a file name such as run.jsonl"
            ).format(path=path, kind=kind)
        )
    return target


def new_partial(target: Path) -> Path:
    """A file of its own next to target to record into (two runs writing one --out never share
    one); renamed to target when complete. Its mode is the one target has or would get."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f"{target.name}.", suffix=".partial")
    try:
        os.fchmod(fd, stat.S_IMODE(target.stat().st_mode) if target.exists() else default_file_mode())
    finally:
        os.close(fd)
    return Path(name)


def default_file_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def publish(partial: Path, target: Path) -> None:
    """Rename the complete trace onto target, checked again: something else may be there by now.
    ValueError (one line) when there is no trace to rename (a recorder that could not write its
    header removes its file)."""
    if not partial.exists():
        raise ValueError(
            _("no trace was written to {target}: {partial} is gone (see the error above)").format(
                target=target, partial=partial
            )
        )
    try:
        out_target(target)
    except ValueError as e:
        raise ValueError(_("{error}; the trace is kept in {partial}").format(error=e, partial=partial)) from None
    os.replace(partial, target)


def discard(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def record(
    engine, path: Path, title: str | None, console: Console, arrivals: list[Arrival], ids: dict[int, int]
) -> bool:
    """Step the engine to the end with a recorder, adding each arrival at its step (ids: its seq_id);
    False if Ctrl-C cut it short."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from tracer.trace.recorder import TraceRecorder

    with (
        TraceRecorder(engine, path, title=title, log_failure=False) as recorder,  # err() says it
        Progress(
            SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console, transient=True
        ) as progress,
    ):
        task = progress.add_task(_("Recording"))
        num_generated = 0

        def show_progress(appended: list) -> None:
            nonlocal num_generated
            num_generated += len(appended)
            description = _("Recording step {step}, {n} tokens generated").format(
                step=recorder.num_steps, n=num_generated
            )
            progress.update(task, description=description)

        try:
            drive(engine, arrivals, recorder=recorder, on_step=show_progress, ids=ids)
        except KeyboardInterrupt:
            recorder.close()
            progress.stop()
            message = _("Interrupted after {n} recorded steps.").format(n=recorder.num_steps)
            console.print(Text(message, style="yellow"))
            return False
        except OSError:
            close_quietly(recorder)
            raise
    return True


def close_quietly(recorder) -> None:
    """Detach a recorder whose file can no longer be written."""
    recorder.engine.remove_step_hook(recorder)
    try:
        recorder.file.close()
    except OSError:
        pass


def keep_interrupted(partial: Path, path: Path, console: Console) -> int:
    """Ctrl-C: keep the steps recorded so far, without replacing an existing trace."""
    kept = partial if os.path.lexists(path) else partial.replace(path)
    note = _(" ({path} was left as it was)").format(path=path) if kept == partial else ""
    # print, not rich: a long path must not be folded across lines (it is meant to be copied)
    message = _("{kept} holds the recorded steps{note}; replay them with `nanoengine replay {kept}`")
    print(printable(message.format(kept=kept, note=note)), file=sys.stderr)
    return 130


def finish_without_recorder(engine, arrivals: list[Arrival], ids: dict[int, int]) -> None:
    """Run the requests to the end without a trace (the late ones join as they would have) and print their text."""
    drive(engine, [a for a in arrivals if a.index not in ids], ids=ids)
    for i in range(len(arrivals)):
        out = engine.collect(ids[i])
        header = f"--- [{i}] {printable(out.prompt)}\n" if len(arrivals) > 1 else ""
        print(f"{header}{out.text}")


def summarize_file(path: Path) -> int:
    from tracer.trace.invariants import check_trace
    from tracer.trace.summary import print_summary, summarize

    trace = load_trace(path)
    console = Console()
    print_summary(trace, summarize(trace, check_trace(trace)), console)
    print_focus(trace, console)
    return 0


def print_focus(trace: Trace, console: Console) -> None:
    """A scenario's step that matters and what to look for there (from the header), if it gave them."""
    focus, look_for = trace.header.get("focus_step"), trace.header.get("look_for")
    if isinstance(focus, int):
        console.print(_("The step that matters: {step} (the replay opens there)").format(step=focus), markup=False)
    if isinstance(look_for, str) and look_for:
        console.print(Text.assemble((_("Look for: "), "bold"), printable(look_for)))


def replay_main(argv: list[str]) -> int:
    p = ArgumentParser(prog="nanoengine replay", description=_("Open a saved trace in the replay TUI."))
    p.add_argument("file", help=_("a trace file, or vllm:NAME for a committed vLLM trace (e.g. vllm:08_preemption)"))
    p.add_argument("--step", type=int, default=0, help=_("step index to open at (0 = the first recorded step)"))
    p.add_argument("--predict", action="store_true", help=_("quiz mode: predict each step before you see it"))
    p.add_argument(
        "--text",
        action="store_true",
        help=_(
            "print the step's narration (each decision with its why) instead of opening the TUI; no terminal needed"
        ),
    )
    p.add_argument("--web", action="store_true", help=_("serve the TUI to a browser on localhost (textual-serve)"))
    p.add_argument("--port", type=int, default=8000, help=_("--web: the port (default 8000)"))
    p.add_argument(
        "--compare",
        metavar="B",
        default=None,
        help=_(
            "a second trace of the same workload (a file, or vllm:NAME for vLLM's run of it): its same "
            "step beside this one, differences marked"
        ),
    )
    p.add_argument(
        "--follow",
        action="store_true",
        help=_("follow a trace another process is still writing (a server's --trace file), like tail -f"),
    )
    add_lang_arg(p)
    args = p.parse_args(argv)
    path = resolve_trace(args.file)  # vllm:NAME: an unknown name is one line listing the names
    compare = resolve_trace(args.compare) if args.compare else None
    if args.text:
        if args.web or args.compare or args.predict or args.follow:
            err(_("--text prints one step: it cannot be combined with --web, --compare, --predict or --follow"))
            return 2
        return print_step_text(str(path), args.step)
    if args.follow:
        if args.web or args.compare or args.predict:
            err(_("--follow shows a trace as it is written: it cannot be combined with --web, --compare or --predict"))
            return 2
        from tracer.live.follow import run_follow

        return run_follow(str(path))
    if args.web and args.compare:
        err(_("--web and --compare cannot be combined yet: use `nanoengine diff A B` beside the web replay"))
        return 2
    if args.web:
        from tracer.cli.ports import check_port, listen_sockets
        from tracer.export.web import serve_replay

        check_port(args.port)
        return serve_replay(path, args.step, args.predict, args.port, listen=listen_sockets)
    # run_replay opens the trace (lazily when it is big) and refuses a bad file or --step in one line.
    return open_replay(path, args.step, args.predict, compare)


def print_step_text(path: str, index: int) -> int:
    """`replay FILE --step N --text`: the narration of step index N, as the TUI shows it; then every
    violation in full and the code panel (the function behind the decision, its line marked ▶)."""
    from tracer.replay.decision_code import step_code_text
    from tracer.replay.model import ReplayModel
    from tracer.replay.narration import narrate

    trace = load_or_report(path)
    if trace is None:
        return 2
    if not trace.steps:
        err(_("{path} has a header but no steps: nothing to narrate").format(path=path))
        return 2
    if not 0 <= index < len(trace.steps):
        err(_("step {step} is outside the trace: choose 0 .. {last}").format(step=index, last=len(trace.steps) - 1))
        return 2
    model = ReplayModel(trace, index)
    print(printable(narrate(model.current, model.header, model.beam_scores())))
    for line in step_code_text(model.current, model.header):
        print(printable(line))
    return 0


def open_replay(path: Path, start_step: int, predict: bool = False, compare: Path | None = None) -> int:
    try:
        from tracer.replay.app import run_replay
    except ModuleNotFoundError as e:
        if e.name != "tracer.replay.app":
            raise
        err(
            _(
                "the replay TUI (tracer.replay.app) is not installed; the trace is in {path}: "
                "use `nanoengine check {path}` or `--no-tui`"
            ).format(path=path)
        )
        return 2
    return run_replay(path, start_step, predict=predict, compare=compare)


def check_main(argv: list[str]) -> int:
    p = ArgumentParser(
        prog="nanoengine check",
        description=_("Run the invariant checker on every step of a trace."),
    )
    p.add_argument("file", nargs="?", help=_("a trace file, or vllm:NAME"))
    p.add_argument(
        "--full", action="store_true", help=_("validate every line against the JSON schema (slower; default: a sample)")
    )
    p.add_argument("--list", action="store_true", help=_("list the invariants with their one-line rules, then exit"))
    p.add_argument(
        "--profile",
        help=_(
            "which invariants: nanoengine (all), correctness (without nanoengine's own policy) or vllm; "
            "default: the profile of the engine that wrote the trace (its header says which)"
        ),
    )
    add_lang_arg(p)
    args = p.parse_args(argv)
    from tracer.trace.invariants import PROFILES  # after --help: the checker imports the engine

    if args.profile is not None and args.profile not in PROFILES:
        p.error(
            _("unknown --profile {name!r}; choose one of {names}").format(name=args.profile, names=", ".join(PROFILES))
        )
    if args.list:
        return list_invariants(args.profile or "nanoengine")
    if args.file is None:
        err(_("give a trace file to check (`nanoengine check FILE`), or --list to see the invariants"))
        return 2
    trace = load_or_report(args.file, "all" if args.full else "sample")
    if trace is None:
        return 2
    from tracer.trace.invariants import check_trace, profile_for
    from tracer.trace.summary import violations_table

    profile = args.profile or profile_for(trace.header)
    try:
        violations = check_trace(trace, profile)
    except Exception as e:  # an odd value in a step the sampled schema check did not read
        if load_or_report(args.file, "all") is not None:  # None: it named the line and field
            message = _("{path}: the invariant checker cannot read this trace ({error})")
            err(message.format(path=args.file, error=f"{type(e).__name__}: {e}")[:300])
        return 2
    console = Console()
    if trace.warning:  # said on stderr too; here so the verdict itself cannot be read as "the whole run is fine"
        message = _("[yellow]truncated trace:[/] only the first {n} complete steps were checked")
        console.print(message.format(n=trace.num_steps))
    shown = escape(printable(args.file))
    if violations:
        console.print(violations_table(violations))
        message = _("[red]{n} invariant violations[/] in {steps} steps of {path}")
        console.print(message.format(n=len(violations), steps=trace.num_steps, path=shown))
        return 1
    message = _("[green]OK[/]: {steps} steps of {path}, {n} invariants ({profile}) hold at every step")
    console.print(message.format(steps=trace.num_steps, path=shown, n=len(PROFILES[profile]), profile=profile))
    return 0


def list_invariants(profile: str) -> int:
    from rich.table import Table
    from rich.text import Text

    from tracer.trace.invariants import PROFILES

    rules = PROFILES[profile]
    title = _("{n} invariants ({profile}), checked at every step").format(n=len(rules), profile=profile)
    table = Table(title=title, title_justify="left")
    table.add_column(_("invariant"), style="bold", no_wrap=True)
    table.add_column(_("what must hold"))
    table.add_column(_("file"))  # its concern: counters ... lifecycle are correctness, policy is nanoengine's
    for rule in rules:
        table.add_row(rule.name, Text(rule.text), rule.concern)  # rules hold brackets: never markup
    Console().print(table)
    return 0


def load_or_report(path: str, validate: str = "sample") -> Trace | None:
    """The trace at path (or vllm:NAME), or None after a one-line error."""
    try:
        trace = load_trace(resolve_trace(path), validate)
    except ValueError as e:  # a TraceError, or an unknown vllm:NAME
        err(str(e))
        return None
    if trace.warning:
        print(_("nanoengine: warning: {message}").format(message=trace.warning), file=sys.stderr)
    return trace
