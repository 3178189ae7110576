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
import re
import shutil
import sys
import unicodedata
from pathlib import Path

from rich.console import Console
from rich.markdown import Markdown
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from tracer.cli.defaults import add_lang_arg
from tracer.cli.help_format import ArgumentParser
from tracer.i18n import N_, _, language, ngettext
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
        console.print(Text(_("nanoengine lesson: {message}").format(message=e), style="red"), soft_wrap=True)
        return 2


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = ArgumentParser(
        prog="nanoengine lesson",
        description=_(
            "Lessons with exercises that plug into the live engine. Start with `nanoengine lesson start`, "
            "then `lesson show 1`."
        ),
    )
    add_lang_arg(p)
    sub = p.add_subparsers(dest="command", metavar="{start,list,show,hint,check,trace,reset}")
    sub.required = True

    def command(name: str, handler, help_text: str, lesson_arg: bool = True) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help_text, description=help_text)
        if lesson_arg:
            c.add_argument("lesson", help=_("lesson number or name, e.g. 1 or request_life"))
        c.add_argument(
            "--dir",
            type=Path,
            default=None,
            help=_("your lessons folder (default: $NANOENGINE_LESSONS_DIR or ./my-lessons)"),
        )
        add_lang_arg(c)
        c.set_defaults(handler=handler)
        return c

    start = command("start", cmd_start, _("copy the exercise stubs into your lessons folder"), lesson_arg=False)
    start.add_argument("--force", action="store_true", help=_("overwrite exercises you already have (kept as .bak)"))
    lst = command("list", cmd_list, _("list the lessons and your progress"), lesson_arg=False)
    lst.add_argument("--run", action="store_true", help=_("run every lesson's checks now (slower)"))
    command("show", cmd_show, _("show a lesson's text"))
    hint = command("hint", cmd_hint, _("a hint for a lesson: first a nudge; --more for the next, the last shows code"))
    hint.add_argument("--more", action="store_true", help=_("the next hint after the ones you have seen"))
    hint.add_argument("--all", action="store_true", help=_("every hint at once, the code included"))
    check = command("check", cmd_check, _("check your exercise: direct tests, then the engine runs your code"))
    check.add_argument("--file", type=Path, default=None, help=_("check this file instead of your lessons folder's"))
    check.add_argument(
        "--json",
        action="store_true",
        help=_(
            "print one JSON object (lesson, passed, checks: name, passed, status, message) instead; same exit status"
        ),
    )
    trace = command("trace", cmd_trace, _("record the lesson's scenario with your code plugged in and open the TUI"))
    trace.add_argument("--file", type=Path, default=None, help=_("use this exercise file"))
    trace.add_argument("--reference", action="store_true", help=_("use the engine's own code instead of yours"))
    trace.add_argument("--no-tui", action="store_true", help=_("only record the trace"))
    trace.add_argument("--predict", action="store_true", help=_("quiz mode: predict each step before you see it"))
    trace.add_argument("--model", default=None, help=_("override the scenario's model (e.g. default for SmolLM2)"))
    trace.add_argument("--out", type=Path, default=None, help=_("trace file to write"))
    beside = trace.add_mutually_exclusive_group()
    beside.add_argument(
        "--compare-reference",
        action="store_true",
        help=_("also record the engine's own code on the scenario and show it beside your run, differences marked"),
    )
    beside.add_argument(
        "--compare-vllm",
        action="store_true",
        help=_("show vLLM v1's committed run of the scenario beside yours, differences marked"),
    )
    command("reset", cmd_reset, _("put the exercise stub back (your file is kept as exercise.py.bak)"))
    return p.parse_args(argv)


# ---- the lessons folder ------------------------------------------------------------------
def workdir(args) -> Path:
    return args.dir if args.dir is not None else default_workdir()


