"""Named, deterministic engine runs for lessons and demos: requests (optionally arriving at later
steps), engine options, and the step that matters. Runs them with the step recorder attached.

A scenario file (lessons/NN_name/scenario.json) looks like:

    {"title": "...", "model": "tiny",
     "engine": {"block_size": 4, "max_num_batched_tokens": 16},
     "params": {"max_tokens": 6, "ignore_eos": true},          # defaults for every request
     "requests": [{"prompt": "The cat sat", "max_tokens": 3},   # per-request overrides
                  {"prompt": "On the mat", "arrive": 2},         # added before step 2 runs
                  {"prompt": "A beam", "beam_width": 3}],       # a beam search (BeamSearchParams)
     "focus": {"event": "finished", "nth": 1},                  # or {"step": 3}; "request": 0 to
                                                                # count only request 0's events
     "look_for": "what to watch in the replay"}

Anything else (a misspelt key, a value of the wrong type, an `arrive` that is not a whole step >= 0)
is a ScenarioError in one line before anything runs. The same format is published as a JSON Schema,
scenario.schema.json beside this file (tests/teach/test_lessons.py keeps the two in step), and
`nanoengine run --template` prints a commented example (TEMPLATE).
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING

from nanoengine.beam_search import BeamSearchParams
from nanoengine.loading.validation import is_int, short_repr
from nanoengine.sampling_params import SamplingParams
from nanoengine.sequence import EventKind
from nanoengine.step_record import StepRecord
from tracer.i18n import N_, _
from tracer.loop.arrivals import Arrival
from tracer.loop.drive import StepLimitError, drive
from tracer.trace.trace_file import read_json_file

if TYPE_CHECKING:  # the engine loads torch (2 s): `run --help` and `demo --help` stay quick
    from nanoengine.engine import LLMEngine
    from nanoengine.outputs import RequestOutput
    from tracer.trace.recorder import TraceRecorder

DEFAULT_MAX_STEPS = 2000
FOCUS_EVENTS = tuple(EventKind)
BEAM_FIELDS = {f.name for f in fields(BeamSearchParams)}  # a request with beam_width is a beam search
BEAM_ONLY = BEAM_FIELDS - {f.name for f in fields(SamplingParams)}  # beam_width, length_penalty
PARAM_FIELDS = ({f.name for f in fields(SamplingParams)} - {"logits_processors"}) | BEAM_ONLY  # functions: not JSON
TOP_LEVEL = {"title": str, "model": str, "engine": dict, "params": dict, "requests": list, "focus": dict,
             "look_for": str, "max_steps": int}  # fmt: skip
KIND_NAMES = {str: N_("a string"), dict: N_("an object"), list: N_("a list"), int: N_("an integer")}
FOCUS_LEAST = {"step": 0, "nth": 1, "request": 0}  # focus's integer keys, each with its least value
SCHEMA_FILE = Path(__file__).with_name("scenario.schema.json")


class ScenarioError(ValueError):
    """A scenario that cannot run: bad file, or an engine that never finishes."""


@dataclass(slots=True)
class Request:
    prompt: str | list[int]
    params: dict = field(default_factory=dict)  # SamplingParams fields, or BeamSearchParams' (beam_width)
    arrive: int = 0  # engine step before which it is added

    @property
    def is_beam_search(self) -> bool:
        return "beam_width" in self.params

    def engine_params(self) -> SamplingParams | BeamSearchParams:
        """What the engine runs it with."""
        return BeamSearchParams(**self.params) if self.is_beam_search else SamplingParams(**self.params)


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
            raise ScenarioError(
                _("{source}: request {i} is {value}: give a prompt string or an object").format(
                    source=source, i=i, value=short_repr(r)
                )
            )
        r = {"prompt": r} if isinstance(r, (str, list)) else dict(r)
        if "prompt" not in r:
            raise ScenarioError(_("{source}: request {i} has no 'prompt'").format(source=source, i=i))
        prompt, arrive = r.pop("prompt"), r.pop("arrive", 0)
        if not is_int(arrive) or arrive < 0:
            raise ScenarioError(
                _("{source}: request {i} has arrive {value}: give a step number >= 0").format(
                    source=source, i=i, value=short_repr(arrive)
                )
            )
        params = {**defaults, **r}
        unknown = sorted(set(params) - PARAM_FIELDS)
        if unknown:
            raise ScenarioError(
                _(
                    "{source}: request {i} has unknown field(s) {fields}; use prompt, arrive or a SamplingParams field"
                ).format(source=source, i=i, fields=', '.join(unknown))
            )
        check_beam_fields(r, params, f"{source}: request {i}")
        requests.append(Request(prompt, applicable(params), arrive))
    focus = data.get("focus", {})
    check_focus(focus, source)
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
        raise ScenarioError(
            _("{source}: a scenario is a JSON object with a 'requests' list, got {value}").format(
                source=source, value=short_repr(data)
            )
        )
    unknown = sorted(set(data) - set(TOP_LEVEL))
    if unknown:
        raise ScenarioError(
            _("{source}: unknown key(s) {keys}; use {known}").format(
                source=source, keys=', '.join(map(repr, unknown)), known=', '.join(TOP_LEVEL)
            )
        )
    for key, kind in TOP_LEVEL.items():
        value = data.get(key)
        if key in data and not (isinstance(value, kind) and (kind is not int or is_int(value))):
            raise ScenarioError(
                _("{source}: {key!r} must be {kind}, got {value}").format(
                    source=source, key=key, kind=_(KIND_NAMES[kind]), value=short_repr(value)
                )
            )
    if not data.get("requests"):
        raise ScenarioError(_("{source}: a scenario needs a non-empty 'requests' list").format(source=source))
    if data.get("max_steps", 1) < 1:
        raise ScenarioError(
            _("{source}: 'max_steps' must be >= 1, got {value}").format(source=source, value=data['max_steps'])
        )


def check_beam_fields(own: dict, params: dict, where: str) -> None:
    """A beam search (beam_width) takes BeamSearchParams' fields only: one given on the request
    itself that it has no use for is refused (a default in "params" is for the other requests);
    length_penalty alone is refused too."""
    if "beam_width" not in params:
        if BEAM_ONLY & set(own):
            raise ScenarioError(
                _("{where}: length_penalty is for a beam search: give beam_width too").format(where=where)
            )
        return
    foreign = sorted(set(own) - BEAM_FIELDS)
    if foreign:
        raise ScenarioError(
            _("{where} is a beam search (beam_width): it takes only {fields}, not {foreign}").format(
                where=where, fields=", ".join(sorted(BEAM_FIELDS)), foreign=", ".join(foreign)
            )
        )


def applicable(params: dict) -> dict:
    """The fields a request runs with: a beam search takes the defaults it has a field for, any other
    request those SamplingParams has."""
    keep = BEAM_FIELDS if "beam_width" in params else PARAM_FIELDS - BEAM_ONLY
    return {k: v for k, v in params.items() if k in keep}


def check_focus(focus: dict, source: str) -> None:
    """A ScenarioError unless focus is {"step": N} or {"event": KIND, "nth": N, "request": I}."""
    unknown = sorted(set(focus) - {"event", *FOCUS_LEAST})
    if unknown:
        raise ScenarioError(
            _("{source}: focus has unknown key(s) {keys}; use step, or event with nth and request").format(
                source=source, keys=', '.join(map(repr, unknown))
            )
        )
    if "step" in focus and "event" in focus:
        raise ScenarioError(_("{source}: focus gives a step or an event, not both").format(source=source))
    if "event" in focus and focus["event"] not in FOCUS_EVENTS:
        raise ScenarioError(
            _("{source}: focus event {event} is not one of {events}").format(
                source=source, event=short_repr(focus['event']), events=', '.join(FOCUS_EVENTS)
            )
        )
    for key, least in FOCUS_LEAST.items():
        if key in focus and not (is_int(focus[key]) and focus[key] >= least):
            raise ScenarioError(
                _("{source}: focus {key} is {value}: give an integer >= {least}").format(
                    source=source, key=key, value=short_repr(focus[key]), least=least
                )
            )


def scenario_arrivals(scenario: Scenario) -> list[Arrival]:
    """The scenario's requests as the driver's arrivals (index: the request's place in the file)."""
    return [Arrival(r.prompt, r.engine_params(), r.arrive, i) for i, r in enumerate(scenario.requests)]


# `nanoengine run --template`. Its `//` lines are comments (printed on stderr); the others, alone, are
# a scenario file that runs (printed on stdout): `nanoengine run --template > my.json` keeps pure JSON.
TEMPLATE = """\
// A scenario: requests for the engine, the step that matters and what to look for there.
// Every key is optional but "requests"; any other key is refused. JSON Schema: tracer/teach/scenario.schema.json
{
  // the trace's title
  "title": "A late request shares the first one's prefix",
  // "tiny" (random weights, instant), "default" (SmolLM2-135M) or a model folder; --model overrides it
  "model": "tiny",
  // LLMEngine options (nanoengine/config.py); a small pool makes preemption easy to see; flags override them
  "engine": {"block_size": 4, "num_kv_blocks": 32},
  // SamplingParams for every request (nanoengine/sampling_params.py)
  "params": {"max_tokens": 6, "ignore_eos": true},
  // each request: a prompt (text or token ids), or an object with the prompt, "arrive" (the engine
  // step it joins before; 0 = at once) and any SamplingParams field for this request alone; with
  // "beam_width" (and "length_penalty") it is a beam search, of max_tokens, ignore_eos and temperature
  "requests": [
    "The cat sat on the mat and looked at the door",
    {"prompt": "The cat sat on the mat and looked at the window", "arrive": 3, "max_tokens": 3}
  ],
  // the step the replay opens at: {"step": N}, or the nth step with an event (admitted, not_admitted,
  // prefix_hit, prefill_chunk, prefill_done, preempted, forked, copy_on_write, finished); "request": I counts
  // only request I's
  "focus": {"event": "prefix_hit", "nth": 1},
  // what to watch at that step: shown with the replay, in the summary and in the HTML export
  "look_for": "The second request joins at step 3 and finds its first prompt blocks in the prefix cache (the first request computed them): only the rest of its prompt is computed.",
  // the run is refused if it has not finished after this many steps (default 2000)
  "max_steps": 100
}
"""


def is_comment(line: str) -> bool:
    return line.lstrip().startswith("//")


def template_json() -> str:
    """The template without its comments: a scenario file."""
    return "".join(line for line in TEMPLATE.splitlines(keepends=True) if not is_comment(line))


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
            mark_focus(path, scenario, focus)
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
        raise ScenarioError(_("scenario {name!r}: {error}").format(name=scenario.name, error=e)) from None


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


def mark_focus(path: Path, scenario: Scenario, focus_step: int) -> None:
    """The scenario's step that matters and what to look for there, in the trace's header."""
    set_header_fields(path, focus_step=focus_step, look_for=scenario.look_for or None)


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
