"""Read a JSONL trace (docs/trace-format.md) and validate it against tracer/trace/schema.json.

    load_trace(path, validate="sample", lazy=None) -> Trace    raises TraceError (a ValueError)
                                                              with a one-line message on a bad file

One reader, two ways to hold the lines. Files up to LAZY_BYTES (or lazy=False) are read whole:
the lines are a list of dicts. A bigger file is memory-mapped and only its line breaks are
found; the header and the first and last steps are parsed and schema-checked at once, and every
other step is parsed only when it is used (a damaged line then gives a TraceError for that step):
the lines are a LazySteps. Up to schema version 3 each line is a whole step and Trace.steps holds
the lines; from version 4 a line is a keyframe or a change (tracer/trace/keyframes.py) and
Trace.steps is a RebuiltSteps over them: each whole step rebuilt when it is used, the same dict a
version-3 line held. What the timeline needs from every step (its number, its event kinds,
whether it has violations) is Trace.marks, read for a lazy trace from the raw line by a cheap
scan: keys such as `"kind":"preempted"` cannot occur inside a JSON string, where quotes are
escaped, so finding them in the line is exact.

Validation levels, because a full JSON Schema pass costs milliseconds per step:
  "sample" (default): the header and the first and last SAMPLE_STEPS steps are validated
      against the schema; every step is checked to be a step object with a rising step number
      and the required fields.
      A 10,000-step trace loads in well under two seconds.
  "all": every line against the schema (`nanoengine check` uses it: slower, stricter).
  "none": structure only.
Whatever the level, every step is checked to have its required fields (fast), so a damaged step
anywhere gives a TraceError, not a crash later.

A last line cut short (a crash or Ctrl-C mid-write) is dropped: the complete prefix loads and
Trace.warning says so. Any other damage is an error.
"""

from __future__ import annotations

import json
import math
import mmap
import re
import stat
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracer.i18n import _
from tracer.trace.step_line import (
    PER_BLOCK_FIELDS,
    EventLine,
    InputsLine,
    PoolChange,
    PoolLine,
    SeqRow,
    StepLine,
    block_id_lists,
)

if TYPE_CHECKING:  # jsonschema takes ~0.3 s to import: only when a file is validated (not for --help)
    from jsonschema import Draft202012Validator

SCHEMA_VERSION = 4  # 4: keyframes and changes; 3: not_admitted and the decisions' numbers;
# 2: eos_token_ids, tokenizer, queues, requested_step; 1 to 3 still load
FULL_STEPS_VERSION = 3  # the last version whose every line holds the whole step (vLLM's recorder writes it)
SCHEMA_PATH = Path(__file__).with_name("schema.json")
# The engine options that decide the schedule: a trace's or a workload's config holds at least these.
SCHEDULER_CONFIG = (
    "block_size",
    "num_kv_blocks",
    "max_num_batched_tokens",
    "max_num_seqs",
    "max_model_len",
    "enable_prefix_caching",
)
SAMPLE_STEPS = 3
LAZY_BYTES = 32 * 2**20
# What a trace may claim, checked before anything is sized by it (a crafted header must not make
# the checker allocate gigabytes or run for minutes). Far above any real run: SmolLM2's CPU pool is
# 23,296 slots; a step line with a thousand sequences' texts is a few MB.
MAX_LINE_BYTES = 64 * 2**20
MAX_BLOCK_SIZE = 2**16
MAX_KV_SLOTS = 2**24  # num_kv_blocks * block_size: the checker's KV shadow holds one entry per slot
MAX_REQUESTS_WITHOUT_STEPS = 10_000
CACHE_STEPS = 64
STEP_NUMBER = re.compile(rb'\{\s*"type"\s*:\s*"step"\s*,\s*"step"\s*:\s*(\d+)(\s*,\s*"keyframe"\s*:\s*true)?')
EVENT_KIND = re.compile(rb'"kind"\s*:\s*"(\w+)"')
EMPTY_LIST_AFTER = re.compile(rb'\s*\[\s*\]')


