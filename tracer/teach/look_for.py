"""What to look for at the step that matters, in words true for the run on screen.

A scenario's "look_for" text is written for the model it names (the lessons': the tiny one).
Another model tokenizes, samples and stops otherwise, so its steps and sequences differ; the text
is then derived from the recorded trace: what that run did at its focus step, by name.

    look_for(run) -> str                    a demo run's text, always from its trace
    lesson_look_for(trace, scenario) -> str a lesson's own text on its own model, else from the trace
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from collections.abc import Sequence as SequenceOf
from typing import Any

from nanoengine.sequence import EventKind
from tracer.replay.colors import seq_letter
from tracer.teach.scenarios import Scenario, ScenarioRun


def who(seq_id: int) -> str:
    return f"seq {seq_id} ({seq_letter(seq_id)})"


def block_list(blocks: list[int]) -> str:
    if len(blocks) > 3 and blocks == list(range(blocks[0], blocks[0] + len(blocks))):
        return f"blocks {blocks[0]}-{blocks[-1]}"
    return f"block{'s' if len(blocks) != 1 else ''} {', '.join(map(str, blocks))}"


def plural(n: object, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


# ---- one event, in words ---------------------------------------------------------------------
def preempted_text(e: Mapping[str, Any], step: int) -> str:
    d = e.get("detail") or {}
    needed = re.search(r"seq (\d+) needed", str(d.get("reason", "")))  # a trace before `by`
    by = d.get("by", int(needed.group(1)) if needed else None)
    needer = who(by) if isinstance(by, int) else "a running request"
    return (
        f"Step {step}: {needer} needs a new KV block and none is free, so the newest running request, "
        f"{who(e['seq_id'])}, is preempted: its blocks go back to the pool and it waits at the head of "
        f"the queue, to be recomputed later (press n to see it return)."
    )


def prefix_hit_text(e: Mapping[str, Any], step: int) -> str:
    d = e.get("detail") or {}
    return (
        f"Step {step}: {who(e['seq_id'])} is admitted with a prefix hit: its block table starts with "
        f"{block_list(d.get('blocks') or [])}, already in the cache and now shared, so "
        f"{d.get('tokens_saved')} prompt tokens are not computed again; only the rest of its prompt is."
    )


def prefill_chunk_text(e: Mapping[str, Any], step: int) -> str:
    d = e.get("detail") or {}
    return (
        f"Step {step}: {who(e['seq_id'])}'s {d.get('num_tokens')}-token prompt is prefilled in chunks "
        f"(this is chunk {d.get('chunk')}, tokens {d.get('start')} up to {d.get('end')}) "
        f"that fill the token budget, while the short requests keep decoding one token per step; its "
        f"sampled token is discarded until the last chunk."
    )


def finished_text(e: Mapping[str, Any], step: int, after: Mapping[str, Any] | None) -> str:
    admitted = [x["seq_id"] for x in (after or {}).get("events", []) if x["kind"] == EventKind.ADMITTED]
    then = (
        f"in step {after['step']} {who(admitted[0])} takes its place"
        if after and admitted
        else "in the next steps a waiting request takes its place"
    )
    return (
        f"Step {step}: {who(e['seq_id'])} finishes; {then}. In static batching its place would stay "
        f"empty until the whole batch is done."
    )


def event_phrase(e: Mapping[str, Any], seqs: Mapping[int, Mapping[str, Any]]) -> str:
    """One event of a step as a short phrase: 'seq 0 (A) finishes with reason length (3 tokens generated)'."""
    d, sid = e.get("detail") or {}, e["seq_id"]
    kind = e["kind"]
    if kind == EventKind.FINISHED:
        row = seqs.get(sid, {})
        generated = row.get("num_tokens_after", 0) - row.get("num_prompt_tokens", 0)
        return f"{who(sid)} finishes with reason '{d.get('reason')}' ({plural(generated, 'token')} generated)"
    if kind == EventKind.ADMITTED:
        return f"{who(sid)} is admitted"
    if kind == EventKind.PREEMPTED:
        by = d.get("by")
        return f"{who(sid)} is preempted" + (f" for {who(by)}" if isinstance(by, int) else "")
    if kind == EventKind.PREFIX_HIT:
        return f"{who(sid)} gets {d.get('tokens_saved')} prompt tokens from the prefix cache"
    if kind == EventKind.PREFILL_CHUNK:
        return f"{who(sid)} prefills tokens {d.get('start')} up to {d.get('end')} of {d.get('num_tokens')}"
    if kind == EventKind.PREFILL_DONE:
        return f"{who(sid)}'s prompt is complete after {plural(d.get('chunks'), 'chunk')}"
    if kind == EventKind.NOT_ADMITTED:
        return f"{who(sid)} waits (needs {d.get('need')} blocks, {d.get('free')} free)"
    return f"{kind} {who(sid)}"


def step_text(step: Mapping[str, Any]) -> str:
    """What one step did, every event by name, and who is still running after it."""
    seqs = {r["seq_id"]: r for r in step.get("seqs", [])}
    phrases = [event_phrase(e, seqs) for e in step.get("events", [])]
    running = [who(sid) for sid, r in seqs.items() if r.get("status_after") == "RUNNING"]
    if not phrases:
        scheduled = [f"{who(sid)} {r['num_scheduled_tokens']}" for sid, r in seqs.items() if r["num_scheduled_tokens"]]
        phrases = [f"tokens computed: {', '.join(scheduled) or 'none'}"]
    still = f" Still running after it: {', '.join(running)}." if running else " Nothing is running after it."
    return f"Step {step['step']}: " + "; ".join(phrases) + "." + still


# ---- a whole run -----------------------------------------------------------------------------
def focus_steps(
    steps: SequenceOf[Mapping[str, Any]], focus_step: int | None
) -> tuple[Mapping[str, Any], Mapping[str, Any] | None] | None:
    """The focus step's line and the one after it (None at the end); None if it is not recorded."""
    index = {s["step"]: i for i, s in enumerate(steps)}
    if focus_step not in index:
        return None
    i = index[focus_step]
    return steps[i], steps[i + 1] if i + 1 < len(steps) else None


