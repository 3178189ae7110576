"""The package layout's rules: imports point one way (engine <- i18n, kernels <- trace <- loop <- replay, serve <-
teach/bench/export <- vllm <- cli), the engine is a library (no tracer, textual or argparse), and it stays within its
size budget (the inference core 1,500 code lines, all of nanoengine/ 2,100, lines of at most 100 characters)."""

from __future__ import annotations

import ast
import io
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Each package's level: a module may import its own package and lower levels only.
LEVELS = {
    "nanoengine": 0,
    "tracer.i18n": 0.5,  # the language a learner reads: every tracer package may translate
    "tracer.kernels": 0.5,  # compiled kernels the tools plug into the engine (C, built at first use)
    "tracer.trace": 1,
    "tracer.loop": 2,  # the live engine loop: a thread, a command queue, per-request callbacks
    "tracer.replay": 3,
    "tracer.serve": 3,  # the OpenAI-compatible HTTP server on the loop
    "tracer.live": 4,  # the replay on a running engine or a growing file: above loop and replay
    "tracer.teach": 4,
    "tracer.bench": 4,
    "tracer.export": 4,
    "tracer.vllm": 5,  # runs nanoengine's scenarios (teach) and diffs traces for the cli
    "tracer.cli": 6,
}
# code lines (not blank, not a comment, not part of a docstring) of the inference core: every module
# of nanoengine/ but loading/ (checkpoints, tokenizers, the tiny model, model building)
ENGINE_BUDGET = 1500
PACKAGE_BUDGET = 2100  # all of nanoengine/, loading/ too
ENGINE_LINE_LENGTH = 100  # as nanoengine/ruff.toml tells ruff
NOT_CODE = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}


def package_of(module: str) -> str | None:
    for package in sorted(LEVELS, key=len, reverse=True):
        if module == package or module.startswith(package + "."):
            return package
    return None


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import in the file, including those inside functions."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def python_files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def test_every_tracer_module_belongs_to_a_package():
    loose = [p.name for p in (ROOT / "tracer").glob("*.py") if p.name != "__init__.py"]
    assert not loose, f"tracer/ top level holds {loose}: put each in the subpackage of its concern"
    for path in python_files("nanoengine", "tracer"):
        if path.name != "__init__.py" or path.parent != ROOT / "tracer":
            assert package_of(module_name(path)), f"{path.relative_to(ROOT)} is in no known package"


def test_imports_point_one_way():
    wrong = []
    for path in python_files("nanoengine", "tracer"):
        own = package_of(module_name(path))
        if own is None:
            continue
        for line, module in imported_modules(path):
            target = package_of(module)
            if target is None or target == own:
                continue
            if LEVELS[target] >= LEVELS[own]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} ({own}) imports {module} ({target})")
    assert not wrong, "imports pointing up or sideways:\n" + "\n".join(wrong)


def test_engine_is_a_library():
    for path in python_files("nanoengine"):
        for line, module in imported_modules(path):
            top = module.split(".")[0]
            assert top not in ("tracer", "textual", "argparse"), f"{path.relative_to(ROOT)}:{line} imports {module}"


def test_importing_the_engine_loads_no_tracer_and_no_textual():
    code = (
        "import sys, nanoengine; bad = sorted(m for m in sys.modules if m.split('.')[0] in ('tracer', 'textual'));"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == ""


def docstring_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                lines.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return lines


def code_lines(source: str) -> int:
    """Lines holding code: every line a token other than a comment spans, less docstring lines."""
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in NOT_CODE and token.string:
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstring_lines(ast.parse(source)))


def test_code_lines_count_code_but_not_docstrings_comments_or_blank_lines():
    source = '''"""Module docstring,
on two lines."""

# a comment
X = """a string that is not a docstring
spans two lines"""


def f(a):  # a comment after code
    """Docstring."""
    return (
        a
    )
'''
    assert code_lines(source) == 6  # X (2), def, return (, a, )


def test_engine_stays_within_its_line_budget():
    counts = {p: code_lines(p.read_text(encoding="utf-8")) for p in python_files("nanoengine")}
    core = sum(n for p, n in counts.items() if "loading" not in p.relative_to(ROOT).parts)
    assert core <= ENGINE_BUDGET, f"the inference core has {core} code lines; the budget is {ENGINE_BUDGET}"
    total = sum(counts.values())
    assert total <= PACKAGE_BUDGET, f"nanoengine/ has {total} code lines; the budget is {PACKAGE_BUDGET}"
    assert any("loading" in p.parts for p in counts), "the loading code moved: update the budget's split"


def test_engine_lines_fit_in_100_characters():
    long = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in python_files("nanoengine")
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if len(line) > ENGINE_LINE_LENGTH
    ]
    assert not long, f"lines over {ENGINE_LINE_LENGTH} characters in nanoengine/: {long[:5]}"


def test_tests_mirror_the_packages():
    for package in (
        "engine",
        "trace",
        "loop",
        "replay",
        "live",
        "serve",
        "teach",
        "bench",
        "cli",
        "vllm",
        "i18n",
    ):
        assert list((ROOT / "tests" / package).glob("test_*.py")), f"tests/{package}/ has no tests"


def test_test_modules_have_unique_names():
    """tests/ has no __init__.py: pytest imports each test file by its bare name, so two files named
    alike (tests/a/test_x.py, tests/b/test_x.py) stop the whole run at collection."""
    seen: dict[str, Path] = {}
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if "__snapshots__" in path.parts:
            continue
        assert path.name not in seen, f"{path.relative_to(ROOT)} and {seen[path.name].relative_to(ROOT)}"
        seen[path.name] = path