class TraceError(ValueError):
    """A trace file that cannot be loaded; the message is one line: what is wrong, what to do."""


class NonFiniteNumber(ValueError):
    """NaN, Infinity or a number too big for a float: JSON has none of them."""


def read_json_file(path: Path, what: str, error: type[ValueError]) -> Any:
    """The file's JSON; a one-line `error` naming `what` the file is when it cannot be read."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise error(f"cannot read {what} {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise error(f"{what} {path} is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise error(f"{what} {path} is not valid JSON (line {e.lineno}: {e.msg})") from None


def finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NonFiniteNumber(text)
    return value


def non_finite(text: str) -> float:
    raise NonFiniteNumber(text)


def loads(line: str | bytes):
    """json.loads, refusing what is not JSON although Python's json reads it: NaN, Infinity, 1e999."""
    return json.loads(line, parse_float=finite_float, parse_constant=non_finite)


def non_finite_error(path: Path, n: int, e: NonFiniteNumber) -> TraceError:
    return TraceError(f"{path}: line {n} holds the number {e}, which JSON does not have: the file is damaged")


@dataclass(slots=True)
class StepMarks:
    """What the timeline and `n`/`p` need about a step, read without parsing it."""

    step: int
    kinds: frozenset[str]
    has_violations: bool
    keyframe: bool = False  # a version-4 line holding the whole pool (tracer/trace/keyframes.py)


@dataclass(slots=True)
class Trace:
    path: Path
    header: dict
    steps: Sequence[dict]  # a list, or LazySteps for a big file
    marks: list[StepMarks]  # one per step, in order
    requests: dict[int, dict] = field(default_factory=dict)  # seq_id -> request (header + new_requests)
    warning: str | None = None

    @property
    def config(self) -> dict:
        return self.header["config"]

    @property
    def title(self) -> str | None:
        return self.header.get("title")

    @property
    def num_steps(self) -> int:
        return len(self.steps)


@cache
def schema_defs() -> dict:
    """The schema's $defs, read once."""
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))["$defs"]


@cache
def validators() -> tuple[Draft202012Validator, Draft202012Validator]:
    """(header validator, step validator), built once."""
    from jsonschema import Draft202012Validator

    return tuple(
        Draft202012Validator({"$defs": schema_defs(), "$ref": f"#/$defs/{name}"}) for name in ("header", "step")
    )


def load_trace(path: str | Path, validate: str = "sample", lazy: bool | None = None) -> Trace:
    """lazy None: lazily above LAZY_BYTES. A lazy load validates the header, first and last step."""
    if validate not in ("sample", "all", "none"):
        raise ValueError(f"validate must be 'sample', 'all' or 'none', got {validate!r}")
    path = Path(path)
    size = regular_file_size(path)
    if lazy is None:
        lazy = size > LAZY_BYTES
    if lazy:
        return load_lazy(path)
    lines, cut = read_lines(path)
    header = parse_header(path, lines[0])
    steps = [parse_step(path, i + 2, line) for i, line in enumerate(lines[1:])]
    warning = cut_short_warning(path, len(lines)) if cut else None
    check_order(path, (step.get("step") for step in steps))
    for n, step in enumerate(steps, start=2):
        check_required(path, n, step, header["schema_version"])
    check_claims(path, header, steps[0] if steps else None)
    if validate != "none":
        header_validator, step_validator = validators()
        validate_line(path, 1, header, header_validator)
        numbered = list(enumerate(steps, start=2))
        if validate == "sample" and len(numbered) > 2 * SAMPLE_STEPS:
            numbered = numbered[:SAMPLE_STEPS] + numbered[-SAMPLE_STEPS:]
        for n, step in numbered:
            validate_line(path, n, step, step_validator)
    marks = [marks_from_step(s) for s in steps]
    return Trace(path, header, whole_steps(path, header, steps, marks), marks, merge_requests(header, steps), warning)


