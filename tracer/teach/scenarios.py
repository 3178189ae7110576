"""Named, deterministic engine runs for lessons and demos: requests (optionally arriving at later
steps), engine options, and the step that matters. Runs them with the step recorder attached.

A scenario file (lessons/NN_name/scenario.json) looks like:

    {"title": "...", "model": "tiny",
     "engine": {"block_size": 4, "max_num_batched_tokens": 16},
     "params": {"max_tokens": 6, "ignore_eos": true},          # defaults for every request
     "requests": [{"prompt": "The cat sat", "max_tokens": 3},   # per-request overrides
                  {"prompt": "On the mat", "arrive": 2}],        # added before step 2 runs
     "focus": {"event": "finished", "nth": 1},                  # or {"step": 3}; "request": 0 to
                                                                # count only request 0's events
     "look_for": "what to watch in the replay"}

Anything else (a misspelt key, a value of the wrong type, an `arrive` that is not a whole step >= 0)
is a ScenarioError in one line before anything runs.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING

from nanoengine.sampling_params import SamplingParams
from nanoengine.sequence import EventKind
from nanoengine.step_record import StepRecord
from nanoengine.validation import is_int, short_repr
from tracer.loop.arrivals import Arrival
from tracer.loop.drive import StepLimitError, drive
from tracer.trace.trace_file import read_json_file

if TYPE_CHECKING:  # the engine loads torch (2 s): `run --help` and `demo --help` stay quick
    from nanoengine.engine import LLMEngine
    from nanoengine.outputs import RequestOutput
    from tracer.trace.recorder import TraceRecorder

DEFAULT_MAX_STEPS = 2000
FOCUS_EVENTS = tuple(EventKind)
PARAM_FIELDS = {f.name for f in fields(SamplingParams)}
TOP_LEVEL = {"title": str, "model": str, "engine": dict, "params": dict, "requests": list, "focus": dict,
             "look_for": str, "max_steps": int}  # fmt: skip
KIND_NAMES = {str: "a string", dict: "an object", list: "a list", int: "an integer"}


class ScenarioError(ValueError):
    """A scenario that cannot run: bad file, or an engine that never finishes."""


@dataclass(slots=True)
class Request:
    prompt: str | list[int]
    params: dict = field(default_factory=dict)  # SamplingParams fields
    arrive: int = 0  # engine step before which it is added


@dataclass(slots=True)
class Scenario:
    name: str
    title: str
    requests: list[Request]
    engine: dict = field(default_factory=dict)  # LLMEngine options
    model: str = "tiny"
    focus: dict = field(default_factory=dict)  # {"step": N} or {"event": kind, "nth": 1}
    look_for: str = ""
    max_steps: int = DEFAULT_MAX_STEPS


@dataclass(slots=True)
class StepSummary:
    """What a step scheduled, by request index (seq_ids differ between runs, indices do not)."""

    step: int
    batch: tuple[tuple[int, int], ...]  # (request index, num_scheduled_tokens)
    events: tuple[tuple[str, int], ...]  # (kind, request index)

    @property
    def num_batched_tokens(self) -> int:
        return sum(n for _, n in self.batch)


@dataclass(slots=True)
class ScenarioRun:
    scenario: Scenario
    model: str
    trace_path: Path | None
    outputs: list[RequestOutput]  # in request order
    steps: list[StepSummary]
    violations: list  # tracer.invariants.Violation, found live
    focus_step: int
    prefix_hits: dict[int, int] = field(default_factory=dict)  # step -> prompt tokens saved

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def event_counts(self) -> Counter:
        return Counter(kind for s in self.steps for kind, _ in s.events)


# ---- loading -------------------------------------------------------------------------------
def load_scenario(path: str | Path, name: str | None = None) -> Scenario:
    path = Path(path)
    data = read_json_file(path, "scenario", ScenarioError)
    return scenario_from_dict(data, name or path.parent.name, source=str(path))


def scenario_from_dict(data: dict, name: str, source: str = "scenario") -> Scenario:
    check_top_level(data, source)
    defaults = data.get("params", {})
    requests = []
    for i, r in enumerate(data["requests"]):
        if not isinstance(r, (str, list, dict)):
            raise ScenarioError(f"{source}: request {i} is {short_repr(r)}: give a prompt string or an object")
        r = {"prompt": r} if isinstance(r, (str, list)) else dict(r)
        if "prompt" not in r:
            raise ScenarioError(f"{source}: request {i} has no 'prompt'")
        prompt, arrive = r.pop("prompt"), r.pop("arrive", 0)
        if not is_int(arrive) or arrive < 0:
            raise ScenarioError(f"{source}: request {i} has arrive {short_repr(arrive)}: give a step number >= 0")
        params = {**defaults, **r}
        unknown = sorted(set(params) - PARAM_FIELDS)
        if unknown:
            raise ScenarioError(
                f"{source}: request {i} has unknown field(s) {', '.join(unknown)}; "
                f"use prompt, arrive or a SamplingParams field"
            )
        requests.append(Request(prompt, params, arrive))
    focus = data.get("focus", {})
    if focus.get("event") and focus["event"] not in FOCUS_EVENTS:
        raise ScenarioError(f"{source}: focus event {focus['event']!r} is not one of {', '.join(FOCUS_EVENTS)}")
    for key in ("step", "nth", "request"):
        if key in focus and not is_int(focus[key]):
            raise ScenarioError(f"{source}: focus {key} is {short_repr(focus[key])}: give an integer")
    return Scenario(
        name=name,
        title=data.get("title", name),
        requests=requests,
        engine=dict(data.get("engine", {})),
        model=data.get("model", "tiny"),
        focus=focus,
        look_for=data.get("look_for", ""),
        max_steps=data.get("max_steps", DEFAULT_MAX_STEPS),
    )


def check_top_level(data: object, source: str) -> None:
    """A ScenarioError for a file that is not a scenario object with known keys of the right types."""
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: a scenario is a JSON object with a 'requests' list, got {short_repr(data)}")
    unknown = sorted(set(data) - set(TOP_LEVEL))
    if unknown:
        raise ScenarioError(f"{source}: unknown key(s) {', '.join(map(repr, unknown))}; use {', '.join(TOP_LEVEL)}")
    for key, kind in TOP_LEVEL.items():
        value = data.get(key)
        if key in data and not (isinstance(value, kind) and (kind is not int or is_int(value))):
            raise ScenarioError(f"{source}: {key!r} must be {KIND_NAMES[kind]}, got {short_repr(value)}")
    if not data.get("requests"):
        raise ScenarioError(f"{source}: a scenario needs a non-empty 'requests' list")
    if data.get("max_steps", 1) < 1:
        raise ScenarioError(f"{source}: 'max_steps' must be >= 1, got {data['max_steps']}")


def scenario_arrivals(scenario: Scenario) -> list[Arrival]:
    """The scenario's requests as the driver's arrivals (index: the request's place in the file)."""
    return [Arrival(r.prompt, SamplingParams(**r.params), r.arrive, i) for i, r in enumerate(scenario.requests)]


# ---- running -------------------------------------------------------------------------------
class StepCollector:
    """A step hook that keeps a compact summary of each step, by request index."""

    def __init__(self) -> None:
        self.ids: dict[int, int] = {}  # request index -> seq_id, filled by the driver as requests join
        self.steps: list[StepSummary] = []
        self.prefix_hits: dict[int, int] = {}

    def __call__(self, record: StepRecord) -> None:
        idx = {seq_id: i for i, seq_id in self.ids.items()}.get
        scheduled = {s.seq_id: s.num_scheduled_tokens for s in record.seqs}
        batch = tuple((idx(sid, -1), scheduled.get(sid, 0)) for sid in record.inputs.seq_ids)
        # not_admitted explains a wait, it changes nothing: a student's try_admit need not record it
        events = tuple((e.kind, idx(e.seq_id, -1)) for e in record.events if e.kind != EventKind.NOT_ADMITTED)
        self.steps.append(StepSummary(record.step, batch, events))
        for e in record.events:
            if e.kind == EventKind.PREFIX_HIT:
                self.prefix_hits[record.step] = self.prefix_hits.get(record.step, 0) + e.detail["tokens_saved"]


def run_scenario(
    scenario: Scenario,
    trace_path: str | Path | None = None,
    model: str | None = None,
    engine_overrides: dict | None = None,
    title: str | None = None,
) -> ScenarioRun:
    """Run every request to completion with the recorder attached.

    trace_path None: record into a temporary file that is removed afterwards (violations are
    still checked live). Raises ScenarioError if the engine has not finished after max_steps.
    """
    from nanoengine.engine import LLMEngine
    from tracer.trace.recorder import TraceRecorder  # the recorder imports the engine; keep this module light

    model = model or scenario.model
    engine = LLMEngine(model, **{**scenario.engine, **(engine_overrides or {})})
    collector = StepCollector()
    engine.add_step_hook(collector)
    with tempfile.TemporaryDirectory(prefix="nanoengine-scenario-") as tmp:
        path = Path(trace_path) if trace_path is not None else Path(tmp) / "trace.jsonl"
        with TraceRecorder(engine, path, title=title or scenario.title) as recorder:
            drive_scenario(engine, scenario, recorder, collector.ids)
        violations = list(recorder.violations)
        focus = find_focus(scenario.focus, collector.steps)
        if trace_path is not None:
            set_header_fields(path, focus_step=focus, look_for=scenario.look_for or None)
    return ScenarioRun(
        scenario,
        model,
        Path(trace_path) if trace_path is not None else None,
        [engine.collect(collector.ids[i]) for i in range(len(scenario.requests))],
        collector.steps,
        violations,
        focus,
        collector.prefix_hits,
    )


def drive_scenario(engine: LLMEngine, scenario: Scenario, recorder: TraceRecorder, ids: dict[int, int]) -> None:
    """Run the scenario's requests to the end (ids: request index -> seq_id, filled as they join)."""
    try:
        drive(engine, scenario_arrivals(scenario), recorder=recorder, max_steps=scenario.max_steps, ids=ids)
    except StepLimitError as e:
        raise ScenarioError(f"scenario {scenario.name!r}: {e}") from None


def find_focus(focus: dict, steps: list[StepSummary]) -> int:
    """The step a scenario wants shown: a fixed step, or the nth step with a given event
    (optionally only events of one request, by index)."""
    if "step" in focus:
        return max(0, min(int(focus["step"]), len(steps) - 1))
    kind, nth, request = focus.get("event"), int(focus.get("nth", 1)), focus.get("request")
    if kind:
        hits = [s.step for s in steps if any(k == kind and request in (None, i) for k, i in s.events)]
        if hits:
            return hits[min(nth, len(hits)) - 1]
    return 0


def set_header_fields(path: Path, **fields) -> None:
    """Write viewer fields (focus_step, look_for) into the trace header, so `nanoengine replay`
    and the HTML export open at the focus step and show what to look for there too."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    if not lines:
        return
    header = json.loads(lines[0])
    if header.get("type") != "header":
        return
    header.update(fields)
    lines[0] = json.dumps(header, ensure_ascii=False, allow_nan=False) + "\n"
    path.write_text("".join(lines), encoding="utf-8")
