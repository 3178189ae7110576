"""Where two traces of the same workload part ways: nanoengine beside vLLM v1, or two versions of
one engine.

    diff_traces(a, b) -> TraceDiff      # a, b: loaded traces (tracer.trace.trace_file.Trace)

Requests are matched by the order they were added (their seq_id rank), so two engines' seq_ids
need not agree. Block ids are compared after dropping a trace's reserved null block (vLLM's block
0), so block 1 of a vLLM trace is block 0 of nanoengine's. At each step, in order of importance:

    tokens     tokens scheduled per request (the schedule itself)
    admitted   who left the waiting queue
    preempted  the victims
    prefix_hit tokens each admitted request got from the prefix cache
    finished   who finished, and why
    blocks     each request's block table after the step

Each difference says what each side did and why, from that side's own step: the request's
counters, its events, the step's token budget and free blocks.

Block ids alone may differ: two engines (or free-list orders) can hand out other blocks for the
same decisions. A step's block difference is `ids_only` when every request's table there is the
other side's under one renaming of block ids (same lengths, same sharing); `decisions_differ()`
leaves those out, and `summary()` says it in one line per kind.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from nanoengine.sequence import EventKind
from tracer.trace.step_line import own_status_after

KINDS = ("tokens", EventKind.ADMITTED, EventKind.PREEMPTED, EventKind.PREFIX_HIT, EventKind.FINISHED, "blocks")


class DiffError(ValueError):
    """Two traces that are not runs of the same workload; the message is one line."""


@dataclass(frozen=True, slots=True)
class Difference:
    step: int
    kind: str  # one of KINDS
    request: int | None  # request index (add order), None for the whole step
    a: str  # what side A did, and why
    b: str
    ids_only: bool = False  # blocks: the tables are the other side's under one renaming of block ids


@dataclass(slots=True)
class TraceDiff:
    label_a: str
    label_b: str
    num_steps: tuple[int, int]
    differences: list[Difference] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # how the ids are compared, one sentence each

    @property
    def first(self) -> Difference | None:
        return self.differences[0] if self.differences else None

    def at(self, step: int) -> list[Difference]:
        return [d for d in self.differences if d.step == step]

    def steps(self) -> list[int]:
        return sorted({d.step for d in self.differences})

    def decisions_differ(self) -> bool:
        """Whether anything but block ids differs (a renaming of ids is no different decision)."""
        return self.num_steps[0] != self.num_steps[1] or any(not d.ids_only for d in self.differences)

    def schedule_differs(self) -> bool:
        """Whether the tokens scheduled per request per step differ anywhere (or the step counts)."""
        return self.num_steps[0] != self.num_steps[1] or any(d.kind == "tokens" for d in self.differences)


def engine_label(trace: Any) -> str:
    return str(trace.header.get("engine") or f"nanoengine {trace.header.get('nanoengine_version', '')}").strip()


def request_order(trace: Any) -> dict[int, int]:
    """seq_id -> request index (the order requests were added)."""
    return {sid: i for i, sid in enumerate(sorted(trace.requests))}


def null_blocks(trace: Any) -> list[int]:
    null = (trace.header.get("vllm") or {}).get("null_block_id")
    return [] if null is None else [int(null)]


def null_block_note(nulls: list[int], side: str) -> str:
    shown = ", ".join(map(str, nulls))
    return (
        f"{side}'s block ids are shown without its null block {shown} (vLLM's placeholder, never handed out): "
        f"its block {nulls[0] + 1} is shown as {nulls[0]}, so both sides count from 0"
    )


def check_same_workload(a: Any, b: Any) -> None:
    pa = [a.requests[s].get("prompt_token_ids") for s in sorted(a.requests)]
    pb = [b.requests[s].get("prompt_token_ids") for s in sorted(b.requests)]
    if len(pa) != len(pb):
        raise DiffError(f"the traces have {len(pa)} and {len(pb)} requests: diff two runs of the same workload")
    for i, (x, y) in enumerate(zip(pa, pb)):
        if x != y:
            raise DiffError(
                f"request {i} has different prompt tokens in the two traces: diff two runs of the same workload"
            )


@dataclass(slots=True)
class Side:
    """One trace's step, by request index."""

    trace: Any
    step: Mapping[str, Any] | None
    index: dict[int, int]  # seq_id -> request index
    nulls: list[int]
    prev: Mapping[str, Any] | None = None  # the step before

    def rows(self) -> dict[int, Mapping[str, Any]]:
        return {self.index[r["seq_id"]]: r for r in self.step["seqs"]} if self.step else {}

    def events(self, kind: str) -> dict[int, Mapping[str, Any]]:
        if not self.step:
            return {}
        return {self.index[e["seq_id"]]: e["detail"] for e in self.step["events"] if e["kind"] == kind}

    def scheduled(self) -> dict[int, int]:
        return {i: r["num_scheduled_tokens"] for i, r in self.rows().items() if r["num_scheduled_tokens"]}

    def block(self, b: int) -> int:
        """A block id without the reserved null blocks below it (vLLM's block 1 is nanoengine's 0)."""
        return b - sum(1 for n in self.nulls if n < b)

    def table(self, i: int) -> list[int]:
        row = self.rows().get(i)
        return [self.block(b) for b in row["block_table_after"]] if row is not None else []

    def blocks_why(self, i: int) -> str:
        table = self.table(i)
        if self.prev is None:
            return f"blocks {table}"
        free = [self.block(b) for b in self.prev["pool"]["free_block_ids"]]
        shown = ", ".join(map(str, free[:8])) + (", ..." if len(free) > 8 else "")
        return f"blocks {table}; free list before the step, head first: [{shown}]"

    def same_step(self, i: int, blocks: list[int]) -> str:
        """Whether a hit's blocks are written by another request in this very step (vLLM's same-step hit)."""
        assert self.step is not None
        inputs, bs = self.step["inputs"], self.step["pool"]["block_size"]
        qsl = inputs["query_start_loc"]
        writers = sorted(
            {
                self.index[sid]
                for k, sid in enumerate(inputs["seq_ids"])
                if self.index[sid] != i and any(s // bs in blocks for s in inputs["slot_mapping"][qsl[k] : qsl[k + 1]])
            }
        )
        return f" (same-step hit: request {', '.join(map(str, writers))} computes them in this step)" if writers else ""

    def budget(self) -> str:
        if not self.step:
            return "no such step (the run had ended)"
        cfg = self.trace.header["config"]
        used = sum(self.scheduled().values())
        free = len(self.step["pool"]["free_block_ids"])
        return f"step used {used}/{cfg['max_num_batched_tokens']} tokens, {plural(free, 'block')} free after it"

    def numbers(self, detail: Mapping[str, Any]) -> str:
        """A decision's recorded numbers (trace schema 3), in words: '3 blocks needed, 1 free',
        'for request 0, 0 blocks free'; '' for an event without them."""
        if isinstance(detail.get("need"), int) and isinstance(detail.get("free"), int):
            return f"{plural(detail['need'], 'block')} needed, {detail['free']} free"
        if detail.get("by") in self.index and isinstance(detail.get("free"), int):
            return f"for request {self.index[detail['by']]}, {plural(detail['free'], 'block')} free"
        return ""

    def why(self, i: int) -> str:
        """What request i did in this step and the step's state, in one phrase."""
        if not self.step:
            return "no such step (the run had ended)"
        row = self.rows().get(i)
        if row is None:
            return "not added yet"
        status = own_status_after(row)
        parts = [f"{plural(row['num_scheduled_tokens'], 'token')} from {row['num_cached_tokens']} cached, now {status}"]
        kinds = (
            EventKind.ADMITTED,
            EventKind.NOT_ADMITTED,
            EventKind.PREFIX_HIT,
            EventKind.PREEMPTED,
            EventKind.FINISHED,
        )
        for kind in kinds:
            detail = self.events(kind).get(i)
            if detail is None:
                continue
            numbers = self.numbers(detail)
            if numbers:
                parts.append(f"{kind} ({numbers})")
            elif kind == EventKind.PREFIX_HIT:
                parts.append(f"prefix hit {detail['tokens_saved']} tokens" + self.same_step(i, detail["blocks"]))
            elif kind == EventKind.FINISHED:
                parts.append(f"finished ({detail['reason']})")
            else:
                parts.append(kind)
        return "; ".join(parts) + f" ({self.budget()})"


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def event_key(kind: str, detail: Mapping[str, Any] | None) -> object:
    """What must agree about an event (block ids and wording may differ between engines)."""
    if detail is None:
        return None
    if kind == EventKind.PREFIX_HIT:
        return detail.get("tokens_saved")
    if kind == EventKind.FINISHED:
        return detail.get("reason")
    return True


def compare_step(n: int, a: Side, b: Side) -> Iterator[Difference]:
    sa, sb = a.scheduled(), b.scheduled()
    for i in sorted(set(sa) | set(sb)):
        if sa.get(i, 0) != sb.get(i, 0):
            yield Difference(n, "tokens", i, a.why(i), b.why(i))
    for kind in (EventKind.ADMITTED, EventKind.PREEMPTED, EventKind.PREFIX_HIT, EventKind.FINISHED):
        ea, eb = a.events(kind), b.events(kind)
        for i in sorted(set(ea) | set(eb)):
            if event_key(kind, ea.get(i)) != event_key(kind, eb.get(i)):
                yield Difference(n, kind, i, a.why(i), b.why(i))
    renamed = same_up_to_renaming(a, b)
    for i in sorted(set(a.rows()) | set(b.rows())):
        ta, tb = a.table(i), b.table(i)
        if ta != tb and (a.prev is None or b.prev is None or (prev_table(a, i), prev_table(b, i)) != (ta, tb)):
            yield Difference(n, "blocks", i, a.blocks_why(i), b.blocks_why(i), ids_only=renamed)


def same_up_to_renaming(a: Side, b: Side) -> bool:
    """Whether one renaming of block ids turns every request's table in A's step into B's."""
    forward: dict[int, int] = {}
    backward: dict[int, int] = {}
    for i in set(a.rows()) | set(b.rows()):
        ta, tb = a.table(i), b.table(i)
        if len(ta) != len(tb):
            return False
        for x, y in zip(ta, tb):
            if forward.setdefault(x, y) != y or backward.setdefault(y, x) != x:
                return False
    return True


def prev_table(side: Side, i: int) -> list[int]:
    """Request i's table after the previous step: a block difference is reported when it appears."""
    return Side(side.trace, side.prev, side.index, side.nulls).table(i)


def diff_traces(a: Any, b: Any) -> TraceDiff:
    check_same_workload(a, b)
    ia, ib = request_order(a), request_order(b)
    na, nb = null_blocks(a), null_blocks(b)
    result = TraceDiff(engine_label(a), engine_label(b), (len(a.steps), len(b.steps)))
    result.notes = [null_block_note(side, label) for side, label in ((na, "A"), (nb, "B")) if side]
    for n in range(max(len(a.steps), len(b.steps))):
        sa = a.steps[n] if n < len(a.steps) else None
        sb = b.steps[n] if n < len(b.steps) else None
        pa = a.steps[n - 1] if 0 < n <= len(a.steps) else None
        pb = b.steps[n - 1] if 0 < n <= len(b.steps) else None
        result.differences.extend(compare_step(n, Side(a, sa, ia, na, pa), Side(b, sb, ib, nb, pb)))
    return result


def summary(diff: TraceDiff) -> list[str]:
    """One line per kind of difference: how many, in how many steps, the first; block ids that
    differ only by a renaming are named as such."""
    lines = []
    if diff.num_steps[0] != diff.num_steps[1]:
        lines.append(f"steps: A takes {diff.num_steps[0]}, B {diff.num_steps[1]}")
    for kind in KINDS:
        for ids_only in (False, True):
            found = [d for d in diff.differences if d.kind == kind and d.ids_only == ids_only]
            if not found:
                continue
            first = found[0]
            who = "" if first.request is None else f" (request {first.request})"
            name = "block ids only (the same tables under a renaming)" if ids_only else kind
            steps = len({d.step for d in found})
            lines.append(
                f"{name}: {plural(len(found), 'difference')} in {plural(steps, 'step')}, first at step "
                f"{first.step}{who}"
            )
    return lines


def first_difference_line(diff: TraceDiff) -> str:
    """One sentence: where the two runs first part ways (or that they never do)."""
    d = diff.first
    if d is None:
        return f"{diff.label_a} and {diff.label_b} take the same decisions at every step ({diff.num_steps[0]} steps)"
    who = f"request {d.request}" if d.request is not None else "the step"
    ids = " (ids only: the same tables under a renaming)" if d.ids_only else ""
    return f"step {d.step}, {d.kind} of {who}{ids}: {diff.label_a}: {d.a} | {diff.label_b}: {d.b}"
