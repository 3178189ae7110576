"""Find lessons, load a student's exercise file, and run a lesson's checks against it.

A lesson is a folder lessons/NN_name/ with README.md, exercise.py (stubs), hint.md,
scenario.json and check.py; README.zh.md and hint.zh.md (solved.zh.md for a bug hunt) are the
Chinese twins, shown instead when the language is zh (tracer.i18n). check.py declares

    TARGETS = {"check_stop": "Scheduler.check_stop"}   # exercise function -> engine target
    def check_xxx(fns): ...     # direct checks: call fns.<exercise function> and assert
    def engine_xxx(fns): ...    # engine checks: run the real engine with fns plugged in

Every check runs with the student's functions plugged into the engine. Direct checks run
first, in file order; the engine checks only when all direct checks pass (a broken function
inside the engine gives confusing failures). A check fails by raising AssertionError with a
message written for the student.

The checks run in this process; the student's functions only in a child (tracer.teach.sandbox),
which imports the student's file when it is given by path: each call crosses a pipe as data, the
verdicts are computed here, and the limits (time per check, memory) are this process's to enforce.
Whatever the student's code does (exit the process, leave a thread running, allocate gigabytes,
crash, patch the checks), every check gets a verdict and `lesson check` never hangs.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import inspect
import linecache
import os
import re
import signal
import textwrap
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace

import tracer
from tracer.i18n import _, language
from tracer.teach.plant import Patch
from tracer.teach.sandbox import (
    MEMORY_LIMIT_BYTES,
    CheckTimeout,
    ExerciseGone,
    ExerciseProcess,
    NotLoaded,
    Raised,
    frames_of,
)
from tracer.teach.swap import original, plugged, replacements_for

DIRECT_TIME_LIMIT_S = 10.0  # a direct check calls the student's function on a tiny input
ENGINE_TIME_LIMIT_S = 60.0  # an engine check runs a whole scenario (about a second when all is well)


class LessonError(ValueError):
    """Something the student (or teacher) can fix: a missing lesson, a broken file."""


def lessons_root() -> Path:
    return Path(tracer.__file__).resolve().parent.parent / "lessons"


@dataclass(slots=True)
class Lesson:
    number: int
    name: str  # folder name, e.g. 01_request_life
    path: Path

    @property
    def title(self) -> str:
        """The English README's first heading (traces and reports keep it)."""
        return first_heading(self.readme) or self.name

    def localized_title(self) -> str:
        """The title in the reader's language: the twin's first heading when there is one."""
        return first_heading(self.localized_readme()) or self.title

    def localized_readme(self) -> Path:
        return localized(self.readme)

    def localized_hint(self) -> Path:
        return localized(self.hint)

    def localized_solved(self) -> Path:
        return localized(self.solved)

    @property
    def readme(self) -> Path:
        return self.path / "README.md"

    @property
    def hint(self) -> Path:
        return self.path / "hint.md"

    @property
    def solved(self) -> Path:
        """A bug hunt's "In real engines" story, told once the fix passes (it names the fix)."""
        return self.path / "solved.md"

    def hint_tiers(self) -> list[str]:
        """hint.md's (or its twin's) `## ` sections, first nudge first; the last one shows code."""
        return split_tiers(self.localized_hint().read_text(encoding="utf-8"))

    @property
    def exercise(self) -> Path:
        return self.path / "exercise.py"

    @property
    def planted_bug(self) -> Patch | None:
        """A bug hunt's bug, planted.py's BUG: its exercise.py is the engine's current function with
        this patch applied (laid out for 80 columns; tests/teach/test_bughunt_lessons.py checks it)."""
        path = self.path / "planted.py"
        return load_module(path, f"nanoengine_lesson_bug_{self.name}").BUG if path.is_file() else None

    @property
    def scenario_file(self) -> Path:
        return self.path / "scenario.json"

    def checks_module(self) -> ModuleType:
        return load_module(self.path / "check.py", f"nanoengine_lesson_check_{self.name}")

    @property
    def targets(self) -> dict[str, str]:
        """check.py's TARGETS, read as a literal without running check.py (some import torch, 2 s:
        `lesson list` stays quick); any other TARGETS is read by importing the module."""
        with contextlib.suppress(SyntaxError, ValueError, OSError):
            for node in ast.parse((self.path / "check.py").read_bytes()).body:
                if isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == ["TARGETS"]:
                    return dict(ast.literal_eval(node.value))
        return dict(self.checks_module().TARGETS)