def working_file(args, lesson: Lesson) -> Path:
    if getattr(args, "file", None) is not None:
        if args.file.is_dir():
            raise LessonError(_("{path} is a folder: pass the exercise.py file you wrote").format(path=args.file))
        if not args.file.is_file():
            raise LessonError(_("{path} does not exist").format(path=args.file))
        return args.file
    path = workdir(args) / lesson.name / "exercise.py"
    if not path.is_file():
        if not workdir(args).is_dir():
            raise LessonError(
                _(
                    "no lessons folder at {folder}: run `nanoengine lesson start` first "
                    "(or pass --dir / set NANOENGINE_LESSONS_DIR)"
                ).format(folder=shorten(workdir(args)))
            )
        raise LessonError(
            _("{path} is missing: run `nanoengine lesson reset {n}` to get the stub").format(
                path=shorten(path), n=lesson.number
            )
        )
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
        return "[dim]" + _("not started") + "[/]"
    digest = file_digest(path)
    if digest == file_digest(lesson.exercise):
        return _("to do")
    entry = progress.get(lesson.name)
    if not entry or entry.get("sha256") != digest:
        return "[yellow]" + _("edited, not checked") + "[/]"
    if entry["passed"] == entry["total"]:
        return "[green]✓ " + _("passed") + "[/]"
    return "[red]✗ " + _("{passed}/{total} checks").format(passed=entry["passed"], total=entry["total"]) + "[/]"


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
    (folder / "README.md").write_text(_(WORKDIR_README), encoding="utf-8")
    message = (
        _("Your lessons folder is [bold]{folder}[/]: {n} exercise(s) copied, {kept} kept (use --force to overwrite).")
        if kept
        else _("Your lessons folder is [bold]{folder}[/]: {n} exercise(s) copied.")
    )
    console.print(message.format(folder=escape(shorten(folder)), n=len(copied), kept=len(kept)))
    if args.dir is None and "NANOENGINE_LESSONS_DIR" not in os.environ:
        console.print(_("Run the lesson commands from this folder's parent, or set NANOENGINE_LESSONS_DIR."))
    console.print(_("Next: [bold]nanoengine lesson show 1[/]"))
    return 0


def folder_source(args) -> str:
    """Where the lessons folder's path came from, as the student would change it."""
    if args.dir is not None:
        return "--dir"
    if os.environ.get("NANOENGINE_LESSONS_DIR"):
        return "NANOENGINE_LESSONS_DIR"
    return _("--dir or NANOENGINE_LESSONS_DIR")


