"""A trace file that is still being written, read as it grows (like `tail -f`).

    source = GrowingTrace(path)       # opens the file; nothing is read yet
    source.poll() -> int              # reads what was appended: the number of new complete steps
    source.header, source.steps, source.marks, source.requests   # as tracer.trace.trace_file.Trace

source.lines holds the lines read; source.steps the whole steps (for a version-4 trace, rebuilt
from its keyframes and changes, tracer/trace/keyframes.py; the lines themselves before).

Only complete lines are read: a half-written last line is left for the next poll, not reported as
damage. The file stays open, so a writer renaming it (FILE.partial -> FILE when a server stops)
does not lose the reader. Memory stays flat however long the run: per step only its byte span and
its StepMarks (what the timeline needs) are kept; a step line is parsed from the file when a view
shows it, and only the last CACHE_STEPS parsed steps stay parsed.
"""

from __future__ import annotations

import os
from array import array
from pathlib import Path

from tracer.trace.keyframes import RebuiltSteps
from tracer.trace.trace_file import (
    FULL_STEPS_VERSION,
    MAX_LINE_BYTES,
    LineSteps,
    StepMarks,
    TraceError,
    add_new_requests,
    check_claims,
    has_new_requests,
    marks_from_line,
    merge_requests,
    open_error,
    parse_header_line,
    parse_step_line,
    step_order_error,
    validate_line,
    validators,
)

CHUNK_BYTES = 4 * 2**20  # read at most this much per read call; a longer line is read whole


class GrowingSteps(LineSteps):
    """The steps read so far: each parsed from the file when used; the last CACHE_STEPS stay parsed."""

    def __init__(self, path: Path, fd: int) -> None:
        super().__init__(path)
        self.fd = fd
        self.starts = array("q")  # byte offset of each step line
        self.ends = array("q")  # its end (the newline's offset)

    def __len__(self) -> int:
        return len(self.starts)

    def line(self, index: int) -> bytes:
        start = self.starts[index]
        return os.pread(self.fd, self.ends[index] - start, start)

    def append(self, start: int, end: int) -> None:
        self.starts.append(start)
        self.ends.append(end)


class GrowingTrace:
    """What Trace holds, for a file that grows: the header (once its line is complete), the steps,
    their marks and the requests seen so far."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self.file = open(self.path, "rb")  # noqa: SIM115  # held open while followed; close()
        except OSError as e:
            raise open_error(self.path, e) from None
        self.fd = self.file.fileno()
        self.offset = 0  # bytes read so far: always the end of a complete line
        self.header: dict = {}
        self.lines = GrowingSteps(self.path, self.fd)
        self.steps: GrowingSteps | RebuiltSteps = self.lines  # until the header says what the lines are
        self.marks: list[StepMarks] = []
        self.requests: dict[int, dict] = {}
        self.warning: str | None = None

    @property
    def config(self) -> dict:
        return self.header["config"]

    @property
    def has_header(self) -> bool:
        return bool(self.header)

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    def poll(self) -> int:
        """Read the complete lines appended since the last poll; the number of new steps.
        TraceError (one line) on a damaged line, or when the file shrank under the reader."""
        size = os.fstat(self.fd).st_size
        if size < self.offset:
            raise TraceError(f"{self.path} shrank while it was followed: it was rewritten; open it again")
        before = len(self.steps)
        while self.offset < size:
            data = os.pread(self.fd, min(size - self.offset, CHUNK_BYTES), self.offset)
            last = data.rfind(b"\n")
            if last < 0:  # no complete line in the chunk: a long line, or one still being written
                if size - self.offset <= len(data):
                    break  # half-written: wait for the rest
                data = os.pread(self.fd, min(size - self.offset, MAX_LINE_BYTES + 1), self.offset)
                last = data.find(b"\n")
                if last < 0:
                    if len(data) > MAX_LINE_BYTES:
                        raise TraceError(f"{self.path}: a line is longer than a trace line may be: the file is damaged")
                    break
            self.read_lines(data, last)
            self.offset += last + 1
        return len(self.steps) - before

    def read_lines(self, data: bytes, last: int) -> None:
        """Each complete line of data[: last + 1] (data starts at self.offset in the file)."""
        start = 0
        while start <= last:
            end = data.index(b"\n", start)
            if end > start:
                self.read_line(data, start, end)
            start = end + 1

    def read_line(self, data: bytes, start: int, end: int) -> None:
        n = len(self.lines) + 2  # the line's number in the file
        if not self.header:
            header = parse_header_line(self.path, data[start:end])
            check_claims(self.path, header, None)
            validate_line(self.path, 1, header, validators()[0])
            self.header = header
            self.requests = merge_requests(header, ())
            self.lines.version = header["schema_version"]
            if header["schema_version"] > FULL_STEPS_VERSION:  # keyframes and changes: rebuilt when shown
                self.steps = RebuiltSteps(self.lines, self.marks, self.path)
            return
        marks = marks_from_line(self.path, n, data, start, end, self.lines.version)
        if self.marks and marks.step <= self.marks[-1].step:
            raise step_order_error(self.path, n, marks.step, self.marks[-1].step)
        step = None
        if not self.marks or has_new_requests(data, start, end):
            step = parse_step_line(self.path, n, data[start:end], self.lines.version)
            if not self.marks:
                validate_line(self.path, n, step, validators()[1])
            add_new_requests(self.requests, step)
        self.lines.append(self.offset + start, self.offset + end)
        self.marks.append(marks)

    def close(self) -> None:
        self.file.close()