def whole_steps(path: Path, header: dict, lines: Sequence[dict], marks: list[StepMarks]) -> Sequence[dict]:
    """What Trace.steps holds: the lines themselves up to FULL_STEPS_VERSION, else the steps
    rebuilt from keyframes and changes."""
    if header["schema_version"] <= FULL_STEPS_VERSION:
        return lines
    from tracer.trace.keyframes import RebuiltSteps  # it builds on this module

    return RebuiltSteps(lines, marks, path)


NOT_REGULAR = {stat.S_IFIFO: "a named pipe (FIFO)", stat.S_IFCHR: "a device", stat.S_IFBLK: "a device"}


def regular_file_size(path: Path) -> int:
    """The size of the trace file at path; TraceError unless it is a regular file (a pipe with no
    writer would be waited on forever, a device such as /dev/zero read without end)."""
    try:
        info = path.stat()
    except OSError as e:
        raise open_error(path, e) from None
    if stat.S_ISDIR(info.st_mode):
        raise open_error(path, IsADirectoryError())
    if not stat.S_ISREG(info.st_mode):
        kind = NOT_REGULAR.get(stat.S_IFMT(info.st_mode), "a socket")
        raise TraceError(f"{path} is {kind}, not a trace file: save the trace to a file first, then open that")
    return info.st_size


def open_error(path: Path, e: OSError) -> TraceError:
    """Why the trace file at path could not be opened or read, in one line."""
    if isinstance(e, FileNotFoundError):
        return TraceError(_("{path}: no such trace file").format(path=path))
    if isinstance(e, IsADirectoryError):
        return TraceError(_("{path} is a folder, not a trace file (*.jsonl)").format(path=path))
    return TraceError(_("{path}: cannot read it ({error})").format(path=path, error=e.strerror))


def not_utf8_error(path: Path) -> TraceError:
    return TraceError(f"{path} is not a nanoengine trace (not UTF-8 text)")


def check_claims(path: Path, header: dict, first_step: dict | None) -> None:
    """What the header claims, bounded before the checker and the viewers size anything by it:
    the pool (slots, as the KV shadow holds them) and the requests it lists (those live at the
    first step: no more than that step's sequences)."""
    config = header.get("config")
    config = config if isinstance(config, dict) else {}
    block_size, num_blocks = config.get("block_size"), config.get("num_kv_blocks")
    if isinstance(block_size, int) and block_size > MAX_BLOCK_SIZE:
        raise claim_error(path, f"block_size {block_size} (at most {MAX_BLOCK_SIZE:,})")
    pool = first_step.get("pool") if first_step else None
    in_step = len(pool.get("ref_counts", ())) if isinstance(pool, dict) else 0  # what the KV shadow is sized by
    blocks = max(num_blocks if isinstance(num_blocks, int) else 0, in_step)
    if isinstance(block_size, int) and blocks * block_size > MAX_KV_SLOTS:
        raise claim_error(
            path, f"a KV pool of {blocks:,} blocks of {block_size} slots (at most {MAX_KV_SLOTS:,} slots)"
        )
    requests = header.get("requests")
    limit = len(first_step.get("seqs", ())) if first_step else MAX_REQUESTS_WITHOUT_STEPS
    if isinstance(requests, list) and len(requests) > limit:
        where = "its first step has" if first_step else "a trace without steps may list"
        raise claim_error(path, f"{len(requests):,} requests in its header ({where} {limit:,})")


def claim_error(path: Path, what: str) -> TraceError:
    return TraceError(f"{path} claims {what}: not a trace nanoengine wrote; the file is damaged or crafted")


