"""A request's life: legal status edges, finish reasons, continuity from step to step, no leaked
blocks, the step's budget, and what preemption by recompute leaves behind."""

from __future__ import annotations

from nanoengine.sequence import EventKind, FinishReason
from tracer.i18n import N_
from tracer.trace.invariants.reading import forked, preempted, restarts, short
from tracer.trace.invariants.rule import Context, Findings, invariant

LIVE = ("WAITING", "RUNNING")
FINISH_FROM_WAITING = (FinishReason.ABORT, FinishReason.IGNORED)


@invariant(
    N_(
        "status changes only along legal edges (WAITING->RUNNING admitted, RUNNING->WAITING "
        "preempted, RUNNING->FINISHED, WAITING->FINISHED when aborted or ignored, or pruned right after "
        "its beam search's preemption)"
    ),
    field="status_after",
)
def status_edges(ctx: Context) -> Findings:
    events: dict[int, list[dict]] = {}
    for e in ctx.step["events"]:
        events.setdefault(e["seq_id"], []).append(e)
    for sid in events.keys() - ctx.seqs.keys():
        yield sid, f"an event names seq {sid}, which is not in the step"
    for sid, s in ctx.seqs.items():
        status, last = s["status_before"], None
        for e in events.get(sid, []):
            new = next_status(status, e, last)
            if new is None:
                reason = f" ({e['detail']['reason']})" if e["kind"] == EventKind.FINISHED else ""
                yield sid, f"seq {sid} cannot be {e['kind']}{reason} while {status}"
                break
            status, last = new, e["kind"]
        else:
            if status != s["status_after"]:
                yield (
                    sid,
                    f"seq {sid} went {s['status_before']} -> {s['status_after']}, but its events lead to {status}",
                )


def next_status(status: str, event: dict, last: str | None = None) -> str | None:
    """The status after an event (last: the sequence's event before it in the step), or None if the
    event is illegal in this status."""
    kind = event["kind"]
    if kind == EventKind.ADMITTED:
        return "RUNNING" if status == "WAITING" else None
    if kind == EventKind.PREEMPTED:
        return "WAITING" if status == "RUNNING" else None
    if kind == EventKind.NOT_ADMITTED:
        return status if status == "WAITING" else None
    if kind == EventKind.FINISHED:
        reason = event["detail"].get("reason")
        restart = reason == FinishReason.PRUNED and last == EventKind.PREEMPTED  # its search starts again
        if status == "RUNNING" or (status == "WAITING" and (reason in FINISH_FROM_WAITING or restart)):
            return "FINISHED"
        return None
    return status if status != "FINISHED" else None  # prefill_chunk / prefill_done / prefix_hit


@invariant(
    N_("a sequence has a finish_reason exactly when it is FINISHED"), checks=("Scheduler.finish",), field="status_after"
)
def finish_reason(ctx: Context) -> Findings:
    for sid, s in ctx.seqs.items():
        if (s["status_after"] == "FINISHED") != (s["finish_reason"] is not None):
            yield sid, f"seq {sid} is {s['status_after']} with finish_reason {s['finish_reason']!r}"


@invariant(
    N_(
        "each step starts where the previous one ended (status, num_tokens, num_prompt_tokens); a new sequence "
        "starts WAITING, or RUNNING if it is a beam forked in the step"
    )
)
def continuity(ctx: Context) -> Findings:
    if ctx.prev is None:
        return
    children, restarted = forked(ctx.step), restarts(ctx)
    for sid, s in ctx.seqs.items():
        p = ctx.prev.get(sid)
        if p is None:
            want = "RUNNING" if sid in children else "WAITING"
            if s["status_before"] != want:
                yield sid, f"seq {sid} first appears {s['status_before']}, not {want}"
            continue
        if sid in children:
            yield sid, f"seq {sid} was listed before the step that forked it"
        for now, before in (
            ("status_before", "status_after"),
            ("num_tokens", "num_tokens_after"),
            ("num_prompt_tokens", "num_prompt_tokens"),
        ):
            if s[now] != p[before] and not (now == "num_tokens" and sid in restarted):
                yield (
                    sid,
                    f"seq {sid} starts the step with {now} = {s[now]!r} but ended the previous step with {p[before]!r}",
                )
    for sid in ctx.prev.keys() - ctx.seqs.keys():
        yield sid, f"seq {sid} was listed in the previous step but is missing now"


@invariant(
    N_("a FINISHED sequence holds no blocks"), checks=("Scheduler.finish", "BlockManager.free"), field="block_table"
)
def finished_holds_no_blocks(ctx: Context) -> Findings:
    for sid, s in ctx.seqs.items():
        if s["status_after"] == "FINISHED" and s["block_table_after"]:
            yield sid, f"seq {sid} is FINISHED but still holds blocks {short(s['block_table_after'])}"


@invariant(N_("when no sequence is live, every block is free (no leaked blocks)"))
def no_leak(ctx: Context) -> Findings:
    if any(s["status_after"] in LIVE for s in ctx.seqs.values()):
        return
    held = [b for b, ref in enumerate(ctx.step["pool"]["ref_counts"]) if ref != 0]
    if held:
        yield None, f"no sequence is live but blocks {short(held)} still have non-zero ref counts (leaked)"


@invariant(
    N_("a step schedules at most max_num_batched_tokens tokens and max_num_seqs sequences"),
    checks=("Scheduler.schedule", "Scheduler.try_admit"),
)
def token_budget(ctx: Context) -> Findings:
    total = len(ctx.step["inputs"]["input_ids"])
    budget = ctx.config.get("max_num_batched_tokens")
    if budget is not None and total > budget:
        yield None, f"the step computes {total} tokens, over max_num_batched_tokens = {budget}"
    max_seqs = ctx.config.get("max_num_seqs")
    running = sum(1 for s in ctx.seqs.values() if s["status_after"] == "RUNNING")
    if max_seqs is not None and max(len(ctx.batch), running) > max_seqs:
        yield None, f"{len(ctx.batch)} sequences run and {running} are RUNNING, over max_num_seqs = {max_seqs}"


@invariant(
    N_("a preempted sequence ends the step WAITING with no blocks and num_cached_tokens 0"),
    checks=("Scheduler.recompute_later", "Scheduler.preempt"),  # preempt resets each sequence in recompute_later
    field="num_cached_tokens",
)
def preempt_resets(ctx: Context) -> Findings:
    for sid in preempted(ctx.step):
        s = ctx.seqs.get(sid)
        if s is None or s["status_after"] == "FINISHED" or sid in ctx.batch:
            continue  # re-admitted in the same step, or finished: other checks cover it
        if s["block_table_after"] or s["num_cached_tokens_after"] != 0:
            yield (
                sid,
                f"seq {sid} was preempted but ends the step with num_cached_tokens = "
                f"{s['num_cached_tokens_after']} and blocks {short(s['block_table_after'])}; recompute "
                f"starts from nothing",
            )
