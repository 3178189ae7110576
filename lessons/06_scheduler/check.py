"""Checks for lesson 6: schedule and schedule_unit."""

from nanoengine.scheduler import Scheduler, SchedulerOutput
from nanoengine.sequence import SequenceStatus
from tracer.i18n import _
from tracer.teach.kit import (
    add_request,
    add_sequences,
    batch_of,
    event_kinds,
    expect,
    expect_engine_matches,
    fork_beams,
    lesson_scenario,
    make_beam_search,
    make_scheduler,
    make_sequence,
    names,
)

TARGETS = {
    "schedule": "Scheduler.schedule",
    "schedule_unit": "Scheduler.schedule_unit",
}


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
            "preempted: in schedule_unit, call self.make_room(unit, "
            "num_new, out) before allocating; expected [('A', 1)], "
            "got {got}"
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


def beams_after_prefill(fns, budget: int = 16) -> tuple[Scheduler, list]:
    """A (5 tokens) and the beam search B (6 tokens, 3 beams) prefilled by your
    schedule, then B forked as the engine does: B, B1, B2 share blocks [2, 3]
    and each writes position 6 next, in block 3."""
    sched = make(budget=budget)
    add_sequences(sched, 5, names="A")
    sched.add(make_beam_search(6, 3, name="B"))
    out, got = batch_now(fns, sched)
    expect(
        got == [("A", 5), ("B", 6)],
        _(
            "a 5-token request A and a 6-token beam search B, budget 16: "
            "expected both prefilled, [('A', 5), ('B', 6)], got {got}"
        ).format(got=got),
    )
    sched.postprocess(out, [50] * len(out.seqs))
    return sched, fork_beams(sched, sched.running[1])


def check_a_beam_search_is_one_unit(fns):
    """A beam search's beams are scheduled together, each once (unit_of)."""
    sched, beams = beams_after_prefill(fns)
    out, got = batch_now(fns, sched)
    twice = sorted({n for n in names(out.seqs) if names(out.seqs).count(n) > 1})
    expect(
        not twice,
        _(
            "{twice} went into the batch more than once: {got}. "
            "schedule_unit(unit_of(B)) schedules all of B's beams; when the "
            "loop reaches B1, it already has num_scheduled_tokens: skip it"
        ).format(twice=", ".join(twice), got=got),
    )
    expect(
        got == [("A", 1), ("B", 1), ("B1", 1), ("B2", 1)],
        _(
            "A and the three beams B, B1, B2 decode: expected [('A', 1), "
            "('B', 1), ('B1', 1), ('B2', 1)], got {got}"
        ).format(got=got),
    )


def check_a_unit_fits_whole_or_waits(fns):
    """A unit gets all its tokens in this step or none (a beam search's beams are ranked together)."""
    sched, beams = beams_after_prefill(fns)
    sched.max_num_batched_tokens = 3
    out, got = batch_now(fns, sched)
    expect(
        got == [("A", 1)],
        _(
            "budget 3: A takes 1, and B's three beams need 3 with 2 left. "
            "A beam search runs all its beams or none (they are ranked "
            "together after the step): schedule_unit returns 0 when "
            "sum(num_new) > budget. Expected [('A', 1)], got {got}"
        ).format(got=got),
    )


def check_copies_a_shared_block_before_it_is_written(fns):
    """A beam about to write into a block other beams hold gets its own copy first (copy-on-write)."""
    sched, beams = beams_after_prefill(fns)
    out, got = batch_now(fns, sched)
    copies = [
        (names(s for s in beams if s.seq_id == e.seq_id), e.detail)
        for e in out.events
        if e.kind == "copy_on_write"
    ]
    tables = [s.block_table for s in beams]
    expect(
        out.blocks_to_copy == [(3, 4), (3, 5)]
        or tables != [[2, 4], [2, 5], [2, 3]],
        _(
            "the beams got their copies (block tables {tables}), but "
            "out.blocks_to_copy is {copied}: append each (source, copy) that "
            "copy_on_write returns, or the runner never copies the K/V into "
            "4 and 5 and B and B1 attend to whatever those blocks held"
        ).format(tables=tables, copied=out.blocks_to_copy),
    )
    expect(
        out.blocks_to_copy == [(3, 4), (3, 5)],
        _(
            "B, B1 and B2 share block 3 and each writes into it now: before "
            "allocate, self.block_manager.copy_on_write(seq) gives a beam "
            "its own copy while others still hold the block (B gets 4, B1 "
            "gets 5, B2 is then its last holder). Expected "
            "out.blocks_to_copy [(3, 4), (3, 5)] (the runner copies the K/V "
            "before the forward), got {copied}; the block tables are {tables}"
        ).format(copied=out.blocks_to_copy, tables=tables),
    )
    expect(
        copies
        == [
            (["B"], {"source": 3, "copy": 4}),
            (["B1"], {"source": 3, "copy": 5}),
        ],
        _(
            "record each copy: out.add_event(EventKind.COPY_ON_WRITE, seq, "
            "source=copied[0], copy=copied[1]); expected B 3 -> 4 and B1 "
            "3 -> 5, got {copies}"
        ).format(copies=copies),
    )


def check_a_beam_search_takes_a_slot_per_beam(fns):
    """A beam search is admitted only when each of its beams has a seat (has_seq_slots)."""
    sched = make(max_num_seqs=3)
    add_sequences(sched, 5, names="A")
    step(fns, sched)
    sched.add(make_beam_search(6, 3, name="B"))
    out, got = batch_now(fns, sched)
    expect(
        got == [("A", 1)],
        _(
            "max_num_seqs=3 and A is running: the beam search B will be 3 "
            "sequences after its prefill and only 2 seats are free, so it "
            "waits. Admit while self.has_seq_slots(self.waiting[0]), not "
            "len(self.running) < self.max_num_seqs; expected [('A', 1)], "
            "got {got}"
        ).format(got=got),
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


def engine_with_a_beam_search(fns):
    """With a beam search among the scenario's requests (units, copy-on-write) it still matches."""
    scenario = add_request(
        lesson_scenario(__file__),
        "Beams!",
        arrive=1,
        beam_width=3,
        max_tokens=5,
        ignore_eos=True,
    )
    run = expect_engine_matches(scenario)
    expect(
        run.event_counts["copy_on_write"] >= 1,
        _("this run should copy a shared block; nothing was copied"),
    )
