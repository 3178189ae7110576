"""The trace carries the engine code behind its events: the header holds each decision function's
source once (a lesson's swapped-in function as the student's own code), and each event names the
lines that emitted it, so the replay can show them without the engine's source."""

from __future__ import annotations

from nanoengine.sampling_params import SamplingParams
from nanoengine.scheduler import SchedulerOutput
from nanoengine.sequence import EventKind
from tests.conftest import make_tiny_engine
from tracer.teach.swap import plugged
from tracer.trace.invariants.rule import REGISTRY, rule_named
from tracer.trace.recorder import TraceRecorder
from tracer.trace.sources import ENGINE_FUNCTIONS
from tracer.trace.step_line import SeqRow
from tracer.trace.trace_file import load_trace


def record_preemption(path, **swaps):
    """Two requests in a pool too small for both: the newer one is preempted."""
    engine = make_tiny_engine(num_kv_blocks=6, block_size=4, max_num_batched_tokens=64)
    with plugged(swaps), TraceRecorder(engine, path):
        for prompt in ([5] * 9, [6] * 9):
            engine.add_request(prompt, SamplingParams(max_tokens=8, ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
    return load_trace(path, validate="all")


def line_of(source: dict, line: int) -> str:
    return source["source"].splitlines()[line - source["line"]]


def events_of(trace, kind: str) -> list[dict]:
    return [e for step in trace.steps for e in step["events"] if e["kind"] == kind]


def test_each_event_names_the_engine_lines_that_emitted_it(tmp_path):
    trace = record_preemption(tmp_path / "t.jsonl")
    sources = trace.header["sources"]
    assert set(sources) <= set(ENGINE_FUNCTIONS) and "Scheduler.preempt" in sources
    preempt = sources["Scheduler.preempt"]
    assert preempt["file"] == "nanoengine/scheduler.py" and preempt["engine"] is True
    assert preempt["source"].startswith("def preempt(")
    (event, *_) = events_of(trace, EventKind.PREEMPTED)
    (emitter, emitter_line), (caller, caller_line), *_ = event["where"]
    assert (emitter, caller) == ("Scheduler.preempt", "Scheduler.make_room")
    assert "add_event(EventKind.PREEMPTED" in line_of(preempt, emitter_line)
    assert "self.preempt(" in line_of(sources["Scheduler.make_room"], caller_line)
    for kind in (EventKind.ADMITTED, EventKind.PREFILL_CHUNK, EventKind.FINISHED):
        for event in events_of(trace, kind):
            name, line = event["where"][0]
            assert f"EventKind.{kind.name}" in line_of(sources[name], line), (kind, name, line)


def test_a_swapped_in_function_is_recorded_as_it_was_run(tmp_path):
    def choose_victim(running):
        """The newest: a student's own."""
        return running[-1]

    trace = record_preemption(tmp_path / "t.jsonl", choose_victim=choose_victim)
    mine = trace.header["sources"]["choose_victim"]
    assert mine["engine"] is False and mine["file"] == "trace/test_sources.py"
    assert '"""The newest: a student\'s own."""' in mine["source"]
    assert not any(s["file"].startswith("/") for s in trace.header["sources"].values())  # no home folder
    assert trace.header["sources"]["Scheduler.preempt"]["engine"] is True


def test_recording_patches_nothing_in_the_engine(tmp_path):
    """Each event carries where it was emitted from the engine itself: no recorder wraps add_event."""
    before = SchedulerOutput.add_event
    record_preemption(tmp_path / "t.jsonl")
    assert SchedulerOutput.add_event is before


def test_an_engine_without_a_recorder_notes_where_each_event_was_emitted():
    engine = make_tiny_engine(num_kv_blocks=6, block_size=4, max_num_batched_tokens=64)
    records = []
    engine.add_step_hook(records.append)
    for prompt in ([5] * 9, [6] * 9):
        engine.add_request(prompt, SamplingParams(max_tokens=8, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    preempted = [e for r in records for e in r.events if e.kind == EventKind.PREEMPTED]
    assert preempted and [code.co_name for code, _ in preempted[0].where] == ["preempt", "make_room", "schedule_unit"]


def test_what_an_invariant_says_it_checks_is_named_as_the_trace_names_it():
    for rule in REGISTRY:
        assert set(rule.checks) <= set(ENGINE_FUNCTIONS), rule.name
        assert rule.field in ("", *SeqRow.__annotations__), rule.name
    # the reset and the requeueing live in recompute_later, which preempt calls for each sequence
    assert rule_named("preempt_resets").checks == ("Scheduler.recompute_later", "Scheduler.preempt")
