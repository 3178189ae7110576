"""Lesson checks run in a child process: an exercise that leaves a thread running, ends the
process, or allocates without bound gets a verdict that names what happened, and never hangs
or passes `lesson check`. Also: a lessons folder that is a file gets one line."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import HANG_S

from tracer.cli.main import main
from tracer.teach.lessons import find_lesson, reference_solution, run_lesson_checks, student_functions


def test_lessons_dir_that_is_a_file_gets_one_line_that_says_what_to_do(tmp_path, monkeypatch, capsys):
    taken = tmp_path / "notes"
    taken.write_text("not a folder\n")
    monkeypatch.setenv("NANOENGINE_LESSONS_DIR", str(taken))
    assert main(["lesson", "start"]) == 2
    captured = capsys.readouterr()
    said = " ".join((captured.out + captured.err).split())
    assert "is a file, not a folder" in said and "NANOENGINE_LESSONS_DIR" in said, said
    assert "Errno" not in said and "Traceback" not in said
    assert taken.read_text() == "not a folder\n"
    monkeypatch.setenv("NANOENGINE_LESSONS_DIR", str(taken / "inside"))
    assert main(["lesson", "start"]) == 2
    said = " ".join(capsys.readouterr().out.split())
    assert "cannot make the lessons folder" in said and "Errno" not in said, said


# ---- the child process -------------------------------------------------------------------
LESSON_1 = "01_request_life"
CLI = [sys.executable, "-m", "tracer.cli.main"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def answer_that(tmp_path: Path, first: str, imports: str = "") -> Path:
    """Lesson 1's right answer, whose check_stop does `first` (indented code) before answering."""
    path = tmp_path / "exercise.py"
    body = textwrap.indent(textwrap.dedent(first), "    ")
    path.write_text(
        f"{reference_solution(find_lesson(LESSON_1))}\n\n{imports}\n_right = check_stop\n\n\n"
        f"def check_stop(self, seq, token_id):\n{body}\n    return _right(self, seq, token_id)\n",
        encoding="utf-8",
    )
    return path


def lesson_check(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, "lesson", "check", "1", "--file", str(path)], capture_output=True, text=True, env=ENV, timeout=HANG_S
    )


def test_a_right_answer_that_leaves_a_thread_running_passes_and_returns(tmp_path):
    path = answer_that(
        tmp_path,
        """
        if not STARTED:
            STARTED.append(threading.Thread(target=threading.Event().wait))  # never ends, not a daemon
            STARTED[0].start()
        """,
        imports="import threading\n\nSTARTED = []\n",
    )
    result = lesson_check(path)
    assert result.returncode == 0 and "All 9 checks passed" in result.stdout, result.stdout + result.stderr


def test_os_exit_in_an_exercise_is_a_failure_that_says_so(tmp_path):
    result = lesson_check(answer_that(tmp_path, "os._exit(0)", imports="import os\n"))
    said = " ".join(result.stdout.split())
    assert result.returncode == 1, said
    assert "gave no verdict: it exited (status 0) without a verdict" in said and "os._exit" in said
    assert "the checks stopped at" in said and "checks passed" in said


def test_os_exit_while_the_file_is_imported_is_an_error_not_a_pass(tmp_path):
    path = tmp_path / "exercise.py"
    path.write_text("import os\n\nos._exit(0)\n", encoding="utf-8")
    result = lesson_check(path)
    said = " ".join(result.stdout.split())
    assert result.returncode == 2 and "while importing it, it exited (status 0)" in said, said


def test_a_check_that_blocks_the_time_limit_is_still_stopped(tmp_path):
    path = answer_that(
        tmp_path,
        """
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        while True:
            pass
        """,
        imports="import signal\n",
    )
    result = lesson_check(path)
    said = " ".join(result.stdout.split())
    assert result.returncode == 1, said
    assert "did not finish within 10 s and was stopped" in said and "the checks stopped at" in said


def test_an_exercise_cannot_allocate_without_bound(tmp_path):
    """3 GiB more than the engine's own memory: refused with MemoryError in the child (the
    allocation is never touched, so without the limit it would succeed at no cost)."""
    lesson = find_lesson(LESSON_1)
    path = answer_that(tmp_path, "HOARD.append(bytearray(3 * 2**30))", imports="HOARD = []\n")
    results = run_lesson_checks(lesson, student_functions(lesson, path), path)
    assert results[0].status == "failed", results[0]
    assert "ran out of memory" in results[0].message and "MemoryError" in results[0].message
    assert "GB" in results[0].message


def test_a_crash_names_the_signal(tmp_path):
    lesson = find_lesson(LESSON_1)
    path = answer_that(tmp_path, "os.kill(os.getpid(), signal.SIGSEGV)", imports="import os\nimport signal\n")
    results = run_lesson_checks(lesson, student_functions(lesson, path), path)
    assert results[0].status == "failed" and "it crashed (SIGSEGV)" in results[0].message, results[0]
    assert all(r.status == "skipped" for r in results[1:])


def test_lesson_trace_runs_the_exercise_under_the_same_memory_limit(tmp_path):
    """`lesson trace` records in a limited child: 3 GiB more is refused there (MemoryError), and the
    student is told so in one line, instead of the machine swapping until the OOM killer comes."""
    path = answer_that(tmp_path, "HOARD.append(bytearray(3 * 2**30))", imports="HOARD = []\n")
    out = tmp_path / "trace.jsonl"
    result = subprocess.run(
        [*CLI, "lesson", "trace", "1", "--file", str(path), "--no-tui", "--out", str(out)],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=HANG_S,
    )
    said = " ".join(result.stdout.split())
    assert result.returncode == 1 and "the run stopped: your code raised MemoryError" in said, said
