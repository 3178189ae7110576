"""`nanoengine trace --out PATH` never destroys what is at PATH: a pipe, a device or a folder is
refused before anything runs, a symlink's target is written (the link stays), and two runs
writing one PATH each record into a file of their own, so the last to finish wins whole."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import HANG_S, one_line_error

from tracer.cli.main import main
from tracer.trace.invariants import check_trace
from tracer.trace.trace_file import load_trace

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TINY = ["--model", "tiny", "--max-tokens", "4", "--ignore-eos", "--num-kv-blocks", "32", "--no-tui"]
CLI = [sys.executable, "-m", "tracer.cli.main"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def test_a_fifo_at_out_is_refused_and_left_a_fifo(tmp_path, capsys):
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    assert main(["trace", "hello", *TINY, "--out", str(fifo)]) == 2
    assert "named pipe" in one_line_error(capsys.readouterr().err)
    assert stat.S_ISFIFO(fifo.lstat().st_mode) and sorted(tmp_path.iterdir()) == [fifo]


def test_a_device_at_out_is_refused_and_left_a_device(tmp_path, capsys):
    device = tmp_path / "null"
    try:
        os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a /dev/null of its own
    except PermissionError:
        pytest.skip("making a device node needs root")
    assert main(["trace", "hello", *TINY, "--out", str(device)]) == 2
    assert "a device, not a regular file" in one_line_error(capsys.readouterr().err)
    assert stat.S_ISCHR(device.lstat().st_mode) and sorted(tmp_path.iterdir()) == [device]


def test_a_symlink_at_out_writes_its_target_and_stays_a_link(tmp_path, capsys):
    real = tmp_path / "real" / "mine.jsonl"
    real.parent.mkdir()
    real.write_text("my earlier trace\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(real)
    assert main(["trace", "hello", *TINY, "--out", str(link)]) == 0
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert load_trace(real).num_steps > 0
    assert sorted(p.name for p in real.parent.iterdir()) == ["mine.jsonl"]
    capsys.readouterr()
    dangling = tmp_path / "dangling.jsonl"
    dangling.symlink_to(tmp_path / "real" / "new.jsonl")
    assert main(["trace", "hello", *TINY, "--out", str(dangling)]) == 0
    assert dangling.is_symlink() and load_trace(tmp_path / "real" / "new.jsonl").num_steps > 0


def test_a_symlink_to_a_fifo_is_refused(tmp_path, capsys):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "link.jsonl"
    link.symlink_to(fifo)
    assert main(["trace", "hello", *TINY, "--out", str(link)]) == 2
    assert "named pipe" in one_line_error(capsys.readouterr().err)
    assert link.is_symlink() and stat.S_ISFIFO(fifo.lstat().st_mode)


def test_the_written_trace_gets_the_usual_file_mode(tmp_path):
    out = tmp_path / "t.jsonl"
    assert main(["trace", "hello", *TINY, "--out", str(out)]) == 0
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask
    out.chmod(0o640)
    assert main(["trace", "hello", *TINY, "--out", str(out)]) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o640


def recording_lines(folder: Path) -> int:
    return sum(p.read_text().count("\n") for p in folder.glob("*.partial"))


def test_two_writers_to_one_out_never_mix(tmp_path):
    """Writer A is paused once it has recorded some steps; writer B runs to the end; then A
    finishes. The file is A's whole trace (the last to finish wins), never a mix of the two."""
    out = tmp_path / "shared.jsonl"
    long_run = ["--model", "tiny", "--max-tokens", "400", "--ignore-eos", "--num-kv-blocks", "256", "--no-tui"]
    a = subprocess.Popen(
        [*CLI, "trace", *[f"a{i}" for i in range(4)], *long_run, "--out", str(out), "--title", "A"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        deadline = time.monotonic() + HANG_S
        while a.poll() is None and recording_lines(tmp_path) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        a.send_signal(signal.SIGSTOP)
        assert a.poll() is None, "writer A finished before it could be paused"
        assert main(["trace", "b", *TINY, "--out", str(out), "--title", "B"]) == 0
        assert load_trace(out).title == "B"
    finally:
        a.send_signal(signal.SIGCONT)
    _, stderr = a.communicate(timeout=HANG_S)
    assert a.returncode == 0, stderr
    trace = load_trace(out, validate="all")
    assert trace.title == "A" and len(trace.requests) == 4 and check_trace(trace) == []
    assert not list(tmp_path.glob("*.partial"))
