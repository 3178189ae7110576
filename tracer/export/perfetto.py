"""A trace as a Chrome Trace Event file, the JSON that Perfetto UI (ui.perfetto.dev) and
chrome://tracing open: `nanoengine export FILE --perfetto OUT.json` (docs/export.md).

    perfetto_trace(trace, steps=None, logical=False) -> dict     {"traceEvents": [...], ...}

Two processes. "engine" holds one thread, the engine step: a slice per step with two children,
the host work (schedule, flatten the batch, postprocess: wall_time - model_time) and the model
(forward + sampling: model_time), and the counter tracks (free KV blocks, running and waiting
sequences, batched tokens). "sequences" holds one thread per sequence: a slice per step it was
in the batch ("prefill chunk k" or "decode", with num_tokens, num_cached_tokens,
num_scheduled_tokens and the block table as args), a "waiting" slice while it queued, instant
events for admission, prefix hits, preemption and finish, and a flow arrow from each preemption
to the prefill that re-admitted it.

Timestamps are whole microseconds (the trace's resolution; integers keep every child slice
exactly inside its parent). Recorded: the steps laid end to end by their wall_time (the time
between steps, the recorder's own, is not in the trace). Logical: one step = 1 ms.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from nanoengine.sequence import EventKind, FinishReason
from tracer.trace.trace_file import Trace

ENGINE_PID, SEQS_PID = 1, 2
STEP_TID = 1
LOGICAL_STEP_US = 1000
MAX_STEP_S = 86400.0  # the schema's bound on a step's times: no timestamp runs past what viewers hold
MAX_TID = 2**31 - 1  # viewers keep thread ids in 32 bits


def seq_tid(seq_id: int) -> int:
    """Thread ids start at 1 (some viewers treat tid 0 specially); tid = seq_id + 1."""
    if not isinstance(seq_id, int) or not 0 <= seq_id < MAX_TID:
        raise ValueError(f"seq_id {seq_id!r} cannot be a timeline thread (0 .. {MAX_TID - 1}): the trace is damaged")
    return seq_id + 1


def step_seconds(step: dict, key: str) -> float:
    """A step's wall_time or model_time, refused (ValueError) unless a number of seconds in 0 .. MAX_STEP_S."""
    value = step.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_STEP_S:
        raise ValueError(
            f"step {step.get('step')!r} has {key} {value!r}: not a step's time in seconds (0 .. {MAX_STEP_S:g}); "
            "the trace is damaged"
        )
    return float(value)


@dataclass(slots=True)
class StepClock:
    """Where each step starts, how long it lasts and how long its model part takes, in whole
    microseconds (the trace's resolution): integer sums keep a child slice exactly inside its step."""

    starts: list[int]
    durations: list[int]
    model_durations: list[int]

    @property
    def end(self) -> int:
        return self.starts[-1] + self.durations[-1] if self.starts else 0


def step_clock(steps: Sequence[dict], logical: bool) -> StepClock:
    starts, durations, models, now = [], [], [], 0
    for step in steps:
        wall, model = step_seconds(step, "wall_time"), step_seconds(step, "model_time")
        duration = LOGICAL_STEP_US if logical else round(wall * 1e6)
        fraction = min(1.0, model / wall) if wall > 0 else 0.0
        starts.append(now)
        durations.append(duration)
        models.append(round(duration * fraction))
        now += duration
    return StepClock(starts, durations, models)


@dataclass(slots=True)
class SeqTrack:
    """What one sequence's track needs carried from step to step."""

    waiting_since: int | None = None  # start of the open "waiting" slice
    preemptions: list[int] = field(default_factory=list)  # flow ids not yet ended by a re-admission


