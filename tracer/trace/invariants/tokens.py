"""What a step computes and samples: discarded mid-prefill logits, one new token per finished
prefill or decode, and the cache advancing by what was computed."""

from __future__ import annotations

from nanoengine.sequence import FinishReason
from tracer.i18n import N_
from tracer.trace.invariants.reading import forked, restarts
from tracer.trace.invariants.rule import Context, Findings, invariant


@invariant(N_("a sequence is discarded (mid-prefill) exactly when seq_lens < num_tokens"))
def mid_prefill_discard(ctx: Context) -> Findings:
    inp = ctx.step["inputs"]
    for sid, seq_len, discard in zip(ctx.batch, inp["seq_lens"], inp["discard"]):
        mid = seq_len < ctx.seqs[sid]["num_tokens"]
        if bool(discard) != mid:
            state = "mid-prefill" if mid else "complete"
            yield (
                sid,
                f"seq {sid} is {state} ({seq_len} of {ctx.seqs[sid]['num_tokens']} tokens) but discard = {discard}",
            )


@invariant(
    N_(
        "a mid-prefill, unscheduled or failed sequence gains no token; a finished prefill or decode gains exactly "
        "one, and so does a beam forked in the step (its own last token)"
    )
)
def token_gain(ctx: Context) -> Findings:
    children = forked(ctx.step)
    for sid, s in ctx.seqs.items():
        gained = len(s["new_token_ids"])
        scheduled = s["num_scheduled_tokens"]
        failed = s["finish_reason"] == FinishReason.ERROR  # its step failed: nothing was sampled
        complete = scheduled > 0 and s["num_cached_tokens"] + scheduled >= s["num_tokens"] and not failed
        if gained != (1 if complete or sid in children else 0):
            why = (
                "finished its prefill or decoded"
                if complete
                else "was forked in this step: it starts with its own last token"
                if sid in children
                else "its step failed"
                if failed
                else "is mid-prefill: its logits must be discarded"
                if scheduled
                else "was not scheduled"
            )
            yield sid, f"seq {sid} gained {gained} tokens but {why}"


@invariant(
    N_(
        "num_tokens_after == num_tokens + the new tokens (a beam search restarted by a preemption: its first beam "
        "goes back to its prompt)"
    ),
    field="num_tokens",
)
def token_growth(ctx: Context) -> Findings:
    restarted = restarts(ctx)
    for sid, s in ctx.seqs.items():
        gained = len(s["new_token_ids"])
        if sid in restarted:
            if s["num_tokens_after"] != s["num_prompt_tokens"] or gained:
                yield (
                    sid,
                    f"seq {sid}, a beam search's first beam, was preempted: its search restarts from the "
                    f"{s['num_prompt_tokens']} prompt tokens, but it ends the step with {s['num_tokens_after']}",
                )
        elif s["num_tokens_after"] != s["num_tokens"] + gained:
            yield sid, f"seq {sid} went from {s['num_tokens']} to {s['num_tokens_after']} tokens but gained {gained}"
        if "new_token_texts" in s and len(s["new_token_texts"]) != gained:
            yield sid, f"seq {sid} has {gained} new tokens but {len(s['new_token_texts'])} new token texts"


@invariant(
    N_(
        "a scheduled sequence ends the step with num_cached_tokens + num_scheduled_tokens cached "
        "(unless its step failed: finish_reason error)"
    )
)
def cached_advance(ctx: Context) -> Findings:
    for sid, s in ctx.seqs.items():
        if s["num_scheduled_tokens"] == 0 or s["finish_reason"] == FinishReason.ERROR:  # a failed step computed nothing
            continue
        want = s["num_cached_tokens"] + s["num_scheduled_tokens"]
        if s["num_cached_tokens_after"] != want:
            yield (
                sid,
                f"seq {sid} computed tokens up to {want} but ends the "
                f"step with num_cached_tokens = {s['num_cached_tokens_after']}",
            )
