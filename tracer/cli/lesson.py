"""`nanoengine lesson ...`: read a lesson, write its exercise, check it, watch it run.

nanoengine lesson start            copy the exercises into ./my-lessons (or $NANOENGINE_LESSONS_DIR)
nanoengine lesson list             every lesson and how far you got
nanoengine lesson show N           the lesson text
nanoengine lesson hint N           hints for the exercise
nanoengine lesson check N          test your functions, then run the engine with them
nanoengine lesson check N --json   the same, as one JSON object on stdout (for grading scripts)
nanoengine lesson trace N          record the lesson's scenario with your code; open the TUI there
nanoengine lesson trace N --compare-reference | --compare-vllm
                                   ... beside the engine's own code's run, or vLLM's; differences marked
nanoengine lesson reset N          put the stub back (your version is kept as exercise.py.bak)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

from rich.console import Console
from rich.markdown import Markdown
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from tracer.teach.lessons import (
    CheckResult,
    Lesson,
    LessonError,
    all_lessons,
    check_python_file,
    describe_exception,
    exit_code,
    find_lesson,
    reference_functions,
    run_lesson_checks,
    shorten,
    student_functions,
)
from tracer.teach.sandbox import run_limited

PROGRESS_FILE = ".progress.json"
ICONS = {"passed": "[green]✓[/]", "failed": "[red]✗[/]", "stub": "[yellow]…[/]", "skipped": "[dim]·[/]"}


def default_workdir() -> Path:
    return Path(os.environ.get("NANOENGINE_LESSONS_DIR") or "my-lessons")


def lesson_main(argv: list[str]) -> int:
    args = parse_args(argv)
    console = Console(highlight=False)
    try:
        return args.handler(args, console)
    except LessonError as e:
        console.print(f"[red]nanoengine lesson: {escape(str(e))}[/]", soft_wrap=True)
        return 2


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="nanoengine lesson",
        description="Lessons with exercises that plug into the "
        "live engine. Start with `nanoengine lesson start`, then `lesson show 1`.",
    )
    sub = p.add_subparsers(dest="command", metavar="{start,list,show,hint,check,trace,reset}")
    sub.required = True

    def command(name: str, handler, help_text: str, lesson_arg: bool = True) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help_text, description=help_text)
        if lesson_arg:
            c.add_argument("lesson", help="lesson number or name, e.g. 1 or request_life")
        c.add_argument(
            "--dir",
            type=Path,
            default=None,
            help="your lessons folder (default: $NANOENGINE_LESSONS_DIR or ./my-lessons)",
        )
        c.set_defaults(handler=handler)
        return c

    start = command("start", cmd_start, "copy the exercise stubs into your lessons folder", lesson_arg=False)
    start.add_argument("--force", action="store_true", help="overwrite exercises you already have (kept as .bak)")
    lst = command("list", cmd_list, "list the lessons and your progress", lesson_arg=False)
    lst.add_argument("--run", action="store_true", help="run every lesson's checks now (slower)")
    command("show", cmd_show, "show a lesson's text")
    hint = command("hint", cmd_hint, "a hint for a lesson: first a nudge; --more for the next, the last shows code")
    hint.add_argument("--more", action="store_true", help="the next hint after the ones you have seen")
    hint.add_argument("--all", action="store_true", help="every hint at once, the code included")
    check = command("check", cmd_check, "check your exercise: direct tests, then the engine runs your code")
    check.add_argument("--file", type=Path, default=None, help="check this file instead of your lessons folder's")
    check.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (lesson, passed, checks: name, passed, status, message) instead; same exit status",
    )
    trace = command("trace", cmd_trace, "record the lesson's scenario with your code plugged in and open the TUI")
    trace.add_argument("--file", type=Path, default=None, help="use this exercise file")
    trace.add_argument("--reference", action="store_true", help="use the engine's own code instead of yours")
    trace.add_argument("--no-tui", action="store_true", help="only record the trace")
    trace.add_argument("--predict", action="store_true", help="quiz mode: predict each step before you see it")
    trace.add_argument("--model", default=None, help="override the scenario's model (e.g. default for SmolLM2)")
    trace.add_argument("--out", type=Path, default=None, help="trace file to write")
    beside = trace.add_mutually_exclusive_group()
    beside.add_argument(
        "--compare-reference",
        action="store_true",
        help="also record the engine's own code on the scenario and show it beside your run, differences marked",
    )
    beside.add_argument(
        "--compare-vllm",
        action="store_true",
        help="show vLLM v1's committed run of the scenario beside yours, differences marked",
    )
    command("reset", cmd_reset, "put the exercise stub back (your file is kept as exercise.py.bak)")
    return p.parse_args(argv)


# ---- the lessons folder ------------------------------------------------------------------
def workdir(args) -> Path:
    return args.dir if args.dir is not None else default_workdir()


def working_file(args, lesson: Lesson) -> Path:
    if getattr(args, "file", None) is not None:
        if args.file.is_dir():
            raise LessonError(f"{args.file} is a folder: pass the exercise.py file you wrote")
        if not args.file.is_file():
            raise LessonError(f"{args.file} does not exist")
        return args.file
    path = workdir(args) / lesson.name / "exercise.py"
    if not path.is_file():
        if not workdir(args).is_dir():
            raise LessonError(
                f"no lessons folder at {shorten(workdir(args))}: run `nanoengine lesson start` first "
                f"(or pass --dir / set NANOENGINE_LESSONS_DIR)"
            )
        raise LessonError(f"{shorten(path)} is missing: run `nanoengine lesson reset {lesson.number}` to get the stub")
    return path


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_progress(folder: Path) -> dict:
    try:
        return json.loads((folder / PROGRESS_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}


def save_progress(folder: Path, lesson: Lesson, path: Path, results: list[CheckResult]) -> None:
    if not folder.is_dir() or path.resolve().parent != (folder / lesson.name).resolve():
        return  # only files in the lessons folder count as progress
    progress = load_progress(folder)
    progress[lesson.name] = {
        "sha256": file_digest(path),
        "passed": sum(r.passed for r in results),
        "total": len(results),
    }
    (folder / PROGRESS_FILE).write_text(json.dumps(progress, indent=2, allow_nan=False) + "\n", encoding="utf-8")


def lesson_status(folder: Path, lesson: Lesson, progress: dict) -> str:
    path = folder / lesson.name / "exercise.py"
    if not path.is_file():
        return "[dim]not started[/]"
    digest = file_digest(path)
    if digest == file_digest(lesson.exercise):
        return "to do"
    entry = progress.get(lesson.name)
    if not entry or entry.get("sha256") != digest:
        return "[yellow]edited, not checked[/]"
    if entry["passed"] == entry["total"]:
        return "[green]✓ passed[/]"
    return f"[red]✗ {entry['passed']}/{entry['total']} checks[/]"


# ---- commands ------------------------------------------------------------------------------
def cmd_start(args, console: Console) -> int:
    folder = workdir(args)
    make_lessons_folder(folder, folder_source(args))
    copied, kept = [], []
    for lesson in all_lessons():
        target = folder / lesson.name / "exercise.py"
        target.parent.mkdir(exist_ok=True)
        if target.exists() and not args.force:
            kept.append(lesson)
            continue
        if target.exists():
            shutil.copyfile(target, target.with_name("exercise.py.bak"))
        shutil.copyfile(lesson.exercise, target)
        copied.append(lesson)
    (folder / "README.md").write_text(WORKDIR_README, encoding="utf-8")
    console.print(
        f"Your lessons folder is [bold]{shorten(folder)}[/]: {len(copied)} exercise(s) copied"
        + (f", {len(kept)} kept (use --force to overwrite)" if kept else "")
        + "."
    )
    if args.dir is None and "NANOENGINE_LESSONS_DIR" not in os.environ:
        console.print("Run the lesson commands from this folder's parent, or set NANOENGINE_LESSONS_DIR.")
    console.print("Next: [bold]nanoengine lesson show 1[/]")
    return 0


def folder_source(args) -> str:
    """Where the lessons folder's path came from, as the student would change it."""
    if args.dir is not None:
        return "--dir"
    return "NANOENGINE_LESSONS_DIR" if os.environ.get("NANOENGINE_LESSONS_DIR") else "--dir or NANOENGINE_LESSONS_DIR"


