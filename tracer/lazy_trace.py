"""Open a large trace without parsing every step: the replay TUI's fast path for long runs.

    open_trace(path) -> Trace | LazyTrace

Files up to LAZY_BYTES go through tracer.trace_file.load_trace (every line parsed and checked).
A bigger file (a 10,000-step trace is hundreds of MB, because every step line carries every
sequence's text) is memory-mapped and only its line breaks are found; the header and the first
and last steps are parsed and schema-checked at once, and every other step is parsed only when
it is shown (a damaged line then gives a TraceError for that step). What the timeline
needs from every step (its number, its event kinds, whether it has violations) is read from the
raw line by a cheap scan: keys such as `"kind":"preempted"` cannot occur inside a JSON string,
where quotes are escaped, so finding them in the line is exact.
"""
from __future__ import annotations

import mmap
import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tracer.trace_file import (Trace, TraceError, check_order, check_required, cut_short_warning, load_trace,
                               merge_requests, parse_header, parse_step, parses, validate_line, validators)

LAZY_BYTES = 32 * 2**20
CACHE_STEPS = 64
STEP_NUMBER = re.compile(rb'\{\s*"type"\s*:\s*"step"\s*,\s*"step"\s*:\s*(\d+)')
EVENT_KIND = re.compile(rb'"kind"\s*:\s*"(\w+)"')
EMPTY_LIST_AFTER = re.compile(rb'\s*\[\s*\]')


@dataclass(slots=True)
class StepSummary:
    """What the timeline and `n`/`p` need about a step, read without parsing it."""
    step: int
    kinds: frozenset[str]
    has_violations: bool


class LazySteps(Sequence):
    """Step dicts parsed from the mapped file on first access; the last CACHE_STEPS stay parsed."""

    def __init__(self, path: Path, data, spans: list[tuple[int, int]]):
        self.path = path
        self.data = data                  # an mmap (or bytes) of the whole file
        self.spans = spans                # (start, end) byte offsets of each step line
        self.cache: OrderedDict[int, dict] = OrderedDict()

    def __len__(self) -> int:
        return len(self.spans)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self.spans):
            raise IndexError(index)
        step = self.cache.get(index)
        if step is None:
            start, end = self.spans[index]
            step = parse_step_line(self.path, index + 2, self.data[start:end])
            self.cache[index] = step
            if len(self.cache) > CACHE_STEPS:
                self.cache.popitem(last=False)
        else:
            self.cache.move_to_end(index)
        return step


@dataclass(slots=True)
class LazyTrace:
    path: Path
    header: dict
    steps: LazySteps
    summaries: list[StepSummary]
    requests: dict[int, dict] = field(default_factory=dict)
    warning: str | None = None

    @property
    def config(self) -> dict:
        return self.header["config"]

    @property
    def num_steps(self) -> int:
        return len(self.steps)


def open_trace(path: str | Path) -> Trace | LazyTrace:
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError:
        return load_trace(path)          # it words the error
    return load_trace(path) if size <= LAZY_BYTES else load_lazy(path)


def load_lazy(path: Path) -> LazyTrace:
    data = map_file(path)
    spans = line_spans(data)
    warning = None
    if len(spans) > 1 and data[-1:] != b"\n" and not parses(data[spans[-1][0]:spans[-1][1]]):
        spans.pop()            # no newline and not JSON: the write was interrupted
        warning = cut_short_warning(path, len(spans))
    try:
        header = parse_header(path, data[spans[0][0]:spans[0][1]].decode("utf-8"))
    except UnicodeDecodeError:
        raise TraceError(f"{path} is not a nanoengine trace (not UTF-8 text)") from None
    header_validator, step_validator = validators()
    validate_line(path, 1, header, header_validator)
    steps = LazySteps(path, data, spans[1:])
    for index in {0, len(steps) - 1} if len(steps) else ():
        validate_line(path, index + 2, steps[index], step_validator)
    summaries = [summarize_line(path, n, data, start, end) for n, (start, end) in enumerate(steps.spans, start=2)]
    check_order(path, (summary.step for summary in summaries))
    requests = merge_requests(header, (steps[index] for index, (start, end) in enumerate(steps.spans)
                                       if has_new_requests(data, start, end)))
    return LazyTrace(path, header, steps, summaries, requests, warning)


def map_file(path: Path):
    try:
        with open(path, "rb") as file:
            return mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    except ValueError:                     # an empty file cannot be mapped
        raise TraceError(f"{path} is empty: not a trace (record one with `nanoengine trace`)") from None
    except OSError as e:
        raise TraceError(f"{path}: cannot read it ({e.strerror})") from None


def line_spans(data) -> list[tuple[int, int]]:
    spans, start, size = [], 0, len(data)
    while start < size:
        end = data.find(b"\n", start)
        if end < 0:
            end = size
        spans.append((start, end))
        start = end + 1
    return spans


def parse_step_line(path: Path, n: int, line: bytes) -> dict:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        raise TraceError(f"{path}: line {n} is not UTF-8 text: the file is damaged") from None
    step = parse_step(path, n, text)
    check_required(path, n, step)
    return step


def summarize_line(path: Path, n: int, data, start: int, end: int) -> StepSummary:
    """Step number, event kinds and violations from the raw line; a full parse if the scan fails.

    The keys are searched from the line's end, where the recorder writes events, inputs, pool
    and violations, so the long `seqs` part is never scanned."""
    number = STEP_NUMBER.match(data, start, end)
    events = data.rfind(b'"events"', start, end)
    violations = data.rfind(b'"violations"', start, end)
    if number and events >= 0 and violations >= 0:
        inputs = data.find(b'"inputs"', events, end)
        kinds = frozenset(k.decode() for k in EVENT_KIND.findall(data, events, inputs if inputs >= 0 else end))
        colon = data.find(b":", violations, end) + 1
        return StepSummary(int(number.group(1)), kinds, not EMPTY_LIST_AFTER.match(data, colon, end))
    return summarize_step(parse_step_line(path, n, data[start:end]))


def summarize_step(step: dict) -> StepSummary:
    return StepSummary(step.get("step", -1), frozenset(e["kind"] for e in step.get("events", [])),
                       bool(step.get("violations")))


def summaries_of(trace) -> list[StepSummary]:
    """The trace's step summaries: read off the raw lines of a LazyTrace, or from parsed steps."""
    summaries = getattr(trace, "summaries", None)
    return summaries if summaries is not None else [summarize_step(step) for step in trace.steps]


def has_new_requests(data, start: int, end: int) -> bool:
    events = data.rfind(b'"events"', start, end)
    key = data.rfind(b'"new_requests"', start, events if events >= 0 else end)
    if key < 0:
        return False
    colon = data.find(b":", key, end) + 1
    return not EMPTY_LIST_AFTER.match(data, colon, end)
