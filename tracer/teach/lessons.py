"""Find lessons, load a student's exercise file, and run a lesson's checks against it.

A lesson is a folder lessons/NN_name/ with README.md, exercise.py (stubs), hint.md,
scenario.json and check.py. check.py declares

    TARGETS = {"check_stop": "Scheduler.check_stop"}   # exercise function -> engine target
    def check_xxx(fns): ...     # direct checks: call fns.<exercise function> and assert
    def engine_xxx(fns): ...    # engine checks: run the real engine with fns plugged in

Every check runs with the student's functions plugged into the engine. Direct checks run
first, in file order; the engine checks only when all direct checks pass (a broken function
inside the engine gives confusing failures). A check fails by raising AssertionError with a
message written for the student.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import inspect
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
from tracer.teach.plugins import TARGETS as ENGINE_TARGETS
from tracer.teach.plugins import original, plugged, replacements_for
from tracer.teach.scenarios import Scenario, ScenarioError, ScenarioRun, StepSummary, load_scenario, run_scenario
from tracer.trace.invariants import short

CHECK_TIME_LIMIT_S = 120


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
        for line in self.readme.read_text(encoding="utf-8").splitlines():
            if line.startswith("# "):
                return line[2:].strip()
        return self.name

    @property
    def readme(self) -> Path:
        return self.path / "README.md"

    @property
    def hint(self) -> Path:
        return self.path / "hint.md"

    @property
    def exercise(self) -> Path:
        return self.path / "exercise.py"

    @property
    def scenario_file(self) -> Path:
        return self.path / "scenario.json"

    def checks_module(self) -> ModuleType:
        return load_module(self.path / "check.py", f"nanoengine_lesson_check_{self.name}")

    @property
    def targets(self) -> dict[str, str]:
        return dict(self.checks_module().TARGETS)


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
            f"no lessons found in {root or lessons_root()}: the lessons ship with the source "
            f"checkout (install it with `pip install -e .` from the repository)"
        )
    key = str(key).strip()
    for lesson in lessons:
        if (key.isdigit() and int(key) == lesson.number) or key in (lesson.name, lesson.name.split("_", 1)[1]):
            return lesson
    names = ", ".join(f"{l.number} ({l.name.split('_', 1)[1]})" for l in lessons)
    raise LessonError(f"no lesson {key!r}; choose one of: {names}")


# ---- loading the student's file -------------------------------------------------------------
def load_module(path: Path, module_name: str) -> ModuleType:
    """Import a file by path; a syntax or import error becomes a one-line LessonError."""
    if not path.is_file():
        raise LessonError(f"{path} does not exist")
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise LessonError(f"{path} cannot be imported as Python (name it *.py)")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise LessonError(f"{path} line {e.lineno}: syntax error: {e.msg}; fix it and run the check again") from None
    except Exception as e:  # the student's module-level code: report it, never a traceback
        raise LessonError(f"{path} failed to import: {describe_exception(e, path)}") from None
    return module


def student_functions(lesson: Lesson, path: Path) -> dict[str, Callable]:
    module = load_module(path, f"nanoengine_student_{lesson.name}")
    functions = {}
    for name in lesson.targets:
        fn = getattr(module, name, None)
        if not callable(fn):
            raise LessonError(f"{path} must define a function named {name}(...); it is missing or renamed")
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
            f"{path}: {fn.__name__} must take ({', '.join(expected)}) like the stub; yours takes ({', '.join(params)})"
        )


def reference_functions(lesson: Lesson) -> dict[str, Callable]:
    return {name: original(target) for name, target in lesson.targets.items()}


def describe_exception(e: BaseException, student_file: Path | None = None) -> str:
    """'ValueError: bad thing (exercise.py line 12, in check_stop)': the student's own frame if any."""
    where = ""
    frames = traceback.extract_tb(e.__traceback__)
    if student_file is not None:
        mine = [f for f in frames if Path(f.filename).resolve() == student_file.resolve()]
        if mine:
            f = mine[-1]
            where = f" ({student_file.name} line {f.lineno}, in {f.name}: {f.line.strip() if f.line else ''})"
    elif frames:
        f = frames[-1]
        where = f" ({Path(f.filename).name} line {f.lineno}, in {f.name})"
    return f"{type(e).__name__}: {e}{where}"


# ---- running checks ------------------------------------------------------------------------
@dataclass(slots=True)
class CheckResult:
    name: str  # the check function's name, e.g. check_eos_stops
    doc: str  # its first docstring line: what it checks
    status: str  # passed / failed / skipped / stub
    message: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "passed"