def make_lessons_folder(folder: Path, given_by: str) -> None:
    """The lessons folder, made if missing; a file or an unusable path there is one LessonError."""
    if folder.exists() and not folder.is_dir():
        raise LessonError(
            f"{shorten(folder)} is a file, not a folder: point {given_by} at a folder for your "
            f"lessons (it is made if missing), or move the file away"
        )
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LessonError(
            f"cannot make the lessons folder {shorten(folder)} ({e.strerror}): point {given_by} at a "
            f"folder you can write"
        ) from None


def cmd_list(args, console: Console) -> int:
    folder = workdir(args)
    if args.run and folder.is_dir():
        for lesson in all_lessons():
            path = folder / lesson.name / "exercise.py"
            if path.is_file() and file_digest(path) != file_digest(lesson.exercise):
                try:
                    save_progress(folder, lesson, path, run_lesson_checks(lesson, None, path))
                except LessonError as e:
                    console.print(f"[red]{lesson.name}: {escape(str(e))}[/]")
    progress = load_progress(folder)
    table = Table(title="nanoengine lessons", title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("lesson")
    table.add_column("you write")
    table.add_column("status")
    for lesson in all_lessons():
        table.add_row(
            str(lesson.number),
            lesson.title.split(". ", 1)[-1],
            ", ".join(lesson.targets.values()),
            lesson_status(folder, lesson, progress) if folder.is_dir() else "[dim]not started[/]",
        )
    console.print(table)
    if not folder.is_dir():
        console.print(
            f"Start with [bold]nanoengine lesson start[/] (copies the exercises to {escape(shorten(folder))})."
        )
    return 0


def cmd_show(args, console: Console) -> int:
    show_markdown(find_lesson(args.lesson).readme, console)
    return 0


def cmd_hint(args, console: Console) -> int:
    """`hint N`: the first tier; `--more`: one tier past the ones seen (remembered in the lessons
    folder's progress file, or counted from the first without a folder); `--all`: every tier."""
    lesson = find_lesson(args.lesson)
    tiers = lesson.hint_tiers()
    folder = workdir(args)
    seen = int(load_progress(folder).get("hints_seen", {}).get(lesson.name, 1))
    shown = len(tiers) if args.all else min(len(tiers), seen + 1) if args.more else 1
    if args.all:
        show_markdown_text("\n".join(tiers), console)
    else:
        console.print(f"[bold]Hint {shown} of {len(tiers)}[/] for {lesson.title}", highlight=False)
        show_markdown_text(tiers[shown - 1], console)
    if args.more and folder.is_dir():
        remember_hint(folder, lesson, max(seen, shown))
    if shown < len(tiers):
        last = " (the last one shows code)" if shown == len(tiers) - 1 else ""
        console.print(f"Still stuck? [bold]nanoengine lesson hint {lesson.number} --more[/] for the next hint{last}.")
    return 0


def remember_hint(folder: Path, lesson: Lesson, seen: int) -> None:
    progress = load_progress(folder)
    progress.setdefault("hints_seen", {})[lesson.name] = seen
    (folder / PROGRESS_FILE).write_text(json.dumps(progress, indent=2, allow_nan=False) + "\n", encoding="utf-8")


def show_markdown(path: Path, console: Console) -> None:
    show_markdown_text(path.read_text(encoding="utf-8"), console)


def show_markdown_text(markdown: str, console: Console) -> None:
    """Print a lesson text; in a terminal, page it when it is taller than the screen."""
    text = Markdown(markdown)
    if not console.is_terminal or len(console.render_lines(text, pad=False)) <= console.height:
        console.print(text)
        return
    os.environ.setdefault("LESS", "-RFX")  # keep colours; quit at the end; leave the text on screen
    with console.pager(styles=True):
        console.print(text)


def cmd_check(args, console: Console) -> int:
    if args.json:
        return check_as_json(args)
    lesson = find_lesson(args.lesson)
    path = working_file(args, lesson)
    check_python_file(path)  # the child imports it: here only what can be found without running it
    console.print(f"[bold]{escape(lesson.title)}[/]: checking {escape(shorten(path))}")

    skip_reasons: set[str] = set()

    def show(result: CheckResult) -> None:
        line = Table.grid(padding=(0, 1))
        line.add_column(width=2, justify="right")
        line.add_column()
        line.add_row(ICONS[result.status], Text(result.doc))
        console.print(line)
        if result.status == "skipped" and result.message not in skip_reasons:
            skip_reasons.add(result.message)  # say why once, at the first check it skips
            console.print(Padding(Text(f"skipped: {result.message}", style="dim"), (0, 0, 0, 5)))
        elif result.message and result.status != "skipped":
            style = "red" if result.status == "failed" else "yellow"
            console.print(Padding(Text(result.message, style=style), (0, 0, 0, 5)))

    results = run_lesson_checks(lesson, None, path, on_result=show)
    passed = sum(r.passed for r in results)
    save_progress(workdir(args), lesson, path, results)
    if passed == len(results):
        console.print(
            f"[green bold]All {len(results)} checks passed.[/] Watch your code run: "
            f"[bold]nanoengine lesson trace {lesson.number}[/]"
        )
        if lesson.solved.is_file():  # a bug hunt: the story that names the fix, now that it is found
            console.print()
            show_markdown(lesson.solved, console)
    else:
        skipped = sum(r.status == "skipped" for r in results)
        console.print(
            f"{passed}/{len(results)} checks passed"
            + (f" ({skipped} skipped)" if skipped else "")
            + f". Stuck? [bold]nanoengine lesson hint {lesson.number}[/]"
        )
    return exit_code(results)


def check_as_json(args) -> int:
    """`check N --json`: the verdicts as one JSON object on stdout (the student's prints go to
    stderr in the child); the exit status as without --json, and 2 with an "error" the checks
    could not run for (no such lesson, a missing file, a syntax error)."""
    report: dict = {"lesson": None}  # then name and file, as far as they are known
    try:
        lesson = find_lesson(args.lesson)
        report.update(lesson=lesson.number, name=lesson.name)
        path = working_file(args, lesson)
        report["file"] = str(path)
        check_python_file(path)
        results = run_lesson_checks(lesson, None, path)
    except LessonError as e:
        print(
            json.dumps({**report, "passed": False, "checks": [], "error": str(e)}, ensure_ascii=False, allow_nan=False)
        )
        return 2
    save_progress(workdir(args), lesson, path, results)
    checks = [{"name": r.name, "passed": r.passed, "status": r.status, "message": r.message} for r in results]
    print(
        json.dumps({**report, "passed": exit_code(results) == 0, "checks": checks}, ensure_ascii=False, allow_nan=False)
    )
    return exit_code(results)


def cmd_trace(args, console: Console) -> int:
    """Record the scenario (the student's code runs in a child with the checks' limits), then
    read what was recorded: the violations are the checker's on the written trace, not the child's.
    --compare-reference records the engine's own code too; --compare-vllm takes vLLM's committed run."""
    from tracer.teach.scenarios import load_scenario

    lesson = find_lesson(args.lesson)
    scenario = load_scenario(lesson.scenario_file, name=lesson.name)
    scenario.title = lesson.title  # the trace is titled as `lesson list` and `lesson show` title the lesson
    if args.reference and args.compare_reference:
        raise LessonError("--compare-reference shows your code beside the reference: leave out --reference")
    compare, beside = (vllm_run(lesson), f"vLLM v1's run (vllm:{lesson.name})") if args.compare_vllm else (None, "")
    path = None if args.reference else working_file(args, lesson)
    if path is not None:
        check_python_file(path)
    source = "the engine's own code" if path is None else f"your code ({shorten(path)})"
    out = args.out or trace_path(workdir(args), lesson)
    console.print(
        f"[bold]{escape(scenario.title)}[/]: running with {escape(source)}, model {escape(args.model or scenario.model)}"
    )
    if path is None:
        why = record(lesson, scenario, None, out, args.model)
    else:
        why = run_limited(lambda: record(lesson, scenario, path, out, args.model), TRACE_TIME_LIMIT_S)
    if why is not None:
        if why.startswith(LESSON_ERROR):
            raise LessonError(why.removeprefix(LESSON_ERROR))
        console.print(f"[red]the run stopped: {escape(why)}[/]")
        return open_partial(out, args, console)
    if args.compare_reference:
        compare = reference_out(out)
        beside = f"the engine's own code's run ({shorten(compare)})"
        console.print(f"and with the engine's own code, model {escape(args.model or scenario.model)}")
        why = record(lesson, scenario, None, compare, args.model)
        if why is not None:
            raise LessonError(why.removeprefix(LESSON_ERROR))
    return show_recorded(out, scenario, args, console, compare, beside)


def vllm_run(lesson: Lesson) -> Path:
    from tracer.cli.vllm_traces import vllm_trace

    try:
        return vllm_trace(lesson.name)
    except ValueError as e:
        raise LessonError(f"lesson {lesson.number} has no vLLM trace to compare with ({e})") from None


def reference_out(out: Path) -> Path:
    """Where the reference's run goes: beside the student's, e.g. traces/08_preemption.reference.jsonl."""
    return out.with_name(f"{out.stem}.reference{out.suffix or '.jsonl'}")


LESSON_ERROR = "lesson error: "
TRACE_TIME_LIMIT_S = 300.0  # the recording of a whole scenario (seconds on the tiny model)


def record(lesson: Lesson, scenario, path: Path | None, out: Path, model: str | None) -> str | None:
    """Run the scenario into `out` with the student's functions (path) or the engine's plugged in;
    None, or why it stopped (in the child: a one-line text is all that comes back)."""
    from tracer.teach.scenarios import ScenarioError, run_scenario
    from tracer.teach.swap import plugged, replacements_for

    try:
        functions = reference_functions(lesson) if path is None else student_functions(lesson, path)
        with plugged(replacements_for(lesson.targets, functions)):
            run_scenario(scenario, out, model=model)
    except NotImplementedError:
        return LESSON_ERROR + (
            f"lesson {lesson.number}'s exercise is still the stub: write it first "
            f"(`nanoengine lesson check {lesson.number}`), or add --reference to watch the "
            f"engine's own code"
        )
    except (LessonError, ScenarioError) as e:
        return LESSON_ERROR + str(e)
    except Exception as e:
        return f"your code raised {describe_exception(e, path)}"
    return None


def show_recorded(out: Path, scenario, args, console: Console, compare: Path | None = None, beside: str = "") -> int:
    """Check and summarise the recorded run, then replay it (beside `compare`, a run named `beside`)."""
    from tracer.teach.look_for import lesson_look_for
    from tracer.teach.scenarios import set_header_fields
    from tracer.trace.invariants import check_trace
    from tracer.trace.trace_file import TraceError, load_trace

    try:
        trace = load_trace(out)
    except TraceError as e:
        raise LessonError(f"the recording left no trace that can be read: {e}") from None
    violations = check_trace(trace)
    focus = trace.header.get("focus_step")
    focus = focus if isinstance(focus, int) and 0 <= focus < trace.num_steps else 0
    console.print(f"{trace.num_steps} steps → {escape(shorten(out))}; the step that matters: {focus}")
    guide = lesson_look_for(trace, scenario)  # the lesson's text only on the model it was written for
    if guide != scenario.look_for:
        set_header_fields(out, look_for=guide or None)
    if guide:
        console.print(f"[bold]Look for:[/] {escape(guide)}")
    if violations:
        v = violations[0]
        console.print(
            f"[red]{len(violations)} invariant violation(s); the first, at step {v.step}: {escape(v.message)}[/]"
        )
    if compare is not None:
        mine = "this run" if args.reference else "your run"
        print_first_difference(trace, compare, f"A = {mine}, B = {beside}", console)
    if args.no_tui:
        return 0 if not violations else 1
    from tracer.replay.app import run_replay

    start = violations[0].step if violations else focus
    return run_replay(out, start_step=start, predict=args.predict, guide=guide, compare=compare)


def print_first_difference(trace, compare: Path, which: str, console: Console) -> None:
    """The first step where the student's run and the other one part ways, in one line."""
    from tracer.trace.diff import DiffError, diff_traces, first_difference_line
    from tracer.trace.trace_file import TraceError, load_trace

    try:
        line = first_difference_line(diff_traces(trace, load_trace(compare)))
    except (DiffError, TraceError) as e:
        line = f"cannot compare with {shorten(compare)}: {e}"
    console.print(Text(f"{which}: {line}"))


def trace_path(folder: Path, lesson: Lesson) -> Path:
    return (folder if folder.is_dir() else Path(".")) / "traces" / f"{lesson.name}.jsonl"


def open_partial(out: Path, args, console: Console) -> int:
    """After a crash: show what was recorded up to it, if anything."""
    from tracer.trace.trace_file import TraceError, load_trace

    try:
        steps = load_trace(out, validate="none").steps if out.exists() else []
    except TraceError:
        steps = []
    if not steps:
        return 1
    console.print(f"The trace up to the crash ({len(steps)} steps) is in {escape(shorten(out))}.")
    if args.no_tui:
        return 1
    from tracer.replay.app import run_replay

    run_replay(out, start_step=len(steps) - 1, predict=args.predict)
    return 1


def cmd_reset(args, console: Console) -> int:
    lesson = find_lesson(args.lesson)
    folder = workdir(args)
    if not folder.is_dir():
        raise LessonError(f"no lessons folder at {shorten(folder)}: run `nanoengine lesson start` first")
    target = folder / lesson.name / "exercise.py"
    target.parent.mkdir(exist_ok=True)
    if target.exists():
        shutil.copyfile(target, target.with_name("exercise.py.bak"))
        console.print(f"Your version is saved as {escape(shorten(target.with_name('exercise.py.bak')))}.")
    shutil.copyfile(lesson.exercise, target)
    console.print(f"{escape(shorten(target))} is the stub again.")
    return 0


WORKDIR_README = """# Your nanoengine lessons

Each folder holds one lesson's `exercise.py`. Write the functions marked TODO, then:

    nanoengine lesson show N     read the lesson
    nanoengine lesson check N    test your code (direct tests, then the engine runs it)
    nanoengine lesson hint N     stuck?
    nanoengine lesson trace N    watch the engine run your code in the replay TUI
    nanoengine lesson reset N    start the exercise again (your file is kept as exercise.py.bak)
    nanoengine lesson list       your progress

Run these from the folder that holds this one, or set NANOENGINE_LESSONS_DIR to its path.
"""


if __name__ == "__main__":
    sys.exit(lesson_main(sys.argv[1:]))
