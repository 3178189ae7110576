"""nanoengine's chosen behaviour, not paged-KV correctness: which request is preempted, where it
waits, who is admitted first, when EOS stops a request and when an abort lands. Another engine
(vLLM) may choose differently and still be correct: the correctness profile leaves these out."""

from __future__ import annotations

from nanoengine.sequence import EventKind, FinishReason
from tracer.i18n import N_
from tracer.trace.invariants.reading import events_of, finished_with, preempted, short
from tracer.trace.invariants.rule import Context, Findings, invariant
from tracer.trace.step_line import beam_width_of, queues_of, request_of


@invariant(
    N_(
        "preemption takes the newest running sequence first (the end of the running list), with the other "
        "live beams of its beam search"
    ),
    checks=("choose_victim", "Scheduler.make_room"),
)
def victim_policy(ctx: Context) -> Findings:
    victims = preempted(ctx.step)
    queues = queues_of(ctx.step)
    if not victims or queues is None:
        return
    aborted = {e["seq_id"] for e in finished_with(ctx.step, FinishReason.ABORT)}
    running = [sid for sid in queues["running"] if sid not in aborted]  # aborts take effect before scheduling
    units = victim_units(ctx, running, len(victims))
    want = [sid for unit in units for sid in unit]
    starts = [sum(map(len, units[:i])) for i in range(len(units))]
    taken = [set(victims[start : start + len(unit)]) for start, unit in zip(starts, units)]
    if len(victims) != len(want) or taken != [set(unit) for unit in units]:  # a unit's beams in any order
        yield (
            victims[0],
            f"the step preempted seqs {victims} from running list {list(queues['running'])}; the newest "
            f"first would be {want}",
        )


def victim_units(ctx: Context, running: list[int], num_victims: int) -> list[list[int]]:
    """What the victim policy preempts, newest first, until num_victims are taken: each time the newest
    running sequence, with the other beams of its beam search (a unit goes as a whole), newest first."""
    units: list[list[int]] = []
    left = list(running)
    while left and sum(map(len, units)) < num_victims:
        newest = ctx.seqs.get(left[-1])
        unit = [left[-1]]
        if newest is not None and beam_width_of(newest):
            unit += [sid for sid in left[-2::-1] if sid in ctx.seqs and beam_of(ctx.seqs[sid], request_of(newest))]
        units.append(unit)
        left = [sid for sid in left if sid not in unit]
    return units


def beam_of(row: dict, request_id: int) -> bool:
    return beam_width_of(row) > 0 and request_of(row) == request_id


@invariant(
    N_("preempted sequences wait at the head of the waiting queue, the last preempted first"),
    checks=("Scheduler.recompute_later", "Scheduler.preempt"),
)
def preempted_to_head(ctx: Context) -> Findings:
    queues = queues_of(ctx.step)
    if not ctx.preempted_before or queues is None:
        return
    want = ctx.preempted_before[::-1]
    head = list(queues["waiting"][: len(want)])
    if head != want:
        yield (
            want[0],
            f"the previous step preempted seqs {ctx.preempted_before}, so the waiting queue must start "
            f"with {want}; it is {short(queues['waiting'])}",
        )


@invariant(
    N_("a step admits from the head of the waiting queue, in order (its own preempted ones first)"),
    checks=("Scheduler.schedule", "Scheduler.try_admit"),
)
def admission_order(ctx: Context) -> Findings:
    queues = queues_of(ctx.step)
    admitted = [e["seq_id"] for e in events_of(ctx.step, EventKind.ADMITTED)]
    if not admitted or queues is None:
        return
    # The queue as the admission loop found it: this step's preempted sequences went to the head.
    finished = {e["seq_id"] for e in events_of(ctx.step, EventKind.FINISHED)}
    queue = [
        sid for sid in preempted(ctx.step)[::-1] + list(queues["waiting"]) if sid in admitted or sid not in finished
    ]
    if admitted != queue[: len(admitted)]:
        yield (
            admitted[0],
            f"the step admitted seqs {admitted}, but the waiting queue it admitted from was {short(queue)}: "
            f"admission takes the head first",
        )


@invariant(
    N_(
        "sampling an EOS id (unless ignore_eos) or a stop_token_ids entry, once min_tokens were made, "
        "finishes the sequence with 'stop'; a 'stop' without one needs a stop string"
    ),
    checks=("Scheduler.check_stop", "LLMEngine.check_stop_strings"),
)
def eos_finish(ctx: Context) -> Findings:
    eos = ctx.eos_token_ids
    if eos is None:
        return
    stopped = {e["seq_id"] for e in finished_with(ctx.step, FinishReason.STOP)}
    for sid, s in ctx.seqs.items():
        if not s["new_token_ids"] and sid not in stopped:
            continue
        params = ctx.params.get(sid)
        if params is None or "ignore_eos" not in params:
            continue
        stop_ids = set(params.get("stop_token_ids", ())) | (set() if params["ignore_eos"] else set(eos))
        made = s["num_tokens_after"] - s["num_prompt_tokens"]
        last = s["new_token_ids"][-1] if s["new_token_ids"] else None
        sampled_stop = last in stop_ids and made >= params.get("min_tokens", 0)
        if sampled_stop and sid not in stopped:
            yield (
                sid,
                f"seq {sid} sampled stop id {last} (EOS or stop_token_ids) but did not finish "
                f"with 'stop' (it is {s['status_after']}, reason {s['finish_reason']!r})",
            )
        elif sid in stopped and not sampled_stop and not params.get("stop"):
            what = "ignores EOS" if params["ignore_eos"] and s["new_token_ids"] else "sampled no EOS id"
            yield sid, f"seq {sid} finished with 'stop' but {what} and has no stop strings or stop token"


@invariant(N_("an abort takes effect in the step it was requested for"))
def abort_step(ctx: Context) -> Findings:
    for e in finished_with(ctx.step, FinishReason.ABORT):
        requested = e["detail"].get("requested_step", ctx.step["step"])  # absent: aborted outside a step
        if requested != ctx.step["step"]:
            yield (
                e["seq_id"],
                f"seq {e['seq_id']}'s abort was requested for step {requested} but took effect in step "
                f"{ctx.step['step']}",
            )