def twin(path: Path, lang: str) -> Path:
    """README.md -> README.zh.md: the same text in lang."""
    return path.with_name(f"{path.stem}.{lang}{path.suffix}")


def localized(path: Path) -> Path:
    """The twin of path in the reader's language if it exists, else path itself (English)."""
    if language() == "en":
        return path
    translated = twin(path, language())
    return translated if translated.is_file() else path


def first_heading(path: Path) -> str | None:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    return next((line[2:].strip() for line in lines if line.startswith("# ")), None)


def split_tiers(text: str) -> list[str]:
    """Markdown cut at each `## ` heading (the `# ` title line before the first is dropped)."""
    tiers: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("## "):
            tiers.append([])
        if tiers:
            tiers[-1].append(line)
    return ["\n".join(lines).strip() + "\n" for lines in tiers] or [text]


def all_lessons(root: Path | None = None) -> list[Lesson]:
    root = root or lessons_root()
    found = []
    for d in sorted(root.iterdir()) if root.is_dir() else []:
        m = re.match(r"(\d+)_\w+$", d.name)
        if m and (d / "check.py").exists():
            found.append(Lesson(int(m.group(1)), d.name, d))
    return found


def find_lesson(key: str, root: Path | None = None) -> Lesson:
    """A lesson by number ('1', '01') or name ('request_life', '01_request_life')."""
    lessons = all_lessons(root)
    if not lessons:
        raise LessonError(
            _(
                "no lessons found in {folder}: the lessons ship with the source checkout (install it with "
                "`pip install -e .` from the repository)"
            ).format(folder=root or lessons_root())
        )
    key = str(key).strip()
    for lesson in lessons:
        if (key.isdigit() and int(key) == lesson.number) or key in (lesson.name, lesson.name.split("_", 1)[1]):
            return lesson
    names = ", ".join(f"{l.number} ({l.name.split('_', 1)[1]})" for l in lessons)
    raise LessonError(_("no lesson {key!r}; choose one of: {names}").format(key=key, names=names))


# ---- loading the student's file -------------------------------------------------------------
def check_python_file(path: Path) -> None:
    """A LessonError unless path is a .py file that compiles, found without running any of it."""
    if path.is_dir():
        raise LessonError(_("{path} is a folder: pass the exercise.py file you wrote").format(path=path))
    if not path.is_file():
        raise LessonError(_("{path} does not exist").format(path=path))
    if path.suffix != ".py":
        raise LessonError(
            _("{path} is not a Python file: pass the exercise.py file you wrote (a .py file)").format(path=path)
        )
    try:
        compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
    except SyntaxError as e:
        raise LessonError(syntax_error(path, e)) from None
    except (OSError, ValueError) as e:  # unreadable, or NUL bytes
        raise LessonError(
            _("{path} cannot be read as Python ({error}): pass the exercise.py file you wrote").format(
                path=path, error=e
            )
        ) from None


def syntax_error(path: Path, e: SyntaxError) -> str:
    return _("{path} line {line}: syntax error: {error}; fix it and run the check again").format(
        path=path, line=e.lineno, error=e.msg
    )


def load_module(path: Path, module_name: str) -> ModuleType:
    """Import a file by path; a syntax or import error becomes a one-line LessonError."""
    check_python_file(path)
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise LessonError(
            _("{path} cannot be imported as Python: pass the exercise.py file you wrote").format(path=path)
        )
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise LessonError(syntax_error(path, e)) from None
    except SystemExit:
        raise LessonError(
            _(
                "{path} called sys.exit() (or raised SystemExit) while being imported: remove it; an exercise "
                "file only defines functions"
            ).format(path=path)
        ) from None
    except Exception as e:  # the student's module-level code: report it, never a traceback
        raise LessonError(
            _("{path} failed to import: {error}").format(path=path, error=describe_exception(e, path))
        ) from None
    return module


