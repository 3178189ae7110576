"""A beam search in the replay: its beams as one group in the sequences panel (each beam's parent,
the search's beam_width, a pruned beam marked ✂), the step's copy-on-write copies, and each beam's
cumulative logprob, summed over the steps, for the why of a pruning.

The trace's fields (docs/trace-format.md), read with tracer/trace/step_line.py's readers: a row's
parent_id and beam_width, the step's blocks_to_copy. A trace without them replays as before: its
rows are not beams.

    beams_of(rows) -> {seq_id: Beam}          the beams among a step's rows
    beam_label(beam) -> '<A#0 ├0'             what the sequences panel writes after a beam's tag
    in_group_order(rows) -> rows              each beam search's rows together, in seq_id order
    BeamScores().at(steps, index) -> {seq_id: cumulative logprob after step index}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from nanoengine.sequence import EventKind, FinishReason
from tracer.replay.colors import seq_tag
from tracer.trace.step_line import beam_width_of, parent_of, request_of

PRUNED_MARK = "✂"  # a pruned beam's row: a symbol, not colour alone
COPY_MARK = "⧉"  # a KV block made by copy-on-write this step (it is written too)
FINISHED = "FINISHED"
Row = TypeVar("Row", bound=Mapping[str, Any])


@dataclass(frozen=True, slots=True)
class Beam:
    request_id: int
    index: int  # among the search's rows in the step, by seq_id
    count: int  # the search's rows in the step (live and finished beams)
    width: int  # beam_width
    parent: int | None  # the beam it was forked from
    pruned: bool


def is_pruned(row: Mapping[str, Any]) -> bool:
    return row.get("finish_reason") == FinishReason.PRUNED.value


def beams_of(rows: Iterable[Mapping[str, Any]]) -> dict[int, Beam]:
    """seq_id -> its place in its beam search, for the rows with a beam_width."""
    groups: dict[int, list[Mapping[str, Any]]] = {}
    for row in rows:
        if beam_width_of(row):
            groups.setdefault(request_of(row), []).append(row)
    found = {}
    for request_id, members in groups.items():
        members.sort(key=lambda r: r["seq_id"])
        for i, row in enumerate(members):
            parent = parent_of(row)
            beam = Beam(
                request_id, i, len(members), beam_width_of(row), parent if parent >= 0 else None, is_pruned(row)
            )
            found[row["seq_id"]] = beam
    return found


def beam_label(beam: Beam | None) -> str:
    """'<A#0 ├0 ✂': the parent's tag (a forked beam), a bracket joining the search's rows with its
    request, beam_width on the first row ('┌0 k=3'), ✂ for a pruned beam; '' for a row that is no beam."""
    if beam is None:
        return ""
    parent = f"<{seq_tag(beam.parent)}" if beam.parent is not None else ""
    if beam.count == 1:
        bracket = "─"
    else:
        bracket = "┌" if beam.index == 0 else ("└" if beam.index == beam.count - 1 else "├")
    width = f" k={beam.width}" if beam.index == 0 else ""
    pruned = f" {PRUNED_MARK}" if beam.pruned else ""
    return f"{parent} {bracket}{beam.request_id}{width}{pruned}"


def in_group_order(rows: Sequence[Row]) -> list[Row]:
    """The rows by seq_id, except that a beam forked later (a higher seq_id than other requests')
    comes right after the rest of its search: the bracket joins rows that stand together."""
    return sorted(rows, key=lambda r: (request_of(r) if beam_width_of(r) else r["seq_id"], r["seq_id"]))


def is_live_beam(row: Mapping[str, Any]) -> bool:
    """A beam the step touched: not finished before it."""
    return bool(beam_width_of(row)) and row.get("status_before") != FINISHED


def score_step(scores: Mapping[int, float], step: Mapping[str, Any]) -> dict[int, float]:
    """The beams' cumulative logprobs after step, from those before it: a beam adds its new tokens'
    logprobs (the token its rewrite chose: the row's), a beam forked in the step starts from its
    parent's, a preempted one (its search restarts from the prompt) from 0. A beam whose history is
    not known (its row lacks logprobs) is left out."""
    events = step.get("events", [])
    forked = {e["seq_id"]: e["detail"].get("parent") for e in events if e["kind"] == EventKind.FORKED}
    restarted = {e["seq_id"] for e in events if e["kind"] == EventKind.PREEMPTED}
    after: dict[int, float] = {}
    rows = {row["seq_id"]: row for row in step.get("seqs", [])}
    for seq_id, row in rows.items():
        if not is_live_beam(row):
            continue
        if seq_id in restarted:  # the search starts again from its prompt; the other beams are dropped
            if row.get("status_after") != FINISHED:
                after[seq_id] = 0.0
            continue
        if seq_id in forked:
            parent = forked[seq_id] if isinstance(forked[seq_id], int) else parent_of(row)
            base = score_before(scores, parent, rows.get(parent, {}))
        else:
            base = score_before(scores, seq_id, row)
        logprobs = row.get("new_token_logprobs")
        if base is None or (row.get("new_token_ids") and not logprobs):
            continue
        after[seq_id] = base + sum(logprobs or [])
    return after


def score_before(scores: Mapping[int, float], seq_id: int, row: Mapping[str, Any]) -> float | None:
    """A beam's cumulative logprob at the start of the step: 0 for one that starts its search in it
    (from WAITING: its prompt alone), None when its history is not known."""
    if seq_id in scores:
        return scores[seq_id]
    return 0.0 if row.get("status_before") == "WAITING" else None


class BeamScores:
    """Each beam's cumulative logprob after a step, summed from the start of its search (the steps
    are read back only as far as a step without a live beam), kept once computed: a step written
    does not change, though a growing trace's steps object may be replaced."""

    def __init__(self) -> None:
        self.after: dict[int, dict[int, float]] = {}

    def at(self, steps: Sequence[dict], index: int) -> dict[int, float]:
        start = index
        while start >= 0 and start not in self.after and any(map(is_live_beam, steps[start].get("seqs", []))):
            start -= 1
        scores = self.after.get(start, {})
        for i in range(start + 1, index + 1):
            scores = score_step(scores, steps[i])
            self.after[i] = scores
        return scores


def has_pruning(step: Mapping[str, Any]) -> bool:
    """Whether a beam was pruned in the step (its why has numbers to give)."""
    return any(
        e["kind"] == EventKind.FINISHED and (e.get("detail") or {}).get("reason") == FinishReason.PRUNED.value
        for e in step.get("events", [])
    )