def perfetto_trace(trace: Trace, steps: Sequence[dict] | None = None, logical: bool = False) -> dict:
    """The Chrome Trace Event JSON object for the given steps (default: all of the trace)."""
    steps = trace.steps if steps is None else steps
    clock = step_clock(steps, logical)
    events: list[dict] = process_metadata(trace)
    tracks: dict[int, SeqTrack] = {}
    next_flow = [1]
    for i, step in enumerate(steps):
        ts, dur = clock.starts[i], clock.durations[i]
        events += engine_step_events(step, ts, dur, clock.model_durations[i])
        events += counter_events(step, ts)
        for seq in step.get("seqs", []):
            if seq["seq_id"] not in tracks:
                tracks[seq["seq_id"]] = SeqTrack()
                events += seq_metadata(seq["seq_id"], trace.requests.get(seq["seq_id"], {}))
            events += seq_step_events(step, seq, tracks[seq["seq_id"]], ts, dur, next_flow)
    for seq_id, track in tracks.items():  # still queued when the steps end
        if track.waiting_since is not None:
            events.append(slice_event("waiting", "seq", SEQS_PID, seq_tid(seq_id), track.waiting_since, clock.end))
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "source": str(trace.path.name),
            "model": trace.header.get("model", "?"),
            "title": trace.title or "",
            "timestamps": "logical: 1 step = 1 ms" if logical else "recorded wall_time, steps laid end to end",
            "steps": f"{steps[0]['step']}-{steps[-1]['step']}" if len(steps) else "none",
        },
    }


# ---- metadata ------------------------------------------------------------------------------
def metadata(name: str, pid: int, tid: int, args: dict) -> dict:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}


def process_metadata(trace: Trace) -> list[dict]:
    config = trace.header.get("config", {})
    label = (
        f"engine · {trace.header.get('model', '?')} · block_size {config.get('block_size', '?')} · "
        f"budget {config.get('max_num_batched_tokens', '?')} tokens"
    )
    return [
        metadata("process_name", ENGINE_PID, 0, {"name": label}),
        metadata("process_sort_index", ENGINE_PID, 0, {"sort_index": 0}),
        metadata("thread_name", ENGINE_PID, STEP_TID, {"name": "engine step"}),
        metadata("process_name", SEQS_PID, 0, {"name": "sequences"}),
        metadata("process_sort_index", SEQS_PID, 0, {"sort_index": 1}),
    ]


def seq_metadata(seq_id: int, request: dict) -> list[dict]:
    prompt = " ".join(str(request.get("prompt", "")).split())
    short = prompt if len(prompt) <= 40 else prompt[:39] + "…"
    tid = seq_tid(seq_id)
    return [
        metadata("thread_name", SEQS_PID, tid, {"name": f"seq {seq_id}" + (f": {short}" if short else "")}),
        metadata("thread_sort_index", SEQS_PID, tid, {"sort_index": seq_id}),
    ]


# ---- the engine track --------------------------------------------------------------------
def slice_event(name: str, cat: str, pid: int, tid: int, start: int, end: int, args: dict | None = None) -> dict:
    event = {"name": name, "cat": cat, "ph": "X", "ts": start, "dur": max(0, end - start), "pid": pid, "tid": tid}
    if args is not None:
        event["args"] = args
    return event


def engine_step_events(step: dict, ts: int, dur: int, model_dur: int) -> list[dict]:
    inputs = step.get("inputs", {})
    host = dur - model_dur
    args = {
        "step": step["step"],
        "wall_time_ms": round(step_seconds(step, "wall_time") * 1e3, 3),
        "model_time_ms": round(step_seconds(step, "model_time") * 1e3, 3),
        "num_seqs": len(inputs.get("seq_ids", [])),
        "batched_tokens": len(inputs.get("input_ids", [])),
        "events": [f"{e['kind']} seq {e['seq_id']}" for e in step.get("events", [])],
    }
    return [
        slice_event(f"step {step['step']}", "engine", ENGINE_PID, STEP_TID, ts, ts + dur, args),
        # The host part also holds prepare_inputs and postprocess, which the trace does not time apart.
        slice_event("schedule + bookkeeping", "engine", ENGINE_PID, STEP_TID, ts, ts + host),
        slice_event("model forward + sample", "engine", ENGINE_PID, STEP_TID, ts + host, ts + dur),
    ]


