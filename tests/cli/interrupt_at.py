"""Run the `nanoengine` command in a child that stops at a named point until Ctrl-C (SIGINT) comes.

    python interrupt_at.py FD POINT ARGV...

POINT is `import:MODULE` (the first import of MODULE) or `call:MODULE:QUALNAME:N` (the N-th call).
At the point the child writes POINT and a newline to file descriptor FD and waits there, so a test
that reads that line and then sends SIGINT (or SIGTERM) interrupts exactly that point, however busy the machine:
the signal is never sent at a guessed moment. Use `interrupted_at` from a test.
"""

from __future__ import annotations

import functools
import importlib
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

WAIT_S = 600  # a child that is never interrupted gives up, so a broken test cannot hang the suite


def announce_and_wait(fd: int, point: str) -> None:
    os.write(fd, f"{point}\n".encode())
    os.close(fd)
    time.sleep(WAIT_S)  # SIGINT raises KeyboardInterrupt here
    raise SystemExit(f"interrupt_at: nobody interrupted {point}")


class PauseOnImport:
    """A meta-path finder that pauses when `module` is first imported."""

    def __init__(self, module: str, fd: int, point: str):
        self.module, self.fd, self.point = module, fd, point

    def find_spec(self, name, path=None, target=None):
        if name == self.module:
            sys.meta_path.remove(self)
            announce_and_wait(self.fd, self.point)
        return None


def pause_on_call(module: str, qualname: str, n: int, fd: int, point: str) -> None:
    owner_name, _, attr = qualname.rpartition(".")
    owner = importlib.import_module(module)
    for part in filter(None, owner_name.split(".")):
        owner = getattr(owner, part)
    real = getattr(owner, attr)
    calls = 0

    @functools.wraps(real)
    def counted(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == n:
            announce_and_wait(fd, point)
        return real(*args, **kwargs)

    setattr(owner, attr, counted)


def install(fd: int, point: str) -> None:
    kind, _, where = point.partition(":")
    if kind == "import":
        sys.meta_path.insert(0, PauseOnImport(where, fd, point))
    elif kind == "call":
        module, qualname, n = where.split(":")
        pause_on_call(module, qualname, int(n), fd, point)
    else:
        raise SystemExit(f"interrupt_at: unknown point {point!r}")


def interrupted_at(point: str, argv: list[str], env: dict[str, str], timeout: float = 600, sig: int = signal.SIGINT):
    """Run `nanoengine ARGV`, send sig (Ctrl-C's SIGINT, or kill's SIGTERM) once it stands at point;
    the finished CompletedProcess."""
    from conftest import sigint_as_in_a_terminal

    read_fd, write_fd = os.pipe()
    child = subprocess.Popen(
        [sys.executable, str(Path(__file__)), str(write_fd), point, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        pass_fds=[write_fd],
        preexec_fn=sigint_as_in_a_terminal,
    )
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as announced:
        ready, _, _ = select.select([announced], [], [], timeout)  # a safety net, not a guess
        line = announced.readline().decode().strip() if ready else ""  # "": ended before the point
    if not ready:
        child.kill()
    if line == point:
        child.send_signal(sig)
    stdout, stderr = child.communicate(timeout=timeout)
    assert line == point, f"the child never reached {point}: exit {child.returncode}\n{stderr}"
    return subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)


if __name__ == "__main__":
    install(int(sys.argv[1]), sys.argv[2])
    from tracer.cli.main import main

    sys.exit(main(sys.argv[3:]))