def read_lines(path: Path) -> tuple[list[str], bool]:
    """The file's lines, and whether a cut-short last line was dropped."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise not_utf8_error(path) from None
    except OSError as e:
        raise open_error(path, e) from None
    if not text.strip():
        raise TraceError(f"{path} is empty: not a trace (record one with `nanoengine trace`)")
    lines = text.split("\n")
    cut = False
    if lines[-1] == "":
        lines.pop()
    elif len(lines) > 1 and not parses(lines[-1]):
        lines.pop()  # no newline and not JSON: the write was interrupted
        cut = True
    return lines, cut


def cut_short_warning(path: Path, num_complete_lines: int) -> str:
    return (
        f"{path.name}: the last line (line {num_complete_lines + 1}) was cut short; "
        f"loaded the {num_complete_lines - 1} complete steps before it"
    )


def parses(line: str | bytes) -> bool:
    try:
        loads(line)
        return True
    except (ValueError, RecursionError):
        return False


def parse_header(path: Path, line: str) -> dict:
    try:
        header = loads(line)
    except NonFiniteNumber as e:
        raise non_finite_error(path, 1, e) from None
    except (ValueError, RecursionError):  # RecursionError: nested too deeply to be a header
        raise TraceError(f"{path} is not a nanoengine trace (line 1 is not JSON)") from None
    if not isinstance(header, dict) or header.get("type") != "header":
        raise TraceError(f"{path} is not a nanoengine trace (line 1 is not a trace header)")
    version = header.get("schema_version")
    if not isinstance(version, int) or version < 1:
        raise TraceError(f"{path}: unknown trace schema_version {version!r}")
    if version > SCHEMA_VERSION:
        raise TraceError(
            f"{path} uses trace schema_version {version}, newer than this nanoengine reads "
            f"({SCHEMA_VERSION}): upgrade nanoengine to open it"
        )
    return header


def parse_header_line(path: Path, line: bytes) -> dict:
    try:
        return parse_header(path, line.decode("utf-8"))
    except UnicodeDecodeError:
        raise not_utf8_error(path) from None


def parse_step(path: Path, n: int, line: str) -> dict:
    try:
        step = loads(line)
    except NonFiniteNumber as e:
        raise non_finite_error(path, n, e) from None
    except json.JSONDecodeError as e:
        raise TraceError(
            f"{path}: line {n} is not valid JSON ({e.msg}, column {e.colno}): the file is damaged"
        ) from None
    except RecursionError:
        raise TraceError(f"{path}: line {n} is nested too deeply to be a step: the file is damaged") from None
    if not isinstance(step, dict) or step.get("type") != "step":
        raise TraceError(
            f"{path}: line {n} is not a step line (its type is "
            f"{step.get('type') if isinstance(step, dict) else type(step).__name__!r})"
        )
    return step


def check_order(path: Path, numbers: Iterable) -> None:
    """The steps' numbers (line 2 onwards) are ints that rise."""
    last = None
    for n, number in enumerate(numbers, start=2):
        if not isinstance(number, int) or (last is not None and number <= last):
            raise step_order_error(path, n, number, last)
        last = number


def step_order_error(path: Path, n: int, number: object, last: int | None) -> TraceError:
    return TraceError(f"{path}: line {n} has step number {number!r} after step {last}: step numbers must rise")


CONTAINERS = {"inputs": dict, "pool": dict, "seqs": list, "events": list, "new_requests": list}
CHANGE_LISTS = ("changed", "free_removed", "free_added", "free_block_ids")  # keyframes.py walks them


def check_required(path: Path, n: int, step: dict, version: int) -> None:
    """The cheap part of the schema, for every step: each object has its required fields, and the
    containers the reader itself walks (seqs, events, new_requests, a change's pool) hold what it
    expects. version: the trace's schema_version (from 4 a line that is no keyframe holds a change)."""
    check_fields(path, n, "the step", step, StepLine.__required_keys__)
    for key, kind in CONTAINERS.items():
        if key in step and not isinstance(step[key], kind):
            expected = "an object" if kind is dict else "a list"
            raise schema_error(path, n, f"{key} is {type(step[key]).__name__}, not {expected}")
    check_fields(path, n, "inputs", step["inputs"], InputsLine.__required_keys__)
    change = version > FULL_STEPS_VERSION and step.get("keyframe") is not True
    check_fields(path, n, "pool", step["pool"], (PoolChange if change else PoolLine).__required_keys__)
    if change and not all(isinstance(step["pool"].get(key, []), list) for key in CHANGE_LISTS):
        raise schema_error(path, n, f"the pool's change holds a {'/'.join(CHANGE_LISTS)} that is not a list")
    for i, seq in enumerate(step["seqs"]):
        check_fields(path, n, f"seqs/{i}", seq, SeqRow.__required_keys__)
    for i, event in enumerate(step["events"]):
        check_fields(path, n, f"events/{i}", event, EventLine.__required_keys__)
        if not isinstance(event["kind"], str):
            raise schema_error(path, n, f"events/{i}/kind is {event['kind']!r}, not a string")
    for i, request in enumerate(step.get("new_requests", ())):
        if not isinstance(request, dict) or not isinstance(request.get("seq_id"), int):
            raise schema_error(path, n, f"new_requests/{i} is not a request with an integer seq_id")


