"""Run a student's functions in a child process that can decide nothing: it only computes.

    with ExerciseProcess.start(load, plug, first_limit) as exercise:
        fns = exercise.proxies(names)        # fns.check_stop(sched, seq, 7) runs in the child
        exercise.limit_calls(seconds)        # the time the calls until the next limit_calls share (in the child)
    run_limited(work, limit) -> None | why   # a whole job (a lesson trace's recording), limited

The checks, `expect` and the engine runs that compare with the engine's own code all run in the
parent. Only a call to a student's function crosses: the parent pickles its arguments, naming the
engine objects it holds (tracer.teach.wire), the child runs the function and answers with what it
returned or raised and the new state of those objects, which the parent copies into its own, so
references between them stay the parent's. The parent parses the answer as data from a stranger:
a closed list of classes, no callables, a size cap; anything else fails the check with "the
exercise sent something that is not a result", and nothing else the child writes is read at all.
So an exercise that replaces the checks, `expect` or `asdict` at import, writes fake verdicts to
the pipe or prints "All checks passed" changes only the child's copy of the code, or nothing.

The parent owns every limit. The child runs in its own process group with its address space
limited to what it maps already plus MEMORY_LIMIT_BYTES (RLIMIT_AS: an allocation past it raises
MemoryError there), and its prints go to stderr (stdout carries only the parent's verdicts). A call
that outlives its limit is asked where it is (SIGUSR1, for the message), then the child's whole
process group is killed; so is a child that dies or sends garbage, and the checks after it are
skipped. At the end the group is killed, and (on Linux, the parent being a child subreaper for
the while) so is every process the child started that left the group (setsid, a double fork).

What 14 forging exercises get, each with a wrong answer (tests/teach/test_forged_verdicts.py):
replacing run_one, the checks, dataclasses.asdict, `expect` and AssertionError, or the reference
the checks compare with, at import: the ordinary failure (the child's copies are not the ones
that judge); fake JSON verdicts or a malformed frame on the pipe, a pickle that would run
os.system in the parent: "sent something that is not a result" (exit 2 when sent before the
file finished importing); raising the limits' constants and looping: "did not finish within
3 s"; os._exit, dup2 over the pipes: "gave no verdict: it exited"; sys.exit and a BaseException
subclass: a failure naming them; a setsid double-forked grandchild: killed at the end; printing
"All checks passed": on stderr, the exit status still 1.
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import json
import os
import resource
import select
import signal
import struct
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, SimpleNamespace
from typing import Any

from tracer.i18n import _
from tracer.teach.wire import NotAResult, Shared, read_answer, read_call, send_answer, send_call

MEMORY_LIMIT_BYTES = 2 * 2**30
POLL_S = 0.2  # how often a parent waiting on a quiet child looks whether it is still there
WHERE_WAIT_S = 2.0  # after a limit, for the child to say where the student's code was
MAX_TEXT = 2000  # characters kept of any text the child sends (an exception's message)
PR_SET_CHILD_SUBREAPER = 36

Load = Callable[[], dict[str, Callable]]
Plug = Callable[[dict[str, Callable]], AbstractContextManager]


class CheckTimeout(BaseException):
    """A check ran past its limit; a BaseException, so `except Exception` in a check cannot swallow it.
    frames: where the student's code was, when the child said so."""

    frames: list[traceback.FrameSummary] | None = None


class ExerciseGone(BaseException):
    """The child ended, was stopped, or sent something that is not a result: no more calls."""


class NotLoaded(Exception):
    """The child could not load the student's functions: it said why (for the student), or it died."""

    def __init__(self, message: str, died: bool = False) -> None:
        super().__init__(message)
        self.died = died


class ExerciseRaised(Exception):
    """The student's function raised something that is not an ordinary builtin Exception (SystemExit,
    their own class): its name, message and frames, as the child reported them."""


@dataclass(slots=True)
class Raised:
    """What the child said the student's function raised: only text and line numbers."""

    name: str
    message: str
    frames: list[traceback.FrameSummary]
    exit_code: str | None = None  # repr of SystemExit.code


def frames_of(e: BaseException) -> list[traceback.FrameSummary]:
    """The frames an exception passed through: the child's, for one raised by a student's function."""
    raised = getattr(e, "raised", None)
    if isinstance(raised, Raised):
        return raised.frames
    return list(traceback.extract_tb(e.__traceback__))