def make_lessons_folder(folder: Path, given_by: str) -> None:
    """The lessons folder, made if missing; a file or an unusable path there is one LessonError."""
    if folder.exists() and not folder.is_dir():
        raise LessonError(
            _(
                "{path} is a file, not a folder: point {given_by} at a folder for your lessons (it is made "
                "if missing), or move the file away"
            ).format(path=shorten(folder), given_by=given_by)
        )
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LessonError(
            _("cannot make the lessons folder {path} ({error}): point {given_by} at a folder you can write").format(
                path=shorten(folder), error=e.strerror, given_by=given_by
            )
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
    table = Table(title=_("nanoengine lessons"), title_justify="left")
    table.add_column("#", justify="right")
    table.add_column(_("lesson"))
    table.add_column(_("you write"))
    table.add_column(_("status"))
    for lesson in all_lessons():
        table.add_row(
            str(lesson.number),
            Text(short_title(lesson.localized_title())),
            ", ".join(lesson.targets.values()),
            lesson_status(folder, lesson, progress) if folder.is_dir() else "[dim]" + _("not started") + "[/]",
        )
    console.print(table)
    if not folder.is_dir():
        message = _("Start with [bold]nanoengine lesson start[/] (copies the exercises to {folder}).")
        console.print(message.format(folder=escape(shorten(folder))))
    return 0


LESSON_NUMBER = re.compile(r"^\s*(?:Lesson\s+|第\s*)?\d+\s*课?\s*[.。:：]\s*")


def short_title(title: str) -> str:
    """A title without its lesson number: '1. A request's life' -> "A request's life" ('第 1 课。...' too)."""
    return LESSON_NUMBER.sub("", title, count=1)


def cmd_show(args, console: Console) -> int:
    lesson = find_lesson(args.lesson)
    say_if_untranslated(lesson.readme, lesson.localized_readme(), console)
    show_markdown(lesson.localized_readme(), console)
    return 0


def say_if_untranslated(english: Path, shown: Path, console: Console) -> None:
    """In Chinese, a lesson text that has no Chinese twin yet is shown in English, with one line that says so."""
    if shown == english and language() != "en":
        console.print(Text(_("This lesson is not translated yet: the English text follows."), style="yellow"))


def cmd_hint(args, console: Console) -> int:
    """`hint N`: the first tier; `--more`: one tier past the ones seen (remembered in the lessons
    folder's progress file, or counted from the first without a folder); `--all`: every tier."""
    lesson = find_lesson(args.lesson)
    say_if_untranslated(lesson.hint, lesson.localized_hint(), console)
    tiers = lesson.hint_tiers()
    folder = workdir(args)
    seen = int(load_progress(folder).get("hints_seen", {}).get(lesson.name, 1))
    shown = len(tiers) if args.all else min(len(tiers), seen + 1) if args.more else 1
    if args.all:
        show_markdown_text("\n".join(tiers), console)
    else:
        title = _("[bold]Hint {shown} of {total}[/] for {lesson}").format(
            shown=shown, total=len(tiers), lesson=escape(lesson.localized_title())
        )
        console.print(title, highlight=False)
        show_markdown_text(tiers[shown - 1], console)
    if args.more and folder.is_dir():
        remember_hint(folder, lesson, max(seen, shown))
    if shown < len(tiers):
        message = (
            _("Still stuck? [bold]nanoengine lesson hint {n} --more[/] for the next hint (the last one shows code).")
            if shown == len(tiers) - 1
            else _("Still stuck? [bold]nanoengine lesson hint {n} --more[/] for the next hint.")
        )
        console.print(message.format(n=lesson.number))
    return 0


def remember_hint(folder: Path, lesson: Lesson, seen: int) -> None:
    progress = load_progress(folder)
    progress.setdefault("hints_seen", {})[lesson.name] = seen
    (folder / PROGRESS_FILE).write_text(json.dumps(progress, indent=2, allow_nan=False) + "\n", encoding="utf-8")


def show_markdown(path: Path, console: Console) -> None:
    show_markdown_text(path.read_text(encoding="utf-8"), console)


def is_wide(char: str) -> bool:
    return unicodedata.east_asian_width(char) in ("W", "F")


def join_wide_lines(markdown: str) -> str:
    """Join a paragraph's lines where both sides of the break are wide (Chinese) characters:
    markdown turns a line break into a space, which Chinese text does not have between words."""
    lines = markdown.split("\n")
    out: list[str] = []
    in_code = False
    for line in lines:
        if line.lstrip().startswith("```"):
            in_code = not in_code
        previous = out[-1] if out else ""
        starts_block = not line.strip() or line.lstrip()[:1] in "#|>-*`" or line.lstrip()[:2].rstrip(".").isdigit()
        after_heading = previous.lstrip()[:1] in "#|"  # a heading or a table row ends its line
        wide_break = bool(previous and line) and is_wide(previous[-1]) and is_wide(line.lstrip()[0])
        if not in_code and wide_break and not starts_block and not after_heading:
            out[-1] = previous + line.lstrip()
        else:
            out.append(line)
    return "\n".join(out)


def show_markdown_text(markdown: str, console: Console) -> None:
    """Print a lesson text; in a terminal, page it when it is taller than the screen."""
    text = Markdown(join_wide_lines(markdown))
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
    message = _("[bold]{lesson}[/]: checking {path}")
    console.print(message.format(lesson=escape(lesson.localized_title()), path=escape(shorten(path))))

    skip_reasons: set[str] = set()

    def show(result: CheckResult) -> None:
        line = Table.grid(padding=(0, 1))
        line.add_column(width=2, justify="right")
        line.add_column()
        line.add_row(ICONS[result.status], Text(result.doc))
        console.print(line)
        if result.status == "skipped" and result.message not in skip_reasons:
            skip_reasons.add(result.message)  # say why once, at the first check it skips
            skipped = _("skipped: {reason}").format(reason=result.message)
            console.print(Padding(Text(skipped, style="dim"), (0, 0, 0, 5)))
        elif result.message and result.status != "skipped":
            style = "red" if result.status == "failed" else "yellow"
            console.print(Padding(Text(result.message, style=style), (0, 0, 0, 5)))

    results = run_lesson_checks(lesson, None, path, on_result=show)
    passed = sum(r.passed for r in results)
    save_progress(workdir(args), lesson, path, results)
    if passed == len(results):
        message = ngettext(
            "[green bold]The check passed.[/] Watch your code run: [bold]nanoengine lesson trace {n}[/]",
            "[green bold]All {total} checks passed.[/] Watch your code run: [bold]nanoengine lesson trace {n}[/]",
            len(results),
        )
        console.print(message.format(total=len(results), n=lesson.number))
        if lesson.solved.is_file():  # a bug hunt: the story that names the fix, now that it is found
            console.print()
            show_markdown(lesson.localized_solved(), console)
    else:
        skipped = sum(r.status == "skipped" for r in results)
        message = (
            _("{passed}/{total} checks passed ({skipped} skipped). Stuck? [bold]nanoengine lesson hint {n}[/]")
            if skipped
            else _("{passed}/{total} checks passed. Stuck? [bold]nanoengine lesson hint {n}[/]")
        )
        console.print(message.format(passed=passed, total=len(results), skipped=skipped, n=lesson.number))
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
    scenario.title = lesson.localized_title()  # as `lesson list` and `lesson show` title the lesson
    if args.reference and args.compare_reference:
        raise LessonError(_("--compare-reference shows your code beside the reference: leave out --reference"))
    compare, beside = (
        (vllm_run(lesson), _("vLLM v1's run (vllm:{name})").format(name=lesson.name))
        if args.compare_vllm
        else (None, "")
    )
    path = None if args.reference else working_file(args, lesson)
    if path is not None:
        check_python_file(path)
    source = _("the engine's own code") if path is None else _("your code ({path})").format(path=shorten(path))
    out = args.out or trace_path(workdir(args), lesson)
    message = _("[bold]{lesson}[/]: running with {source}, model {model}")
    console.print(
        message.format(
            lesson=escape(lesson.localized_title()), source=escape(source), model=escape(args.model or scenario.model)
        )
    )
    if path is None:
        why = record(lesson, scenario, None, out, args.model)
    else:
        why = run_limited(lambda: record(lesson, scenario, path, out, args.model), TRACE_TIME_LIMIT_S)
    if why is not None:
        if why.startswith(LESSON_ERROR):
            raise LessonError(why.removeprefix(LESSON_ERROR))
        console.print(Text(_("the run stopped: {why}").format(why=why), style="red"))
        return open_partial(out, args, console)
    if args.compare_reference:
        compare = reference_out(out)
        beside = _("the engine's own code's run ({path})").format(path=shorten(compare))
        console.print(
            _("and with the engine's own code, model {model}").format(model=escape(args.model or scenario.model))
        )
        why = record(lesson, scenario, None, compare, args.model)
        if why is not None:
            raise LessonError(why.removeprefix(LESSON_ERROR))
    return show_recorded(out, scenario, args, console, compare, beside)


def vllm_run(lesson: Lesson) -> Path:
    from tracer.cli.vllm_traces import vllm_trace

    try:
        return vllm_trace(lesson.name)
    except ValueError as e:
        raise LessonError(
            _("lesson {n} has no vLLM trace to compare with ({error})").format(n=lesson.number, error=e)
        ) from None


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
        return LESSON_ERROR + _(
            "lesson {n}'s exercise is still the stub: write it first (`nanoengine lesson check {n}`), or add "
            "--reference to watch the engine's own code"
        ).format(n=lesson.number)
    except (LessonError, ScenarioError) as e:
        return LESSON_ERROR + str(e)
    except Exception as e:
        return _("your code raised {error}").format(error=describe_exception(e, path))
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
        raise LessonError(_("the recording left no trace that can be read: {error}").format(error=e)) from None
    violations = check_trace(trace)
    focus = trace.header.get("focus_step")
    focus = focus if isinstance(focus, int) and 0 <= focus < trace.num_steps else 0
    message = _("{n} steps → {path}; the step that matters: {step}")
    console.print(message.format(n=trace.num_steps, path=escape(shorten(out)), step=focus))
    guide = lesson_look_for(trace, scenario)  # the lesson's text only on the model it was written for
    if guide != scenario.look_for:
        set_header_fields(out, look_for=guide or None)
    if guide:
        console.print(Text.assemble((_("Look for: "), "bold"), guide))
    if violations:
        v = violations[0]
        message = _("{n} invariant violation(s); the first, at step {step}: {message}").format(
            n=len(violations), step=v.step, message=v.message
        )
        console.print(f"[red]{escape(message)}[/]")
    if compare is not None:
        mine = _("this run") if args.reference else _("your run")
        print_first_difference(trace, compare, _("A = {a}, B = {b}").format(a=mine, b=beside), console)
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
        line = _("cannot compare with {path}: {error}").format(path=shorten(compare), error=e)
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
    message = _("The trace up to the crash ({n} steps) is in {path}.")
    console.print(message.format(n=len(steps), path=escape(shorten(out))))
    if args.no_tui:
        return 1
    from tracer.replay.app import run_replay

    run_replay(out, start_step=len(steps) - 1, predict=args.predict)
    return 1


def cmd_reset(args, console: Console) -> int:
    lesson = find_lesson(args.lesson)
    folder = workdir(args)
    if not folder.is_dir():
        raise LessonError(
            _("no lessons folder at {folder}: run `nanoengine lesson start` first").format(folder=shorten(folder))
        )
    target = folder / lesson.name / "exercise.py"
    target.parent.mkdir(exist_ok=True)
    if target.exists():
        shutil.copyfile(target, target.with_name("exercise.py.bak"))
        saved = escape(shorten(target.with_name("exercise.py.bak")))
        console.print(_("Your version is saved as {path}.").format(path=saved))
    shutil.copyfile(lesson.exercise, target)
    console.print(_("{path} is the stub again.").format(path=escape(shorten(target))))
    return 0


WORKDIR_README = N_("""# Your nanoengine lessons

Each folder holds one lesson's `exercise.py`. Write the functions marked TODO, then:

    nanoengine lesson show N     read the lesson
    nanoengine lesson check N    test your code (direct tests, then the engine runs it)
    nanoengine lesson hint N     stuck?
    nanoengine lesson trace N    watch the engine run your code in the replay TUI
    nanoengine lesson reset N    start the exercise again (your file is kept as exercise.py.bak)
    nanoengine lesson list       your progress

Run these from the folder that holds this one, or set NANOENGINE_LESSONS_DIR to its path.
""")


if __name__ == "__main__":
    sys.exit(lesson_main(sys.argv[1:]))