class CheckTimeout(Exception):
    pass


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Interrupt a check that runs too long (an endless loop in a student's function).

    Uses SIGALRM, so it only works on the main thread of a Unix process; elsewhere it is a no-op.
    """
    usable = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def expire(signum, frame):
        raise CheckTimeout(f"it ran for more than {seconds:.0f} s")

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
    functions: dict[str, Callable],
    student_file: Path | None = None,
    time_limit: float = CHECK_TIME_LIMIT_S,
    on_result: Callable[[CheckResult], None] | None = None,
) -> list[CheckResult]:
    module = lesson.checks_module()
    direct, engine = list_checks(module)
    fns = SimpleNamespace(**functions)
    results: list[CheckResult] = []
    blocked = ""

    def add(result: CheckResult) -> None:
        results.append(result)
        if on_result:
            on_result(result)

    with plugged(replacements_for(module.TARGETS, functions)):
        for check in direct + engine:
            doc = first_line(check.__doc__) or check.__name__
            if not blocked and check in engine and any(not r.passed for r in results):
                blocked = "fix the checks above first: the engine runs your code only once they pass"
            if blocked:
                add(CheckResult(check.__name__, doc, "skipped", blocked))
                continue
            result = run_one(check, fns, doc, student_file, time_limit)
            if result.status == "stub":
                blocked = "your function is still the stub"
            add(result)
    return results


def run_one(
    check: Callable, fns: SimpleNamespace, doc: str, student_file: Path | None, time_limit: float
) -> CheckResult:
    try:
        with deadline(time_limit):
            check(fns)
    except NotImplementedError as e:
        where = f" in {student_file}" if student_file else ""
        stub_fn = stub_name(e)
        what = f"{stub_fn}() is" if stub_fn else "an exercise function is"
        return CheckResult(
            check.__name__,
            doc,
            "stub",
            f"{what} still the stub (it raises NotImplementedError): replace the TODO{where} "
            f"with your code, then run the check again",
        )
    except AssertionError as e:
        return CheckResult(check.__name__, doc, "failed", str(e) or "the check failed")
    except CheckTimeout as e:
        return CheckResult(
            check.__name__, doc, "failed", f"your code did not finish: {e}. Look for a loop that never ends."
        )
    except Exception as e:
        return CheckResult(check.__name__, doc, "failed", f"your code raised {describe_exception(e, student_file)}")
    return CheckResult(check.__name__, doc, "passed")


def stub_name(e: NotImplementedError) -> str | None:
    frames = traceback.extract_tb(e.__traceback__)
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


# ---- helpers for check.py ---------------------------------------------------------------
def expect(ok: bool, message: str) -> None:
    if not ok:
        raise AssertionError(message)


def lesson_scenario(check_file: str, **changes) -> Scenario:
    """The scenario.json next to a check.py, optionally with some top-level fields changed."""
    path = Path(check_file).parent / "scenario.json"
    scenario = load_scenario(path, name=path.parent.name)
    for key, value in changes.items():
        setattr(scenario, key, value)
    return scenario


REFERENCE_RUNS: dict[str, ScenarioRun] = {}


def reference_run(scenario: Scenario) -> ScenarioRun:
    """The scenario run with the engine's own code everywhere (cached per process)."""
    key = repr(scenario)
    if key not in REFERENCE_RUNS:
        with plugged({name: original(name) for name in ENGINE_TARGETS}):
            REFERENCE_RUNS[key] = run_scenario(scenario)
    return REFERENCE_RUNS[key]


def expect_engine_matches(
    scenario: Scenario, same_schedule: bool = True, requests: list[int] | None = None
) -> ScenarioRun:
    """Run the scenario with whatever is plugged in now; compare it with the engine's own run.

    Checks, in order: no invariant was broken, every request (or those listed in `requests`)
    generated the same tokens and finished for the same reason, and (same_schedule) every step
    scheduled the same tokens.
    """
    try:
        run = run_scenario(scenario)
    except ScenarioError as e:
        raise AssertionError(str(e)) from None
    expect_no_violations(run)
    ref = reference_run(scenario)
    for i, (mine, theirs) in enumerate(zip(run.outputs, ref.outputs)):
        if requests is not None and i not in requests:
            continue
        expect(
            mine.token_ids == theirs.token_ids,
            f"request {i} generated tokens {short(mine.token_ids)} but the engine's own code generates "
            f"{short(theirs.token_ids)} in the same run",
        )
        expect(
            mine.finish_reason == theirs.finish_reason,
            f"request {i} finished with reason {mine.finish_reason!r}, expected {theirs.finish_reason!r}",
        )
    if same_schedule:
        expect_same_schedule(run, ref)
    return run


def expect_no_violations(run: ScenarioRun) -> None:
    if run.violations:
        v = run.violations[0]
        seq = f", seq {v.seq_id}" if v.seq_id is not None else ""
        more = f" (and {len(run.violations) - 1} more)" if len(run.violations) > 1 else ""
        raise AssertionError(f"the engine broke the invariant '{v.invariant}' at step {v.step}{seq}: {v.message}{more}")


def expect_same_schedule(run: ScenarioRun, ref: ScenarioRun) -> None:
    for mine, theirs in zip(run.steps, ref.steps):
        if mine.batch != theirs.batch or sorted(mine.events) != sorted(theirs.events):
            raise AssertionError(
                f"step {mine.step} differs from the engine's own code: yours ran {describe_step(mine)}; "
                f"the engine's runs {describe_step(theirs)}"
            )
    expect(
        run.num_steps == ref.num_steps,
        f"the run took {run.num_steps} steps, the engine's own code takes {ref.num_steps}",
    )


def describe_step(step: StepSummary) -> str:
    batch = ", ".join(f"request {i}: {n} token{'s' if n != 1 else ''}" for i, n in step.batch) or "nothing"
    events = ", ".join(f"{kind} {i}" for kind, i in step.events)
    return f"[{batch}]" + (f" with events [{events}]" if events else "")


def shorten(path: Path) -> str:
    """A path relative to the current folder when it is inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def exit_code(results: list[CheckResult]) -> int:
    return 0 if results and all(r.passed for r in results) else 1