def counter_events(step: dict, ts: int) -> list[dict]:
    """The counters for the step that starts at ts: its batch, and the pool and queue it left."""
    inputs, pool = step.get("inputs", {}), step.get("pool", {})
    waiting = sum(1 for s in step.get("seqs", []) if s.get("status_after") == "WAITING")
    values = {
        "KV pool": {"free blocks": len(pool.get("free_block_ids", []))},
        "sequences": {"running": len(inputs.get("seq_ids", [])), "waiting": waiting},
        "batch": {"batched tokens": len(inputs.get("input_ids", []))},
    }
    return [
        {"name": name, "cat": "counter", "ph": "C", "ts": ts, "pid": ENGINE_PID, "tid": STEP_TID, "args": args}
        for name, args in values.items()
    ]


# ---- a sequence's track ------------------------------------------------------------------
def seq_step_events(step: dict, seq: dict, track: SeqTrack, ts: int, dur: int, next_flow: list[int]) -> list[dict]:
    seq_id, tid = seq["seq_id"], seq_tid(seq["seq_id"])
    kinds = {e["kind"]: e for e in step.get("events", []) if e["seq_id"] == seq_id}
    scheduled = seq_id in step.get("inputs", {}).get("seq_ids", [])
    out: list[dict] = []
    if track.waiting_since is not None and (scheduled or seq.get("status_after") != "WAITING"):
        if ts > track.waiting_since:
            out.append(slice_event("waiting", "seq", SEQS_PID, tid, track.waiting_since, ts))
        track.waiting_since = None
    for kind, event in kinds.items():
        if kind in (EventKind.ADMITTED, EventKind.PREFIX_HIT, EventKind.PREEMPTED, EventKind.FINISHED):
            detail = event.get("detail") or {}
            out.append(instant_event(kind.replace("_", " "), tid, ts + dur * happens_late(kind, detail), detail))
    if scheduled:
        chunk = kinds.get(EventKind.PREFILL_CHUNK)
        name = f"prefill chunk {chunk['detail'].get('chunk', 1)}" if chunk else "decode"
        out.append(slice_event(name, "seq", SEQS_PID, tid, ts, ts + dur, seq_args(step, seq)))
        if chunk and track.preemptions:  # the re-admission: end the arrows from its preemptions
            out += [flow_event("f", flow_id, tid, ts + dur // 2) for flow_id in track.preemptions]
            track.preemptions.clear()
    elif EventKind.PREEMPTED in kinds:
        detail = kinds[EventKind.PREEMPTED].get("detail") or {}
        flow_id = next_flow[0]
        next_flow[0] += 1
        track.preemptions.append(flow_id)
        out.append(slice_event(EventKind.PREEMPTED, "seq", SEQS_PID, tid, ts, ts + dur, seq_args(step, seq) | detail))
        out.append(flow_event("s", flow_id, tid, ts + dur // 2))
        track.waiting_since = ts + dur
    elif seq.get("status_after") == "WAITING" and track.waiting_since is None:
        track.waiting_since = ts
    return out


def happens_late(kind: str, detail: dict) -> bool:
    """schedule() admits, hits and preempts at a step's start; postprocess() finishes at its end
    (an abort takes effect before schedule())."""
    return kind == EventKind.FINISHED and detail.get("reason") != FinishReason.ABORT


def seq_args(step: dict, seq: dict) -> dict:
    return {
        "step": step["step"],
        "num_tokens": seq.get("num_tokens"),
        "num_cached_tokens": seq.get("num_cached_tokens"),
        "num_scheduled_tokens": seq.get("num_scheduled_tokens"),
        "block_table": seq.get("block_table"),
        "new_token_texts": seq.get("new_token_texts", []),
        "status": f"{seq.get('status_before')} -> {seq.get('status_after')}",
    }


def instant_event(name: str, tid: int, ts: int, args: dict) -> dict:
    return {"name": name, "cat": "event", "ph": "i", "s": "t", "ts": ts, "pid": SEQS_PID, "tid": tid, "args": args}


def flow_event(phase: str, flow_id: int, tid: int, ts: int) -> dict:
    """A flow arrow's end: "s" starts inside the preempted slice, "f" ends inside the re-admitting one."""
    event = {"name": "preempted → re-admitted", "cat": "preemption", "ph": phase, "id": flow_id, "ts": ts}
    event |= {"pid": SEQS_PID, "tid": tid}
    if phase == "f":
        event["bp"] = "e"  # bind to the enclosing slice, not the next one
    return event