def check_fields(path: Path, n: int, where: str, obj: object, required: frozenset[str]) -> None:
    missing = required - obj.keys() if isinstance(obj, dict) else required
    if missing:
        raise schema_error(path, n, f"{where} lacks {', '.join(sorted(missing))}")


def schema_error(path: Path, n: int, what: str) -> TraceError:
    return TraceError(f"{path}: line {n} does not match the trace schema: {what}"[:300])


def validate_line(path: Path, n: int, obj: dict, validator: Draft202012Validator) -> None:
    from jsonschema.exceptions import best_match

    error = best_match(validator.iter_errors(obj))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "the top level"
        raise TraceError(f"{path}: line {n} does not match the trace schema: {error.message} (at {where})")


def check_step(trace: Trace, index: int) -> dict:
    """The step at index, validated against the schema and the config's pool size (what a viewer
    indexes with): a TraceError names its line and field."""
    step, n = trace.steps[index], index + 2
    validate_line(trace.path, n, step, validators()[1])
    num_kv_blocks, pool = trace.config["num_kv_blocks"], step["pool"]
    for key in PER_BLOCK_FIELDS:
        if key in pool and len(pool[key]) != num_kv_blocks:
            raise schema_error(trace.path, n, f"pool/{key} has {len(pool[key])} entries for {num_kv_blocks} KV blocks")
    for where, blocks in block_id_lists(step):
        if any(not 0 <= b < num_kv_blocks for b in blocks):
            raise schema_error(trace.path, n, f"{where} holds a block id outside 0 .. {num_kv_blocks - 1}")
    return step


def merge_requests(header: dict, steps: Iterable[dict]) -> dict[int, dict]:
    requests = {r["seq_id"]: r for r in header.get("requests", [])}
    for step in steps:
        add_new_requests(requests, step)
    return requests


def add_new_requests(requests: dict[int, dict], step: dict) -> None:
    """The requests a step line lists as new, added to requests (the first listing wins)."""
    for r in step.get("new_requests", ()):
        requests.setdefault(r["seq_id"], r)


# ---- big files: steps parsed when used ----------------------------------------------------
class CachedSteps(Sequence):
    """Step dicts made on first access (make); the last CACHE_STEPS made stay. A subclass says how
    many steps there are (__len__) and how a step is made."""

    cache: OrderedDict[int, dict]

    def make(self, index: int) -> dict:
        raise NotImplementedError

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        step = self.cache.get(index)
        if step is None:
            step = self.cache[index] = self.make(index)
            if len(self.cache) > CACHE_STEPS:
                self.cache.popitem(last=False)
        else:
            self.cache.move_to_end(index)
        return step


class LineSteps(CachedSteps):
    """Step dicts parsed from their lines on first access. A subclass says how many steps there are
    (__len__) and reads a step's line (line)."""

    def __init__(self, path: Path, version: int = SCHEMA_VERSION) -> None:
        self.path = path
        self.version = version  # the trace's schema_version: how its lines are checked
        self.cache = OrderedDict()

    def line(self, index: int) -> bytes:
        raise NotImplementedError

    def make(self, index: int) -> dict:
        return parse_step_line(self.path, index + 2, self.line(index), self.version)


