"""Checks for lesson 6: schedule."""

from nanoengine.scheduler import Scheduler, SchedulerOutput
from nanoengine.sequence import SequenceStatus
from tracer.i18n import _
from tracer.teach.kit import (
    add_sequences,
    batch_of,
    event_kinds,
    expect,
    expect_engine_matches,
    lesson_scenario,
    make_scheduler,
    make_sequence,
)

TARGETS = {"schedule": "Scheduler.schedule"}


def make(
    budget: int = 16, max_num_seqs: int = 4, num_kv_blocks: int = 32
) -> Scheduler:
    return make_scheduler(
        num_kv_blocks, budget=budget, max_num_seqs=max_num_seqs
    )


def step(fns, sched: Scheduler) -> SchedulerOutput:
    """Your schedule(), then the engine's postprocess() with a made-up token per sequence."""
    out = fns.schedule(sched)
    expect(
        isinstance(out, SchedulerOutput),
        _("schedule must return a SchedulerOutput, got {out!r}").format(
            out=out
        ),
    )
    sched.postprocess(out, [50] * len(out.seqs))
    return out


def batch_now(
    fns, sched: Scheduler
) -> tuple[SchedulerOutput, list[tuple[str, int]]]:
    out = fns.schedule(sched)
    expect(
        isinstance(out, SchedulerOutput),
        _("schedule must return a SchedulerOutput, got {out!r}").format(
            out=out
        ),
    )
    return out, batch_of(out)


def check_admits_a_waiting_request(fns):
    """A lone waiting request is admitted with its whole prompt."""
    sched = make()
    (a,) = add_sequences(sched, 6)
    out, got = batch_now(fns, sched)
    expect(
        got == [("A", 6)],
        _(
            "one 6-token request waiting, budget 16: expected batch "
            "[('A', 6)], got {got}"
        ).format(got=got),
    )
    expect(
        a.status == SequenceStatus.RUNNING and sched.running == [a],
        _("A must now be RUNNING, in self.running"),
    )


def check_running_before_waiting(fns):
    """Running sequences are scheduled first (1 decode token each), then new ones are admitted."""
    sched = make()
    add_sequences(sched, 6, names="A")
    step(fns, sched)
    add_sequences(sched, 5, names="B")
    out, got = batch_now(fns, sched)
    expect(
        got == [("A", 1), ("B", 5)],
        _(
            "A is decoding and B just arrived: expected [('A', 1), "
            "('B', 5)], got {got}"
        ).format(got=got),
    )


def check_token_budget(fns):
    """The step never schedules more than max_num_batched_tokens; the last admission gets a chunk."""
    sched = make(budget=16)
    add_sequences(sched, 10, 10, 10)
    out, got = batch_now(fns, sched)
    expect(
        got == [("A", 10), ("B", 6)],
        _(
            "budget 16, three 10-token prompts: expected [('A', 10), "
            "('B', 6)] (B gets a 6-token chunk, C waits), got {got}"
        ).format(got=got),
    )


def check_passes_the_budget_left(fns):
    """schedule_tokens is given the budget left before each sequence (its chunk's event records it)."""
    sched = make(budget=16)
    add_sequences(sched, 10, 10, 10)
    out, got = batch_now(fns, sched)
    budgets = [
        e.detail.get("budget") for e in out.events if e.kind == "prefill_chunk"
    ]
    expect(
        budgets == [16, 6],
        _(
            "budget 16, three 10-token prompts: A's chunk starts "
            "with 16 tokens of budget left, B's with 6; the "
            "prefill_chunk events recorded {budgets}. Pass "
            "schedule_tokens the budget as it is before you take the "
            "sequence's tokens off it"
        ).format(budgets=budgets),
    )


def check_continues_a_chunked_prefill(fns):
    """A running sequence mid-prefill gets the rest of its prompt, up to the budget."""
    sched = make(budget=16)
    add_sequences(sched, 10, 10)
    step(fns, sched)  # A 10, B 6
    out, got = batch_now(fns, sched)
    expect(
        got == [("A", 1), ("B", 4)],
        _(
            "B has 4 prompt tokens left: expected [('A', 1), ('B', "
            "4)], got {got}"
        ).format(got=got),
    )


def check_max_num_seqs(fns):
    """No more than max_num_seqs sequences run at once."""
    sched = make(max_num_seqs=2)
    add_sequences(sched, 3, 3, 3)
    out, got = batch_now(fns, sched)
    expect(
        [n for n, _ in got] == ["A", "B"],
        _(
            "max_num_seqs=2 and three short requests: only A and B "
            "may run, got {got}"
        ).format(got=got),
    )


