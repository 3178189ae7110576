"""Small helpers the rules share to read a step and word a message."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from nanoengine.sequence import EventKind, FinishReason
from tracer.trace.invariants.rule import Context
from tracer.trace.step_line import beam_width_of


def starts(ctx: Context) -> dict[int, int]:
    """Each batched sequence's offset into the flat token arrays."""
    qsl = ctx.step["inputs"]["query_start_loc"]
    return {sid: qsl[i] for i, sid in enumerate(ctx.batch)}


def batch_tokens(ctx: Context) -> Iterator[tuple[int, int, int]]:
    """(seq_id, flat index, offset inside the chunk) for every batched token."""
    for sid, start in starts(ctx).items():
        for offset in range(ctx.seqs[sid]["num_scheduled_tokens"]):
            yield sid, start + offset, offset


def short(values, limit: int = 8) -> str:
    """A list, cut after `limit` items (with the full length) so a message stays one line."""
    values = list(values)
    return str(values) if len(values) <= limit else f"[{', '.join(map(str, values[:limit]))}, ... ({len(values)})]"


def events_of(step: Mapping[str, Any], kind: EventKind) -> list[dict]:
    """The step's events of one kind, in order."""
    return [e for e in step["events"] if e["kind"] == kind]


def finished_with(step: Mapping[str, Any], reason: FinishReason) -> list[dict]:
    """The step's finished events with one finish reason."""
    return [e for e in events_of(step, EventKind.FINISHED) if e["detail"].get("reason") == reason]


def preempted(step: Mapping[str, Any]) -> list[int]:
    """The sequences the step preempted, in order."""
    return [e["seq_id"] for e in events_of(step, EventKind.PREEMPTED)]


def forked(step: Mapping[str, Any]) -> dict[int, int]:
    """The beams the step forked, each with the beam it was forked from. A fork happens after the
    step's forward: its row's counters before the step are its parent's, it took no part in the step."""
    return {e["seq_id"]: e["detail"].get("parent", -1) for e in events_of(step, EventKind.FORKED)}


def took_part(ctx: Context) -> dict[int, dict]:
    """The rows of the sequences that existed while the step ran (every one but the beams it forked)."""
    children = forked(ctx.step)
    return {sid: s for sid, s in ctx.seqs.items() if sid not in children} if children else ctx.seqs


def restarts(ctx: Context) -> set[int]:
    """The beams whose beam search the step restarted from its prompt: preempted and WAITING again (a
    beam unscheduled, its row's counters are its state after the step: back to its prompt)."""
    return {
        sid
        for sid in preempted(ctx.step)
        if sid in ctx.seqs and beam_width_of(ctx.seqs[sid]) and ctx.seqs[sid]["status_after"] == "WAITING"
    }
