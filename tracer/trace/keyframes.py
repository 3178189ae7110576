"""Step lines as keyframes and changes (schema version 4): the recorder writes only what a step
changed; a reader rebuilds the whole step (docs/trace-format.md, "Keyframes and changes").

A whole step (what every reader sees: step_line.StepLine) lists every request seen so far and the
whole pool, so writing it at every step made a trace grow with steps x requests. A version-4 line is

    a keyframe (the first step, then every KEYFRAME_EVERY steps): `"keyframe": true`, every
        sequence not yet finished plus those finished since the last keyframe, and the pool's
        ref_counts, hashes and free_block_ids;
    a change (any other step): the sequences the engine listed in the step (running at its start,
        scheduled, named by an event, changed), and the pool's `changed` blocks
        ([id, ref_count, hash]) and free-list change (`free_removed` and `free_added` at its tail,
        or the whole `free_block_ids` when it changed otherwise).

A sequence a line does not list is idle in that step (step_line.idle_row of its last row); a
finished one is listed by exactly one keyframe (the first at or after its finish), so a reader
finds it there. The pool's owners and filled are derived from the rows (step_line.pool_layout),
never written. Rebuilding step N: the keyframe at or before it, the finished rows of the keyframes
before that, and the changes up to N: at most KEYFRAME_EVERY lines, or one from step N - 1.

    DeltaWriter().line(full_line, listed) -> the line to write
    RebuiltSteps(raw_lines, marks, path) -> Sequence of whole step dicts (what Trace.steps holds)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracer.trace.step_line import SeqRow, StepLine, idle_row, pool_layout
from tracer.trace.trace_file import CachedSteps, StepMarks, TraceError

KEYFRAME_EVERY = 64


# ---- writing --------------------------------------------------------------------------------------
@dataclass(slots=True)
class DeltaWriter:
    """Turns each whole step line, in step order, into the line a version-4 trace holds."""

    every: int = KEYFRAME_EVERY
    since_keyframe: int = 0
    archived: set[int] = field(default_factory=set)  # finished at the last keyframe, listed by one, not since
    just_archived: list[int] = field(default_factory=list)  # those the last line's keyframe archived
    pool: tuple[Sequence[int], Sequence[int | None], Sequence[int]] | None = None  # the last line's

    def line(self, whole: StepLine, listed: Collection[int]) -> dict[str, Any]:
        """listed: the seq_ids the engine reported in this step (their rows may have changed)."""
        keyframe = self.pool is None or self.since_keyframe + 1 >= self.every
        pool = whole["pool"]
        self.archived.difference_update(listed)  # written again: the next keyframe lists it again
        if keyframe:
            rows = [r for r in whole["seqs"] if r["seq_id"] not in self.archived]
            self.just_archived = [r["seq_id"] for r in rows if r["status_after"] == "FINISHED"]
            self.archived.update(self.just_archived)
            pool_part: dict[str, Any] = {
                "block_size": pool["block_size"],
                "ref_counts": pool["ref_counts"],
                "hashes": pool["hashes"],
                "free_block_ids": pool["free_block_ids"],
            }
            self.since_keyframe = 0
        else:
            rows = [r for r in whole["seqs"] if r["seq_id"] in listed]
            self.just_archived = []
            pool_part = self.pool_change(pool["block_size"], pool["ref_counts"], pool["hashes"], pool["free_block_ids"])
            self.since_keyframe += 1
        self.pool = (pool["ref_counts"], pool["hashes"], pool["free_block_ids"])
        head: dict[str, Any] = {"type": "step", "step": whole["step"]}
        if keyframe:
            head["keyframe"] = True  # right after the step number: a reader finds it without parsing the line
        rest = {key: value for key, value in whole.items() if key not in head}
        return {**head, **rest, "seqs": rows, "pool": pool_part}

    def pool_change(
        self, block_size: int, ref_counts: Sequence[int], hashes: Sequence[int | None], free: Sequence[int]
    ) -> dict[str, Any]:
        assert self.pool is not None
        old_refs, old_hashes, old_free = self.pool
        changed = changed_blocks(tuple(old_refs), tuple(old_hashes), tuple(ref_counts), tuple(hashes))
        return {"block_size": block_size, "changed": changed, **free_list_change(old_free, free)}


CHUNK = 256  # blocks compared at once: most of a big pool is the same from step to step


def changed_blocks(
    old_refs: tuple[int, ...], old_hashes: tuple[int | None, ...], refs: tuple[int, ...], hashes: tuple[int | None, ...]
) -> list[list[Any]]:
    """[block id, ref count, hash] of each block whose ref count or hash changed; whole chunks are
    compared first (in C), block by block only where a chunk differs."""
    if len(refs) != len(old_refs):
        return [[b, r, h] for b, (r, h) in enumerate(zip(refs, hashes))]
    changed = []
    for start in range(0, len(refs), CHUNK):
        end = start + CHUNK
        if refs[start:end] != old_refs[start:end] or hashes[start:end] != old_hashes[start:end]:
            changed += [
                [b, refs[b], hashes[b]]
                for b in range(start, min(end, len(refs)))
                if refs[b] != old_refs[b] or hashes[b] != old_hashes[b]
            ]
    return changed


def free_list_change(old: Sequence[int], new: Sequence[int]) -> dict[str, list[int]]:
    """The free list's change as the block manager makes it: blocks taken from anywhere in it
    (free_removed) and blocks freed onto its tail (free_added, a block taken and freed again in one
    step too); the whole new list when that is shorter."""
    old, new = tuple(old), tuple(new)
    if new == old:
        return {}
    removed, kept = taken_from_head(old, new) or taken_anywhere(old, new)
    change = {"free_removed": removed, "free_added": list(new[kept:])}
    if len(change["free_removed"]) + len(change["free_added"]) > len(new):
        return {"free_block_ids": list(new)}
    return {key: ids for key, ids in change.items() if ids}


def taken_from_head(old: tuple[int, ...], new: tuple[int, ...]) -> tuple[list[int], int] | None:
    """The usual step: blocks taken off the head, others freed onto the tail. (removed, how long a
    head of new is old's rest), found in C; None for any other change."""
    try:
        first = old.index(new[0]) if new else len(old)
    except ValueError:
        return None
    rest = len(old) - first
    return (list(old[:first]), rest) if new[:rest] == old[first:] else None


def taken_anywhere(old: tuple[int, ...], new: tuple[int, ...]) -> tuple[list[int], int]:
    """(removed, how long a head of new is old with those blocks taken out), block by block."""
    position = {b: i for i, b in enumerate(old)}
    last, kept = -1, 0
    for b in new:
        i = position.get(b, -1)
        if i <= last:
            break
        last, kept = i, kept + 1
    still = set(new[:kept])
    return [b for b in old if b not in still], kept


# ---- reading --------------------------------------------------------------------------------------
@dataclass(slots=True)
class Cursor:
    """The state after one line: each sequence's last written row, the pool's lists."""

    index: int
    rows: dict[int, SeqRow]
    listed: set[int]  # the sequences the line itself lists (the others are idle)
    block_size: int
    ref_counts: list[int]
    hashes: list[int | None]
    free: list[int]


class RebuiltSteps(CachedSteps):
    """The whole step dicts of a version-4 trace, rebuilt from its lines when used; the last
    CACHE_STEPS rebuilt stay. raw: the parsed lines (a list, or a LineSteps parsing each when used);
    marks: one StepMarks per line (which lines are keyframes), growing with raw for a followed file."""

    def __init__(self, raw: Sequence[dict], marks: list[StepMarks], path: Path) -> None:
        self.raw = raw
        self.marks = marks
        self.shown_path = path
        self.cache: OrderedDict[int, dict] = OrderedDict()
        self.cursor: Cursor | None = None
        self.finished: dict[int, list[tuple[int, SeqRow]]] = {}  # seq_id -> (keyframe index, row) listing it
        self.keyframes_read = 0  # lines before this one have given their keyframes' finished rows

    @property
    def path(self) -> Path:
        return self.shown_path

    @path.setter
    def path(self, path: Path) -> None:
        """The name errors give the file (a live session shows a .partial file by its final name)."""
        self.shown_path = path
        if hasattr(self.raw, "path"):
            self.raw.path = path

    def __len__(self) -> int:
        return len(self.raw)

    def make(self, index: int) -> dict:
        return self.rebuild(index)

    def rebuild(self, index: int) -> dict:
        start = self.keyframe_before(index)
        cursor = self.cursor
        if cursor is None or not start <= cursor.index <= index:
            cursor = self.start_at(start)
        while cursor.index < index:
            cursor = self.advance(cursor, cursor.index + 1)
        self.cursor = cursor
        return whole_step(cursor, self.raw[index])

    def keyframe_before(self, index: int) -> int:
        """The index of the last keyframe at or before index."""
        for i in range(index, -1, -1):
            if self.marks[i].keyframe:
                return i
        raise self.error(index, "is a change to the step before it, but no keyframe comes before it")

    def start_at(self, index: int) -> Cursor:
        line = self.raw[index]
        pool = line["pool"]  # whole: the loader checked a keyframe's pool fields (trace_file.check_required)
        rows = self.finished_before(index)
        rows.update((r["seq_id"], r) for r in line["seqs"])
        return Cursor(
            index,
            rows,
            {r["seq_id"] for r in line["seqs"]},
            pool["block_size"],
            list(pool["ref_counts"]),
            list(pool["hashes"]),
            list(pool["free_block_ids"]),
        )

    def finished_before(self, index: int) -> dict[int, SeqRow]:
        """The finished rows the keyframes before index list, the latest for each sequence."""
        for i in range(self.keyframes_read, index):
            if self.marks[i].keyframe:
                for row in self.raw[i]["seqs"]:
                    if row["status_after"] == "FINISHED":
                        self.finished.setdefault(row["seq_id"], []).append((i, row))
        self.keyframes_read = max(self.keyframes_read, index)
        found = {}
        for seq_id, listings in self.finished.items():
            before = [row for i, row in listings if i < index]
            if before:
                found[seq_id] = before[-1]
        return found

    def advance(self, cursor: Cursor, index: int) -> Cursor:
        """The state after line index, from the state after the line before it."""
        line = self.raw[index]
        if line.get("keyframe") is True:
            return self.start_at(index)  # the same state as walking to it, whichever way it is reached
        cursor.rows.update((r["seq_id"], r) for r in line["seqs"])
        cursor.listed = {r["seq_id"] for r in line["seqs"]}
        self.apply_pool_change(cursor, index, line["pool"])
        cursor.index = index
        return cursor

    def apply_pool_change(self, cursor: Cursor, index: int, change: dict) -> None:
        num_blocks = len(cursor.ref_counts)
        for entry in change["changed"]:
            if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], int)):
                raise self.error(index, f"has a pool change {str(entry)[:40]} that is not [block id, ref count, hash]")
            block, ref_count, block_hash = entry
            if not 0 <= block < num_blocks:
                raise self.error(index, f"changes block {block}, outside the pool's 0 .. {num_blocks - 1}")
            cursor.ref_counts[block], cursor.hashes[block] = ref_count, block_hash
        if "free_block_ids" in change:
            cursor.free = list(change["free_block_ids"])
            return
        if removed := set(change.get("free_removed", ())):
            cursor.free = [b for b in cursor.free if b not in removed]
        cursor.free.extend(change.get("free_added", ()))

    def error(self, index: int, what: str) -> TraceError:
        return TraceError(f"{self.path}: line {index + 2} {what}: the file is damaged")


def whole_step(cursor: Cursor, line: dict) -> dict:
    """The step as a version-3 line held it: every sequence seen so far (idle where the line does not
    list it), the whole pool with its layout."""
    seqs = [dict(row) if seq_id in cursor.listed else idle_row(row) for seq_id, row in sorted(cursor.rows.items())]
    pool: dict[str, Any] = {
        "block_size": cursor.block_size,
        "ref_counts": list(cursor.ref_counts),
        "hashes": list(cursor.hashes),
        "free_block_ids": list(cursor.free),
    }
    pool.update(pool_layout(seqs, pool))  # type: ignore[arg-type]
    parts = {"seqs": seqs, "pool": pool}
    return {key: parts.get(key, value) for key, value in line.items() if key != "keyframe"}