def check_fifo_no_overtaking(fns):
    """If the head of the queue does not fit, nothing behind it is admitted either."""
    sched = make(budget=64, num_kv_blocks=4)  # 4 blocks of 4 = 16 tokens of KV
    add_sequences(sched, 12, names="A")
    step(fns, sched)  # A holds 3 blocks (4 after it grows)
    add_sequences(
        sched, 12, 2, names="BC"
    )  # B needs 3 blocks: does not fit; C would
    out, got = batch_now(fns, sched)
    expect(
        got == [("A", 1)],
        _(
            "B does not fit, so C must wait behind it (first come, "
            "first served); got {got}"
        ).format(got=got),
    )


def check_stops_when_budget_is_spent(fns):
    """Running sequences beyond the budget wait for the next step."""
    sched = make(budget=16)
    add_sequences(sched, 4, 4, 4)
    step(fns, sched)  # all three prefilled: 12 tokens
    sched.max_num_batched_tokens = 2
    out, got = batch_now(fns, sched)
    expect(
        got == [("A", 1), ("B", 1)],
        _(
            "budget 2 with three decoding sequences: expected [('A', "
            "1), ('B', 1)], got {got}"
        ).format(got=got),
    )


def check_uses_make_room(fns):
    """When a running sequence needs a block and none is free, the newest one is preempted (make_room)."""
    sched = make(budget=64, num_kv_blocks=4)
    add_sequences(sched, 8, 8)  # 2 blocks each: the pool is full
    step(fns, sched)
    out, got = batch_now(fns, sched)  # A's 9th token needs a 3rd block
    preempted = [seq for seq in out.seqs if seq in out.preempted]
    if preempted:
        name = batch_of(out)[out.seqs.index(preempted[0])][0]
        raise AssertionError(
            _(
                "{name} was preempted by make_room earlier in this same "
                "pass (its status is now {value}), but your loop went on "
                "to schedule it: {got}. Skip a sequence whose status is "
                "no longer RUNNING (the loop walks a copy, "
                "list(self.running))"
            ).format(name=name, value=preempted[0].status.value, got=got)
        )
    expect(
        "preempted" in event_kinds(out),
        _(
            "the pool is full and A needs a block, but nothing was "
            "preempted: call self.make_room(seq, num_new, out) "
            "before allocating; expected [('A', 1)], got {got}"
        ).format(got=got),
    )
    expect(
        got == [("A", 1)],
        _(
            "the pool is full and A needs a block: B must be "
            "preempted; expected [('A', 1)], got {got}"
        ).format(got=got),
    )
    expect(
        event_kinds(out) == ["preempted"],
        _("expected one 'preempted' event, got {events}").format(
            events=out.events
        ),
    )


def check_admits_nobody_in_a_step_that_preempted(fns):
    """A step that had to preempt admits nobody, not even the victim (vLLM v1's rule)."""
    sched = make(budget=64, num_kv_blocks=5)
    a = make_sequence(8, name="A", max_tokens=50, ignore_eos=True)
    b = make_sequence(a.token_ids, name="B", max_tokens=50, ignore_eos=True)
    sched.add(a)
    sched.add(b)
    for _i in range(8):
        out = step(fns, sched)
        kinds = event_kinds(out)
        if "preempted" in kinds:
            break
    expect(
        "preempted" in kinds,
        _(
            "A and B fill the pool, so within 8 steps A needs a "
            "block and B is preempted; nothing was"
        ),
    )
    expect(
        "admitted" not in kinds and sched.waiting and sched.waiting[0] is b,
        _(
            "B was preempted, yet this same step admitted it again "
            "(most of its blocks are shared, so it fit). A step that "
            "preempted must admit nobody: the pool is short, what "
            "comes in would be pushed out again. Skip pass 2 after a "
            "'preempted' event"
        ),
    )


def engine_lesson_scenario(fns):
    """The engine, running the lesson's scenario with your schedule, matches the engine's own."""
    expect_engine_matches(lesson_scenario(__file__))


def engine_tight_memory(fns):
    """With a small pool (preemptions) and a budget of 5 it still matches."""
    run = expect_engine_matches(
        lesson_scenario(
            __file__,
            engine={
                "block_size": 4,
                "num_kv_blocks": 7,
                "max_num_seqs": 3,
                "max_num_batched_tokens": 5,
            },
        )
    )
    expect(
        run.event_counts["preempted"] >= 1,
        _("this run should preempt a request; none was preempted"),
    )