def student_functions(lesson: Lesson, path: Path) -> dict[str, Callable]:
    module = load_module(path, f"nanoengine_student_{lesson.name}")
    functions = {}
    for name in lesson.targets:
        fn = getattr(module, name, None)
        if not callable(fn):
            raise LessonError(
                _("{path} must define a function named {name}(...); it is missing or renamed").format(
                    path=path, name=name
                )
            )
        expect_same_parameters(fn, stub_parameters(lesson, name), path)
        functions[name] = fn
    return functions


def stub_parameters(lesson: Lesson, name: str) -> list[str]:
    """The parameter names of an exercise function, as the lesson's stub declares them."""
    for node in ast.parse(lesson.exercise.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return [a.arg for a in node.args.args]
    return []


def expect_same_parameters(fn: Callable, expected: list[str], path: Path) -> None:
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return
    if expected and len(params) != len(expected):
        raise LessonError(
            _("{path}: {name} must take ({expected}) like the stub; yours takes ({params})").format(
                path=path, name=fn.__name__, expected=", ".join(expected), params=", ".join(params)
            )
        )


def reference_functions(lesson: Lesson) -> dict[str, Callable]:
    return {name: original(target) for name, target in lesson.targets.items()}


def describe_exception(e: BaseException, student_file: Path | None = None) -> str:
    """'ValueError: bad thing (exercise.py line 12, in check_stop)': the student's own frame if any."""
    where = ""
    frames = frames_of(e)
    if student_file is not None:
        mine = [f for f in frames if Path(f.filename).resolve() == student_file.resolve()]
        if mine:
            f = mine[-1]
            where = _(" ({file} line {line}, in {function}: {code})").format(
                file=student_file.name, line=f.lineno, function=f.name, code=f.line.strip() if f.line else ""
            )
    elif frames:
        f = frames[-1]
        where = _(" ({file} line {line}, in {function})").format(
            file=Path(f.filename).name, line=f.lineno, function=f.name
        )
    raised = getattr(e, "raised", None)
    if isinstance(raised, Raised):  # raised in the child: its name and message as it said them
        return f"{raised.name}: {raised.message}{where}" if raised.message else f"{raised.name}{where}"
    return f"{type(e).__name__}: {e}{where}"


# ---- running checks ------------------------------------------------------------------------
@dataclass(slots=True)
class CheckResult:
    name: str  # the check function's name, e.g. check_eos_stops
    doc: str  # its first docstring line: what it checks
    status: str  # passed / failed / skipped / stub
    message: str = ""
    timed_out: bool = False

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Interrupt a check that runs too long in this process (the engine, run on what a student's
    function returned, may loop); a call into the child has its own deadline too.

    Uses SIGALRM, so it only works on the main thread of a Unix process; elsewhere it is a no-op.
    """
    usable = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def expire(signum, frame):
        raise CheckTimeout(f"{seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def list_checks(module: ModuleType) -> tuple[list[Callable], list[Callable]]:
    """(direct checks, engine checks) in the order they appear in check.py."""
    fns = [
        f
        for name, f in vars(module).items()
        if inspect.isfunction(f) and f.__module__ == module.__name__ and name.startswith(("check_", "engine_"))
    ]
    fns.sort(key=lambda f: f.__code__.co_firstlineno)
    return [f for f in fns if f.__name__.startswith("check_")], [f for f in fns if f.__name__.startswith("engine_")]


def run_lesson_checks(
    lesson: Lesson,
    functions: dict[str, Callable] | None,
    student_file: Path | None = None,
    time_limit: float | None = None,
    on_result: Callable[[CheckResult], None] | None = None,
) -> list[CheckResult]:
    """Every check's result, in order. The checks run here; the student's functions (functions,
    or None: imported from student_file, a LessonError if that fails) only in a child process."""
    module = lesson.checks_module()
    if not hasattr(os, "fork"):  # no fork (Windows): in this process, with its SIGALRM-less limits
        fns = functions if functions is not None else student_functions(lesson, require(student_file))
        with plugged(replacements_for(module.TARGETS, fns)):
            return run_checks_here(lesson, SimpleNamespace(**fns), student_file, time_limit, on_result)

    def load() -> dict[str, Callable]:
        return functions if functions is not None else student_functions(lesson, require(student_file))

    def plug(fns: dict[str, Callable]) -> contextlib.AbstractContextManager:
        return plugged(replacements_for(module.TARGETS, fns))

    try:
        with ExerciseProcess.start(load, plug, time_limit or DIRECT_TIME_LIMIT_S) as exercise:
            proxies = exercise.proxies(list(module.TARGETS))
            with plug(vars(proxies)):
                return run_checks_here(lesson, proxies, student_file, time_limit, on_result, exercise)
    except NotLoaded as e:
        if not e.died:
            raise LessonError(str(e)) from None
        raise LessonError(f"{student_file or 'the exercise'} could not be checked: while importing it, {e}") from None


def require(student_file: Path | None) -> Path:
    if student_file is None:
        raise ValueError("run_lesson_checks needs the functions or the file that defines them")
    return student_file


def run_checks_here(
    lesson: Lesson,
    fns: SimpleNamespace,
    student_file: Path | None = None,
    time_limit: float | None = None,
    on_result: Callable[[CheckResult], None] | None = None,
    exercise: ExerciseProcess | None = None,
) -> list[CheckResult]:
    """The checks, in this process, calling fns (the child's proxies, plugged into the engine)."""
    direct, engine = list_checks(lesson.checks_module())
    results: list[CheckResult] = []
    blocked = ""
    for check in direct + engine:
        doc = _(first_line(check.__doc__)) if check.__doc__ else check.__name__  # titles are in the catalog
        if not blocked and check in engine and any(not r.passed for r in results):
            blocked = _("fix the checks above first: the engine runs your code only once they pass")
        if blocked:
            result = CheckResult(check.__name__, doc, "skipped", blocked)
        else:
            limit = time_limit or (ENGINE_TIME_LIMIT_S if check in engine else DIRECT_TIME_LIMIT_S)
            if exercise is not None:
                exercise.limit_calls(limit)
            result = run_one(check, fns, doc, student_file, limit)
            if result.status == "stub":
                blocked = _("your function is still the stub")
            elif result.timed_out:
                blocked = _("the checks stopped at {check}: it timed out; fix the endless loop first").format(
                    check=check.__name__
                )
            elif exercise is not None and exercise.gone:
                blocked = _("the checks stopped at {check}").format(check=check.__name__)
        results.append(result)
        if on_result:
            on_result(result)
    return results


def run_one(
    check: Callable, fns: SimpleNamespace, doc: str, student_file: Path | None, time_limit: float
) -> CheckResult:
    name = check.__name__
    try:
        with deadline(time_limit):
            check(fns)
    except NotImplementedError as e:
        return CheckResult(name, doc, "stub", stub_message(stub_name(e), student_file))
    except AssertionError as e:
        return CheckResult(name, doc, "failed", str(e) or _("the check failed"))
    except CheckTimeout as e:
        return CheckResult(name, doc, "failed", describe_timeout(check, e, student_file), timed_out=True)
    except ExerciseGone as e:
        return CheckResult(name, doc, "failed", _("{check} gave no verdict: {error}").format(check=name, error=e))
    except MemoryError as e:
        message = _(
            "your code ran out of memory ({error}): a lesson check may use {gb:g} GB more than the engine it runs in"
        )
        return CheckResult(
            name,
            doc,
            "failed",
            message.format(error=describe_exception(e, student_file), gb=MEMORY_LIMIT_BYTES / 2**30),
        )
    except Exception as e:
        raised = getattr(e, "raised", None)
        if isinstance(raised, Raised) and raised.name == "SystemExit":
            code = "" if raised.exit_code is None else raised.exit_code
            message = _(
                "your code called sys.exit({code}){where}: an exercise function must return its result, never "
                "exit the program"
            )
            return CheckResult(name, doc, "failed", message.format(code=code, where=where_in(e, student_file)))
        return CheckResult(
            name, doc, "failed", _("your code raised {error}").format(error=describe_exception(e, student_file))
        )
    return CheckResult(name, doc, "passed")


def stub_message(stub_fn: str | None, student_file: Path | None) -> str:
    if stub_fn and student_file:
        message = _(
            "{function}() is still the stub (it raises NotImplementedError): replace the TODO in {path} with "
            "your code, then run the check again"
        )
    elif stub_fn:
        message = _(
            "{function}() is still the stub (it raises NotImplementedError): replace the TODO with your code, "
            "then run the check again"
        )
    elif student_file:
        message = _(
            "an exercise function is still the stub (it raises NotImplementedError): replace the TODO in {path} "
            "with your code, then run the check again"
        )
    else:
        message = _(
            "an exercise function is still the stub (it raises NotImplementedError): replace the TODO with your "
            "code, then run the check again"
        )
    return message.format(function=stub_fn, path=student_file)


def describe_timeout(check: Callable, e: CheckTimeout, student_file: Path | None) -> str:
    """Name the check, the time, and where the student's code was when it was stopped."""
    frames = e.frames or [f for f in traceback.extract_tb(e.__traceback__) if Path(f.filename).name != "lessons.py"]
    if student_file is not None:
        frames = [f for f in frames if Path(f.filename).resolve() == student_file.resolve()] or frames
    message = _("{check} did not finish within {limit} and was stopped.").format(check=check.__name__, limit=e) + " "
    if frames and (student_file is None or Path(frames[-1].filename).resolve() == student_file.resolve()):
        # the innermost frame inside a loop (the stop can land in a function the loop calls), and that loop's head
        found = next(((f, loop) for f in reversed(frames) if (loop := enclosing_loop(f.filename, f.lineno))), None)
        f, lineno = found or (frames[-1], frames[-1].lineno)
        text = linecache.getline(f.filename, lineno or 0).strip()
        line = f" (`{text}`)" if text else ""
        return message + _(
            "Likely cause: a loop that never ends. Your {function} was at {file} line {line}{code} when it was "
            "stopped: make sure each pass of the loop changes what its condition tests"
        ).format(function=f.name, file=Path(f.filename).name, line=lineno, code=line)
    return message + _(
        "Likely cause: a loop that never ends, in your code or in the engine running it (for example a "
        "function that never frees or takes the blocks the engine waits for)"
    )


def enclosing_loop(filename: str, lineno: int | None) -> int | None:
    """The first line of the innermost while/for loop around the line, if any."""
    try:
        tree = ast.parse(Path(filename).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    loops = [
        node
        for node in ast.walk(tree)
        if isinstance(node, (ast.While, ast.For)) and lineno and node.lineno <= lineno <= (node.end_lineno or 0)
    ]
    return max((node.lineno for node in loops), default=None)


def where_in(e: BaseException, student_file: Path | None) -> str:
    """' (exercise.py line 12)' for the student's last frame in e's traceback, if any."""
    if student_file is None:
        return ""
    mine = [f for f in frames_of(e) if Path(f.filename).resolve() == student_file.resolve()]
    return _(" ({file} line {line})").format(file=student_file.name, line=mine[-1].lineno) if mine else ""


def stub_name(e: NotImplementedError) -> str | None:
    frames = frames_of(e)
    return frames[-1].name if frames else None


def first_line(doc: str | None) -> str:
    return inspect.cleandoc(doc).splitlines()[0] if doc else ""


# ---- the reference solution (for tests and teachers) -------------------------------------
def reference_solution(lesson: Lesson) -> str:
    """The exercise file with each stub replaced by the engine's own code: a known-good answer."""
    source = lesson.exercise.read_text(encoding="utf-8")
    lines = source.splitlines(keepends=True)
    spans = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name in lesson.targets:
            start = (node.decorator_list[0].lineno if node.decorator_list else node.lineno) - 1
            spans[node.name] = (start, node.end_lineno)
    for name, (start, end) in sorted(spans.items(), key=lambda kv: -kv[1][0]):
        engine_fn = original(lesson.targets[name])
        code = textwrap.dedent(inspect.getsource(engine_fn))
        code = re.sub(rf"^def {re.escape(engine_fn.__name__)}\(", f"def {name}(", code, count=1, flags=re.M)
        lines[start:end] = [code]
    return "".join(lines)


def shorten(path: Path) -> str:
    """A path relative to the current folder when it is inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def exit_code(results: list[CheckResult]) -> int:
    return 0 if results and all(r.passed for r in results) else 1
