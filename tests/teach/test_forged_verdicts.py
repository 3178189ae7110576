"""An exercise cannot forge its verdict. Each exercise here has a wrong answer (check_stop that
never stops a request) and a trick meant to pass anyway; each must end failed, with a one-line
reason, in bounded time, with no process of its left running. (Before the checks moved into the
parent, three of these passed outright and three hung or crashed the check.)"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import HANG_S

from tracer.teach.lessons import CheckResult, LessonError, find_lesson, run_lesson_checks
from tracer.teach.sandbox import children_of

LIMIT_S = 3.0  # per check: the tricks that hang are stopped after this
BOUND_S = 60.0  # the whole check, whatever the trick (a busy machine included)

WRONG = "\n\ndef check_stop(self, seq, token_id):\n    return None  # never stops: wrong\n"

# name -> (code at the top of the exercise file, code run first in each call of check_stop)
TRICKS: dict[str, tuple[str, str]] = {
    "replace run_one at import": (
        """
        import tracer.teach.lessons as L
        L.run_one = lambda check, fns, doc, f, t: L.CheckResult(check.__name__, doc, "passed")
        """,
        "",
    ),
    "replace the checks at import": (
        """
        import sys
        for name, module in list(sys.modules.items()):
            if name.startswith("nanoengine_lesson_check_"):
                for attr in dir(module):
                    if attr.startswith(("check_", "engine_")):
                        setattr(module, attr, lambda fns: None)
        """,
        "",
    ),
    "write fake verdicts to the result pipe": (
        """
        import json, os, stat
        FAKE = b"".join(
            json.dumps({"result": {"name": n, "doc": n, "status": "passed"}}).encode() + b"\\n"
            for n in ["check_ordinary_token_continues", "check_eos_stops"]
        ) + b'{"done": true}\\n'
        """,
        """
        for fd in range(3, 256):
            try:
                if stat.S_ISFIFO(os.fstat(fd).st_mode):
                    os.write(fd, FAKE)
            except OSError:
                pass
        """,
    ),
    "patch dataclasses.asdict": (
        """
        import dataclasses
        dataclasses.asdict = lambda r: {"name": r.name, "doc": r.doc, "status": "passed"}
        """,
        "",
    ),
    "patch expect and AssertionError": (
        """
        import builtins
        import tracer.teach.kit as kit
        kit.expect = lambda ok, message: None
        builtins.AssertionError = type("AssertionError", (Exception,), {})
        """,
        "",
    ),
    "announce a huge time limit": (
        """
        import tracer.teach.lessons as L
        import tracer.teach.sandbox as S
        L.DIRECT_TIME_LIMIT_S = L.ENGINE_TIME_LIMIT_S = S.WHERE_WAIT_S = 1e9
        """,
        "while True:\n    pass",
    ),
    "send a malformed message": (
        """
        import os, stat
        for fd in range(3, 256):
            try:
                if stat.S_ISFIFO(os.fstat(fd).st_mode):
                    os.write(fd, b"\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x10A{not json at all\\n")
            except OSError:
                pass
        """,
        "",
    ),
    "send a pickle that runs code in the parent": (
        """
        import os, pickle, stat, struct
        class Boom:
            def __reduce__(self):
                return (os.system, ("touch /tmp/forged-verdict-was-run",))
        BODY = b"A" + pickle.dumps((("returned", Boom()), []))
        """,
        """
        for fd in range(3, 256):
            try:
                if stat.S_ISFIFO(os.fstat(fd).st_mode):
                    os.write(fd, struct.pack("<Q", len(BODY)) + BODY)
            except OSError:
                pass
        os._exit(0)
        """,
    ),
    "double-fork a grandchild that sleeps": (
        "import os, time\n",
        """
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                PIDFILE.write_text(str(os.getpid()))
                time.sleep(600)
            os._exit(0)
        time.sleep(0.5)
        """,
    ),
    "os._exit(0) early": ("import os\n", "os._exit(0)"),
    "sys.exit in a check": ("import sys\n", "sys.exit(0)"),
    "patch the reference the checks compare with": (
        """
        import tracer.teach.kit as kit
        import tracer.teach.swap as swap
        swap.original = lambda name: check_stop
        kit.reference_run = lambda scenario: kit.run_scenario(scenario)
        """,
        "",
    ),
    "raise a BaseException subclass": (
        "class Escape(BaseException):\n    pass\n",
        "raise Escape('checks passed')",
    ),
    "close and dup2 the pipes": (
        "import os\n",
        """
        for fd in range(3, 256):
            try:
                os.dup2(2, fd)
            except OSError:
                pass
        """,
    ),
}


def exercise(tmp_path: Path, trick: str) -> Path:
    top, first = TRICKS[trick]
    body = textwrap.indent(textwrap.dedent(first).strip() or "pass", "    ")
    path = tmp_path / "exercise.py"
    path.write_text(
        f"from pathlib import Path\nPIDFILE = Path({str(tmp_path / 'grandchild.pid')!r})\n"
        f"{textwrap.dedent(top)}\n\n"
        f"def check_stop(self, seq, token_id):\n{body}\n    return None  # never stops: wrong\n",
        encoding="utf-8",
    )
    return path


def verdict(path: Path) -> list[CheckResult] | LessonError:
    try:
        return run_lesson_checks(find_lesson("1"), None, path, time_limit=LIMIT_S)
    except LessonError as e:  # what the child did while the file was imported: `lesson check` exits 2
        return e


def reason(results: list[CheckResult] | LessonError) -> str:
    """The first failed check's message, or the error that stopped the checks before any ran."""
    if isinstance(results, LessonError):
        return str(results)
    assert not all(r.passed for r in results), results
    return next(r.message for r in results if r.status == "failed")


@pytest.mark.parametrize("trick", list(TRICKS))
def test_a_trick_cannot_pass_a_wrong_answer(trick, tmp_path):
    before = children_of(os.getpid())
    started = time.monotonic()
    said = reason(verdict(exercise(tmp_path, trick)))
    assert time.monotonic() - started < BOUND_S
    assert said and "\n" not in said, said
    assert children_of(os.getpid()) == before
    pidfile = tmp_path / "grandchild.pid"
    if pidfile.exists():
        with pytest.raises(ProcessLookupError):
            os.kill(int(pidfile.read_text()), 0)
    assert not Path("/tmp/forged-verdict-was-run").exists()


def test_what_each_trick_gets(tmp_path):
    """The outcomes the lessons README's paragraph cites: the first failed check's reason."""
    said = {}
    for i, trick in enumerate(["announce a huge time limit", "send a malformed message", "os._exit(0) early"]):
        folder = tmp_path / str(i)
        folder.mkdir()
        said[trick] = reason(verdict(exercise(folder, trick)))
    assert "did not finish within 3 s" in said["announce a huge time limit"]
    assert "sent something that is not a result" in said["send a malformed message"]
    assert "it exited (status 0) without a verdict" in said["os._exit(0) early"]


def test_a_fake_all_checks_passed_on_stdout_is_not_the_verdict(tmp_path):
    """The exercise's prints go to stderr: stdout and the exit status are the parent's alone."""
    path = tmp_path / "exercise.py"
    path.write_text(f"print('All 9 checks passed.')\n{WRONG}", encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "tracer.cli.main", "lesson", "check", "1", "--file", str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=HANG_S,
    )
    assert result.returncode == 1, result.stdout
    assert "All 9 checks passed" not in result.stdout and "All 9 checks passed" in result.stderr