def look_for(run: ScenarioRun) -> str:
    """The "Look for" text of a demo run, naming the steps and sequences this trace shows (they
    differ between the tiny and the real model); the scenario's fixed text when none match."""
    from tracer.trace.trace_file import load_trace

    if run.trace_path is None:
        return run.scenario.look_for
    found = focus_steps(load_trace(run.trace_path, validate="none").steps, run.focus_step)
    kind = run.scenario.focus.get("event")
    if found is None or not kind:
        return run.scenario.look_for
    focus, after = found
    e = next((x for x in focus["events"] if x["kind"] == kind), None)  # the first of its kind
    if e is None:
        return run.scenario.look_for
    texts = {
        EventKind.PREEMPTED: lambda: preempted_text(e, focus["step"]),
        EventKind.PREFIX_HIT: lambda: prefix_hit_text(e, focus["step"]),
        EventKind.PREFILL_CHUNK: lambda: prefill_chunk_text(e, focus["step"]),
        EventKind.FINISHED: lambda: finished_text(e, focus["step"], after),
    }
    return texts[kind]() if kind in texts else run.scenario.look_for


def names_of(model: str) -> tuple[str, ...]:
    """What a trace header calls a scenario's model ('default' is recorded by its name)."""
    from nanoengine.loading.checkpoint import DEFAULT_MODEL

    return (model, DEFAULT_MODEL) if model in ("default", DEFAULT_MODEL) else (model,)


def lesson_look_for(trace: Any, scenario: Scenario) -> str:
    """The lesson's own text when the trace ran the model it was written for; otherwise what this
    trace's focus step did, said so."""
    model = str(trace.header.get("model") or "")
    if not scenario.look_for or model in names_of(scenario.model):
        return scenario.look_for
    found = focus_steps(trace.steps, trace.header.get("focus_step"))
    if found is None:
        return ""
    return (
        f"(on {model}; the lesson's own text is written for the {scenario.model} model, which tokenizes, "
        f"samples and stops otherwise) " + step_text(found[0])
    )