# ---- the parent's side ------------------------------------------------------------------------
@dataclass(slots=True)
class ExerciseProcess:
    pid: int
    requests: int  # fd: calls to the child
    answers: int  # fd: answers from it
    adopted_before: set[int]
    status: int | None = None  # os.waitpid's status once reaped
    gone: str = ""  # why no call can be made any more
    deadline: float = float("inf")
    limit: float = 0.0
    left: float = float("inf")  # of limit: only time inside calls counts, not the parent's own work
    codes: list[CodeType] = field(default_factory=list)

    @classmethod
    @contextlib.contextmanager
    def start(cls, load: Load, plug: Plug, first_limit: float) -> Iterator[ExerciseProcess]:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # else the child would print again what the parent had buffered
        adopted_before = children_of(os.getpid())
        become_subreaper(True)
        to_child, from_parent = os.pipe()[::-1]
        from_child, to_parent = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(to_child)
            os.close(from_child)
            serve(load, plug, from_parent, to_parent)
        os.close(from_parent)
        os.close(to_parent)
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)  # the child does it too: whichever runs first
        exercise = cls(pid, to_child, from_child, adopted_before)
        try:
            exercise.wait_ready(first_limit)
            yield exercise
        finally:
            exercise.close()

    def wait_ready(self, limit: float) -> None:
        self.limit_calls(limit)
        try:
            tag, body = self.read_frame()
        except CheckTimeout:
            self.end("")
            raise NotLoaded(stopped_after(limit), died=True) from None
        except ExerciseGone as e:
            raise NotLoaded(str(e), died=True) from None
        except NotAResult as e:
            self.end("")
            raise NotLoaded(not_a_result(f" ({str(e)[:200]})"), died=True) from None
        message = parse_json(body) if tag == b"R" else None
        if not isinstance(message, dict) or not ("ready" in message or isinstance(message.get("error"), str)):
            self.end(not_a_result())
            raise NotLoaded(not_a_result(), died=True)
        if "error" in message:
            raise NotLoaded(message["error"][:MAX_TEXT])

    def limit_calls(self, seconds: float) -> None:
        self.limit, self.left, self.deadline = seconds, seconds, time.monotonic() + seconds

    def proxies(self, names: list[str]) -> SimpleNamespace:
        return SimpleNamespace(**{name: self.proxy(name) for name in names})

    def proxy(self, name: str) -> Callable:
        def call_in_child(*args: Any, **kwargs: Any) -> Any:
            return self.call(name, args, kwargs)

        call_in_child.__name__ = call_in_child.__qualname__ = name
        return call_in_child

    def call(self, name: str, args: tuple, kwargs: dict) -> Any:
        if self.gone:
            raise ExerciseGone(self.gone)
        shared = Shared.of(args, kwargs)
        self.codes.clear()
        try:
            payload = send_call(args, kwargs, shared, self.codes)
            # The clock runs while the child works: a busy parent (building the check's objects)
            # does not eat the student's time.
            self.deadline = time.monotonic() + self.left
            self.write_frame(name.encode() + b"\0" + payload)
            tag, body = self.read_frame()
            self.left = max(0.0, self.deadline - time.monotonic())
            if tag != b"A":
                raise NotAResult("it is not an answer")
            outcome = read_answer(body, shared.objects, self.codes)
        except CheckTimeout as e:
            e.frames = self.locate()
            self.end(_("it was stopped after {limit:g} s").format(limit=self.limit))
            raise
        except NotAResult as e:
            self.end(f"the exercise sent something that is not a result ({str(e)[:200]})")
            raise ExerciseGone(self.gone) from None
        return unpack(outcome, name)

    def write_frame(self, body: bytes) -> None:
        try:
            os.write(self.requests, struct.pack("<Q", len(body)))
            view = memoryview(body)
            while view:
                view = view[os.write(self.requests, view[: 1 << 20]) :]
        except OSError:  # the child closed its end: it ended
            self.end(how_it_ended(self.reap(wait=True)))
            raise ExerciseGone(self.gone) from None

    def read_frame(self) -> tuple[bytes, bytes]:
        header = self.read_exactly(8)
        (size,) = struct.unpack("<Q", header)
        if size < 1 or size > 1 + 64 * 2**20:
            raise NotAResult(f"a frame of {size} bytes")
        body = self.read_exactly(size)
        return body[:1], body[1:]

    def read_exactly(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise CheckTimeout(f"{self.limit:g} s")
            if not select.select([self.answers], [], [], min(left, POLL_S))[0]:
                if self.reap(wait=False) is not None:  # ended; something it started holds the pipe
                    self.end(how_it_ended(self.status))
                    raise ExerciseGone(self.gone)
                continue
            chunk = os.read(self.answers, min(size - len(data), 1 << 20))
            if not chunk:
                self.end(how_it_ended(self.reap(wait=True)))
                raise ExerciseGone(self.gone)
            data += chunk
        return data

    def locate(self) -> list[traceback.FrameSummary] | None:
        """Ask the child where the student's code is (a SIGUSR1 it may have blocked: then None)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGUSR1)
        self.limit_calls(WHERE_WAIT_S)
        for _attempt in range(3):  # an answer half-written when the limit came may come first
            try:
                tag, body = self.read_frame()
            except (CheckTimeout, ExerciseGone, NotAResult):
                return None
            if tag == b"W":
                return parse_frames(parse_json(body))
        return None

    def reap(self, wait: bool) -> int | None:
        if self.status is None:
            with contextlib.suppress(ChildProcessError):
                pid, status = os.waitpid(self.pid, 0 if wait else os.WNOHANG)
                if pid:
                    self.status = status
        return self.status

    def end(self, why: str) -> None:
        """Kill the child's process group; no call after this."""
        self.gone = self.gone or why or "it was stopped"
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self.reap(wait=True)

    def close(self) -> None:
        self.end("the checks are over")
        for fd in (self.requests, self.answers):
            with contextlib.suppress(OSError):
                os.close(fd)
        end_adopted(self.adopted_before)
        become_subreaper(False)


def unpack(outcome: tuple, name: str) -> Any:
    """The function's return value, or its exception raised again here (as data: never its class)."""
    match outcome:
        case ("returned", value):
            return value
        case ("raised", dict() as info):
            raise rebuilt(info)
        case ("unsendable", str() as what):
            raise ExerciseRaised(
                _("{name} returned {what}, which cannot be passed back to the check").format(name=name, what=what[:200])
            )
    raise ExerciseGone("the exercise sent something that is not a result (an unknown outcome)")


def rebuilt(info: dict) -> BaseException:
    """A builtin Exception comes back as itself (a check may catch KeyError); anything else
    as ExerciseRaised. Either way with the child's text and frames attached."""
    name, message = text(info.get("name")), text(info.get("message"))
    code = info.get("exit_code")
    raised = Raised(name, message, parse_frames(info.get("frames")) or [], text(code) if code is not None else None)
    cls = getattr(builtins, name, None)
    if info.get("builtin") is True and isinstance(cls, type) and issubclass(cls, Exception):
        e: BaseException = cls(message)
    else:
        e = ExerciseRaised(f"{name}: {message}" if message else name)
    e.raised = raised  # type: ignore[attr-defined]
    return e


def text(value: object) -> str:
    return value[:MAX_TEXT] if isinstance(value, str) else ""


def parse_json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None


def parse_frames(frames: object) -> list[traceback.FrameSummary] | None:
    """[[file, line, function, text], ...] from the child, or None if it is anything else."""
    if not isinstance(frames, list):
        return None
    parsed = []
    for f in frames[-100:]:
        if not (isinstance(f, list) and len(f) == 4 and isinstance(f[1], int)):
            return None
        filename, lineno, name, line = text(f[0]), f[1], text(f[2]), text(f[3])
        parsed.append(traceback.FrameSummary(filename, lineno, name, line=line))
    return parsed


# ---- the child's side -------------------------------------------------------------------------
def serve(load: Load, plug: Plug, requests: int, answers: int) -> None:
    """The child's whole life: limits, load the functions, answer calls until the parent is done."""
    code = 0
    try:
        os.setpgid(0, 0)
        become_child(keep={requests, answers})
        limit_memory()
        signal.signal(signal.SIGUSR1, lambda signum, frame: say_where(answers, frame))
        try:
            functions = load()
        except Exception as e:  # noqa: BLE001 - the student reads why, as one line
            write_frame(answers, b"R" + json.dumps({"error": str(e)}, allow_nan=False).encode())
            return
        write_frame(answers, b"R" + json.dumps({"ready": sorted(functions)}, allow_nan=False).encode())
        with plug(functions):
            while (request := read_request(requests)) is not None:
                write_frame(answers, b"A" + answer(functions, *request))
    except BaseException:  # noqa: B036 - the child must reach os._exit whatever happened
        code = 1
    finally:
        os._exit(code)


def become_child(keep: set[int]) -> None:
    """Close every fd the parent had open (a test runner's channels, sockets) but the pipes, so
    the student's code can write to none of them; its prints go to stderr: stdout is the parent's."""
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))
    os.dup2(2, 1)
    sys.stdout = sys.stderr = open(2, "w", encoding="utf-8", errors="replace", closefd=False, buffering=1)  # noqa: SIM115


