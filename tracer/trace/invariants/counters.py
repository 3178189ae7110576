"""Each sequence's token counters agree with each other and with the batch."""

from __future__ import annotations

from collections import Counter

from tracer.i18n import N_
from tracer.trace.invariants.rule import Context, Findings, invariant
from tracer.trace.step_line import scheduled_after


@invariant(
    N_("num_scheduled_tokens is 0 outside a step (the *_after state)"),
    checks=("Scheduler.postprocess",),
    field="num_scheduled_tokens",
)
def scheduled_zero_after(ctx: Context) -> Findings:
    for sid, s in ctx.seqs.items():
        after = scheduled_after(s)
        if after != 0:
            yield (
                sid,
                f"seq {sid} still has num_scheduled_tokens = "
                f"{after} after the step; it must be reset to 0 once the step is done",
            )


@invariant(
    N_("the batch holds exactly the sequences with num_scheduled_tokens > 0, once each"),
    checks=("Scheduler.schedule",),
    field="num_scheduled_tokens",
)
def batch_membership(ctx: Context) -> Findings:
    for sid, n in Counter(ctx.batch).items():
        if n > 1:
            yield sid, f"seq {sid} appears {n} times in the batch"
        if sid not in ctx.seqs:
            yield sid, f"seq {sid} is in the batch but not in the step's sequences"
    for sid, s in ctx.seqs.items():
        scheduled = s["num_scheduled_tokens"]
        if scheduled < 0 or (scheduled > 0) != (sid in ctx.batch):
            where = "is in" if sid in ctx.batch else "is not in"
            yield sid, f"seq {sid} has num_scheduled_tokens = {scheduled} but {where} the batch"


@invariant(N_("num_cached_tokens <= num_tokens, before and after the step"), field="num_cached_tokens")
def cached_le_tokens(ctx: Context) -> Findings:
    for sid, s in ctx.seqs.items():
        for when, cached, total in (
            ("during", s["num_cached_tokens"], s["num_tokens"]),
            ("after", s["num_cached_tokens_after"], s["num_tokens_after"]),
        ):
            if not 0 <= cached <= total:
                yield sid, f"seq {sid} has num_cached_tokens = {cached} {when} the step but only {total} tokens"


@invariant(N_("num_cached_tokens + num_scheduled_tokens <= num_tokens"), field="num_scheduled_tokens")
def scheduled_within_tokens(ctx: Context) -> Findings:
    for sid, s in ctx.seqs.items():
        end = s["num_cached_tokens"] + s["num_scheduled_tokens"]
        if end > s["num_tokens"]:
            yield sid, f"seq {sid} schedules tokens up to {end} but has only {s['num_tokens']} tokens"