class LazySteps(LineSteps):
    """The steps of a mapped file."""

    def __init__(self, path: Path, data, spans: list[tuple[int, int]], version: int):
        super().__init__(path, version)
        self.data = data  # an mmap (or bytes) of the whole file
        self.spans = spans  # (start, end) byte offsets of each step line

    def __len__(self) -> int:
        return len(self.spans)

    def line(self, index: int) -> bytes:
        start, end = self.spans[index]
        return self.data[start:end]


def load_lazy(path: Path) -> Trace:
    data = map_file(path)
    spans = line_spans(data)
    warning = None
    check_line_lengths(path, spans)
    if len(spans) > 1 and data[-1:] != b"\n" and not parses(data[spans[-1][0] : spans[-1][1]]):
        spans.pop()  # no newline and not JSON: the write was interrupted
        warning = cut_short_warning(path, len(spans))
    header = parse_header_line(path, data[spans[0][0] : spans[0][1]])
    steps = LazySteps(path, data, spans[1:], header["schema_version"])
    check_claims(path, header, steps[0] if len(steps) else None)
    header_validator, step_validator = validators()
    validate_line(path, 1, header, header_validator)
    for index in {0, len(steps) - 1} if len(steps) else ():
        validate_line(path, index + 2, steps[index], step_validator)
    marks = [
        marks_from_line(path, n, data, start, end, steps.version) for n, (start, end) in enumerate(steps.spans, start=2)
    ]
    check_order(path, (m.step for m in marks))
    requests = merge_requests(
        header, (steps[index] for index, (start, end) in enumerate(steps.spans) if has_new_requests(data, start, end))
    )
    return Trace(path, header, whole_steps(path, header, steps, marks), marks, requests, warning)


def map_file(path: Path):
    try:
        with open(path, "rb") as file:
            return mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    except ValueError:  # an empty file cannot be mapped
        raise TraceError(f"{path} is empty: not a trace (record one with `nanoengine trace`)") from None
    except OSError as e:
        raise TraceError(f"{path}: cannot read it ({e.strerror})") from None


def check_line_lengths(path: Path, spans: list[tuple[int, int]]) -> None:
    """No line longer than MAX_LINE_BYTES: one line is parsed whole, into many times its size."""
    for n, (start, end) in enumerate(spans, start=1):
        if end - start > MAX_LINE_BYTES:
            raise TraceError(
                f"{path}: line {n} is {(end - start) / 2**20:,.0f} MB long, more than a trace line may be "
                f"({MAX_LINE_BYTES // 2**20} MB): not a trace nanoengine wrote, or a damaged one"
            )


def line_spans(data) -> list[tuple[int, int]]:
    spans, start, size = [], 0, len(data)
    while start < size:
        end = data.find(b"\n", start)
        if end < 0:
            end = size
        spans.append((start, end))
        start = end + 1
    return spans


def parse_step_line(path: Path, n: int, line: bytes, version: int) -> dict:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        raise TraceError(f"{path}: line {n} is not UTF-8 text: the file is damaged") from None
    step = parse_step(path, n, text)
    check_required(path, n, step, version)
    return step


def marks_from_line(path: Path, n: int, data, start: int, end: int, version: int) -> StepMarks:
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
        has_violations = not EMPTY_LIST_AFTER.match(data, colon, end)
        return StepMarks(int(number.group(1)), kinds, has_violations, number.group(2) is not None)
    return marks_from_step(parse_step_line(path, n, data[start:end], version))


def marks_from_step(step: dict) -> StepMarks:
    return StepMarks(
        step.get("step", -1),
        frozenset(e["kind"] for e in step.get("events", [])),
        bool(step.get("violations")),
        step.get("keyframe") is True,
    )


def has_new_requests(data, start: int, end: int) -> bool:
    events = data.rfind(b'"events"', start, end)
    key = data.rfind(b'"new_requests"', start, events if events >= 0 else end)
    if key < 0:
        return False
    colon = data.find(b":", key, end) + 1
    return not EMPTY_LIST_AFTER.match(data, colon, end)