def read_request(fd: int) -> tuple[str, bytes] | None:
    header = read_all(fd, 8)
    if len(header) < 8:
        return None  # the parent is done
    body = read_all(fd, struct.unpack("<Q", header)[0])
    name, _sep, payload = body.partition(b"\0")
    return name.decode(), payload


def read_all(fd: int, size: int) -> bytes:
    data = b""
    while len(data) < size and (chunk := os.read(fd, size - len(data))):
        data += chunk
    return data


def answer(functions: dict[str, Callable], name: str, payload: bytes) -> bytes:
    args, kwargs, shared = read_call(payload)
    try:
        outcome: tuple = ("returned", functions[name](*args, **kwargs))
    except BaseException as e:  # noqa: B036 - sys.exit and the student's own BaseException too
        outcome = ("raised", describe(e))
    try:
        return send_answer(outcome, shared)
    except Exception:  # noqa: BLE001 - a value pickle cannot carry (a generator, a lambda)
        return send_answer(("unsendable", f"a {type(outcome[1]).__name__}"), shared)


def describe(e: BaseException) -> dict:
    try:
        message = str(e)
    except Exception:  # noqa: BLE001
        message = f"<{type(e).__name__} whose str() failed>"
    return {
        "name": type(e).__name__,
        "builtin": type(e).__module__ == "builtins",
        "message": message,
        "frames": [[f.filename, f.lineno, f.name, f.line or ""] for f in traceback.extract_tb(e.__traceback__)],
        "exit_code": repr(e.code) if isinstance(e, SystemExit) and e.code is not None else None,
    }


