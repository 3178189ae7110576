"""Run a student's code in a child process: whatever it does, the caller gets an answer.

    messages_from_child(work, first_limit) -> iterator of dicts

The process forks (the child has every module, function and engine the parent loaded: no start-up
cost) and the child calls work(send); each send(message) is a JSON line on a pipe, and the parent
yields it. In the child the address space is limited to what it maps already plus MEMORY_LIMIT_BYTES
(RLIMIT_AS: an allocation past it raises MemoryError), and it ends with os._exit once work returns,
so a thread the student's code left running cannot keep it alive.

A child must send a message at least once per limit: the first within first_limit, then within
the `limit` of the last message that carried one (plus GRACE_S). One that does not is killed.
The last message is always {"done": True} when work returned, or {"ended": why} when the child
died, exited or was killed first: a child that ends without a verdict is never a silent pass.
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

MEMORY_LIMIT_BYTES = 2 * 2**30
GRACE_S = 10.0  # after a limit, for the child's own timer to stop the code and say where it was
POLL_S = 1.0  # how often a parent waiting on a quiet child looks whether it is still there

Send = Callable[[dict], None]


@dataclass(slots=True)
class Child:
    pid: int
    status: int | None = None  # os.waitpid's status once reaped

    def poll(self) -> bool:
        """Whether the child has ended (reaping it)."""
        if self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = status
        return self.status is not None

    def end(self) -> None:
        """Kill the child if it still runs, and reap it."""
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.status = os.waitpid(self.pid, 0)[1]


def messages_from_child(work: Callable[[Send], None], first_limit: float) -> Iterator[dict]:
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # else the child would print again what the parent had buffered
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        run_child(work, write_fd)
    os.close(write_fd)
    child = Child(pid)
    try:
        yield from read_messages(child, read_fd, first_limit)
    finally:
        os.close(read_fd)
        child.end()


def run_child(work: Callable[[Send], None], fd: int) -> None:
    """The child's whole life: limit memory, work, say done, exit without waiting on any thread."""
    code = 0
    pipe = os.fdopen(fd, "w", encoding="utf-8")

    def send(message: dict) -> None:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # the student's prints come out before the verdict they belong to
        pipe.write(json.dumps(message, allow_nan=False) + "\n")
        pipe.flush()

    try:
        limit_memory()
        work(send)
        send({"done": True})
    except BaseException as e:  # noqa: B036 - the child must reach os._exit whatever happened
        code = 1
        try:
            send({"ended": f"the checks failed inside nanoengine ({type(e).__name__}: {e})"})
        except BaseException:  # noqa: B036
            pass
    finally:
        os._exit(code)


def limit_memory() -> None:
    """RLIMIT_AS: what the process maps now (torch, the model) plus MEMORY_LIMIT_BYTES."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return  # no /proc: no limit rather than a wrong one
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = mapped + MEMORY_LIMIT_BYTES
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    if soft == resource.RLIM_INFINITY or soft > limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def read_messages(child: Child, fd: int, first_limit: float) -> Iterator[dict]:
    deadline, limit, buffer = time.monotonic() + first_limit + GRACE_S, first_limit, b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            child.end()
            yield {"ended": f"it did not finish within {limit:g} s and was stopped", "timed_out": True}
            return
        if not select.select([fd], [], [], min(left, POLL_S))[0]:
            if child.poll():  # ended, and something it started still holds the pipe open
                yield {"ended": how_it_ended(child.status)}
                return
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            child.end()
            yield {"ended": how_it_ended(child.status)}
            return
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            message = json.loads(line)
            if "limit" in message:
                limit = message["limit"]
                deadline = time.monotonic() + limit + GRACE_S
            yield message
            if message.get("done") or "ended" in message:
                return


def how_it_ended(status: int | None) -> str:
    if status is None:
        return "it stopped answering"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.Signals.__members__.values() else f"signal {sig}"
        if sig == signal.SIGKILL:
            return "it was killed (SIGKILL), most often because the machine ran out of memory"
        return f"it crashed ({name})"
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else status
    return (
        f"it exited (status {code}) without a verdict: your code ended the process (os._exit, or a library's "
        f"exit); an exercise function must return its result"
    )