def say_where(fd: int, frame: Any) -> None:
    frames = traceback.extract_stack(frame)
    write_frame(
        fd, b"W" + json.dumps([[f.filename, f.lineno, f.name, f.line or ""] for f in frames], allow_nan=False).encode()
    )


def write_frame(fd: int, body: bytes) -> None:
    data = memoryview(struct.pack("<Q", len(body)) + body)
    while data:
        data = data[os.write(fd, data) :]


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


# ---- what the child leaves behind -------------------------------------------------------------
def become_subreaper(on: bool) -> None:
    """Linux: orphans of our descendants become our children, not init's, so end_adopted finds them."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)


def children_of(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").glob("[0-9]*/stat") if Path("/proc").is_dir() else ():
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int(entry.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry.parent.name))
    return found


def end_adopted(before: set[int], rounds: int = 50) -> None:
    """Kill and reap the processes adopted since `before` (what the child started), round after
    round: each one killed hands us its own children."""
    for _round in range(rounds):
        adopted = children_of(os.getpid()) - before
        if not adopted:
            return
        for pid in adopted:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def run_limited(work: Callable[[], str | None], limit: float) -> str | None:
    """work() in a child with the same limits (memory, time, process group): None when it returned
    None; else its one-line reason, or how the child ended."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    adopted_before = children_of(os.getpid())
    become_subreaper(True)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        run_work(work, write_fd)
    os.close(write_fd)
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)
    child = ExerciseProcess(pid, -1, read_fd, adopted_before)
    child.limit_calls(limit)
    try:
        tag, body = child.read_frame()
        said = parse_json(body) if tag == b"D" else None
        return said if said is None or isinstance(said, str) else not_a_result()
    except CheckTimeout:
        return stopped_after(limit)
    except (ExerciseGone, NotAResult) as e:
        return str(e)
    finally:
        child.close()


def run_work(work: Callable[[], str | None], fd: int) -> None:
    code = 0
    try:
        os.setpgid(0, 0)
        become_child(keep={fd})
        limit_memory()
        why = work()
        write_frame(fd, b"D" + json.dumps(why, allow_nan=False).encode())
    except BaseException:  # noqa: B036
        code = 1
    finally:
        os._exit(code)


def not_a_result(detail: str = "") -> str:
    return _("it sent something that is not a result{detail}").format(detail=detail)


def stopped_after(limit: float) -> str:
    return _("it did not finish within {limit:g} s and was stopped").format(limit=limit)


def how_it_ended(status: int | None) -> str:
    if status is None:
        return _("it stopped answering")
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.Signals.__members__.values() else f"signal {sig}"
        if sig == signal.SIGKILL:
            return _("it was killed (SIGKILL), most often because the machine ran out of memory")
        return _("it crashed ({signal})").format(signal=name)
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else status
    return _(
        "it exited (status {code}) without a verdict: your code ended the process (os._exit, or a library's "
        "exit); an exercise function must return its result"
    ).format(code=code)
