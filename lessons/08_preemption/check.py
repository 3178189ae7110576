"""Checks for lesson 8: choose_victim, preempt, make_room."""

from nanoengine.scheduler import SchedulerOutput
from nanoengine.sequence import SequenceStatus
from tracer.i18n import _
from tracer.teach.kit import (
    add_sequences,
    engine_step,
    expect,
    expect_engine_matches,
    lesson_scenario,
    make_scheduler,
    make_sequence,
    names,
    prefilled,
)

TARGETS = {
    "choose_victim": "choose_victim",
    "preempt": "Scheduler.preempt",
    "make_room": "Scheduler.make_room",
}


def check_choose_victim(fns):
    """choose_victim picks the most recently admitted sequence (the last one)."""
    seqs = [make_sequence(1, name=name) for name in "ABCD"]
    got = fns.choose_victim(list(seqs))
    expect(
        got is seqs[-1],
        _(
            "running is [A, B, C, D] (oldest first); choose_victim must return "
            "D, got {got}"
        ).format(got="ABCD"[seqs.index(got)] if got in seqs else repr(got)),
    )
    one = [seqs[0]]
    expect(
        fns.choose_victim(one) is seqs[0],
        _("with one running sequence, it is the victim"),
    )


def check_preempt_resets_the_sequence(fns):
    """preempt frees the blocks, forgets the KV and puts the sequence back to WAITING."""
    sched = make_scheduler(16, budget=8)
    a, b = add_sequences(sched, 4, 12)
    engine_step(
        sched
    )  # a budget of 8: A's 4 tokens and the first 4 of B's 12, so B is mid-prefill
    assert b.is_prefilling, "the kit's situation: B is inside its prefill"
    tokens_before = list(b.token_ids)
    out = SchedulerOutput()
    fns.preempt(sched, b, out, a)
    expect(
        b.block_table == [] and sched.block_manager.num_free_blocks == 16 - 1,
        _(
            "after preempt B must hold no blocks (free them with "
            "self.block_manager.free(seq)); it holds {table}, {free} of 16 "
            "blocks are free (A holds 1)"
        ).format(table=b.block_table, free=sched.block_manager.num_free_blocks),
    )
    expect(
        b.num_cached_tokens == 0,
        _("B's KV is gone: num_cached_tokens must be 0, got {n}").format(
            n=b.num_cached_tokens
        ),
    )
    expect(
        not b.is_prefilling,
        _(
            "B was preempted in the middle of its prefill (4 of its 12 prompt "
            "tokens computed): is_prefilling must be False after preempt (set "
            "it with the other counters); it is still True, so a waiting B "
            "would claim a prefill in progress"
        ),
    )
    expect(
        b.status == SequenceStatus.WAITING,
        _("B must be WAITING, is {status}").format(status=b.status.value),
    )
    expect(
        b.token_ids == tokens_before,
        _(
            "preempt must keep token_ids (prompt and generated tokens): they "
            "are recomputed later"
        ),
    )


def check_preempt_queues_at_head(fns):
    """The preempted sequence leaves running and goes to the head of waiting."""
    sched = make_scheduler(16)
    a, b = prefilled(sched, 9, 10)
    later = make_sequence(2, name="C")
    sched.add(later)
    out = SchedulerOutput()
    fns.preempt(sched, b, out, a)
    expect(sched.running == [a], _("B must be removed from self.running"))
    expect(
        list(sched.waiting) == [b, later],
        _(
            "B must go to the HEAD of self.waiting (appendleft), before the "
            "request that was already waiting"
        ),
    )
    expect(
        out.preempted == [b],
        _(
            "list B in out.preempted (schedule admits nobody in a step that "
            "preempted); got {got}"
        ).format(got=names(out.preempted)),
    )
    kinds = [
        (e.kind, names(s for s in (a, b, later) if s.seq_id == e.seq_id))
        for e in out.events
    ]
    expect(
        kinds == [("preempted", ["B"])],
        _("expected one event: ('preempted', B); got {got}").format(got=kinds),
    )
    expect(
        isinstance(out.events[0].detail, dict)
        and ("by" in out.events[0].detail or "reason" in out.events[0].detail),
        _(
            "the event's detail must be a dict saying who needed the room "
            "(by=needed_by.seq_id, or a 'reason')"
        ),
    )


def check_preempt_records_the_free_blocks_before(fns):
    """The event's `free` is the free blocks before the victim's were given back."""
    sched = make_scheduler(16)
    a, b = prefilled(sched, 9, 10)  # A holds 3 blocks, B 3: 10 free
    out = SchedulerOutput()
    fns.preempt(sched, b, out, a)
    detail = (
        out.events[0].detail
        if out.events and isinstance(out.events[0].detail, dict)
        else {}
    )
    expect(
        detail.get("by") == a.seq_id,
        _(
            "by= must be the seq_id of the sequence that needed the room (A, "
            "seq_id {seq_id}); got {got!r}"
        ).format(seq_id=a.seq_id, got=detail.get("by")),
    )
    free = detail.get("free")
    expect(
        free == 10,
        (
            _(
                "free= must be the free blocks BEFORE B's were given back: 10 "
                "(A and B hold 3 each of 16); you recorded {free}, the count "
                "after B's 3 blocks came back: read num_free_blocks before "
                "bm.free(seq). The decision itself is right; only the recorded "
                "number is wrong"
            )
            if free == 13
            else _(
                "free= must be the free blocks BEFORE B's were given back: 10 "
                "(A and B hold 3 each of 16); you recorded {free}"
            )
        ).format(free=free if free == 13 else repr(free)),
    )


def check_make_room_when_it_fits(fns):
    """If the blocks are free, make_room preempts nobody and returns True."""
    sched = make_scheduler(16)
    a, b = prefilled(sched, 8, 8)
    out = SchedulerOutput()
    ok = fns.make_room(sched, a, 1, out)
    expect(
        ok is True,
        _(
            "A's next token needs 1 block and 12 are free: make_room must "
            "return True, got {ok!r}"
        ).format(ok=ok),
    )
    expect(
        out.events == [] and sched.running == [a, b],
        _("nothing may be preempted when the blocks fit"),
    )


def check_make_room_preempts_newest(fns):
    """When the pool is full, make_room preempts the newest sequence and returns True for the older one."""
    sched = make_scheduler(6)
    a, b, c = prefilled(sched, 8, 8, 8)  # 2 blocks each: the pool is full
    out = SchedulerOutput()
    ok = fns.make_room(sched, a, 1, out)  # A's 9th token needs a 3rd block
    expect(
        ok is True,
        _(
            "after preempting C, A's block fits: make_room must return True, "
            "got {ok!r}"
        ).format(ok=ok),
    )
    expect(
        sched.running == [a, b] and list(sched.waiting) == [c],
        _("C, the newest, must be the one preempted"),
    )


def check_make_room_preempts_until_it_fits(fns):
    """make_room keeps preempting until enough blocks are free."""
    sched = make_scheduler(6)
    a, b, c = prefilled(sched, 8, 8, 8)
    out = SchedulerOutput()
    ok = fns.make_room(
        sched, a, 12, out
    )  # 20 tokens: 5 blocks, 3 more than A has
    expect(
        ok is True and sched.running == [a],
        _(
            "A needs 3 more blocks: both C and B must be preempted; running is "
            "now {n} sequence(s), ok={ok!r}"
        ).format(n=len(sched.running), ok=ok),
    )
    expect(
        list(sched.waiting) == [b, c],
        _(
            "preempted sequences go to the head of the queue: B (preempted "
            "last) first, then C"
        ),
    )


def check_make_room_self_preemption(fns):
    """If the sequence that needs room is the newest, it preempts itself and make_room returns False."""
    sched = make_scheduler(4)
    a, b = prefilled(sched, 8, 8)
    out = SchedulerOutput()
    ok = fns.make_room(sched, b, 1, out)
    expect(
        ok is False,
        _(
            "B is the newest, so B is the victim: make_room must return False, "
            "got {ok!r}"
        ).format(ok=ok),
    )
    expect(
        sched.running == [a] and list(sched.waiting) == [b],
        _("B must be WAITING at the head of the queue"),
    )


def engine_lesson_scenario(fns):
    """The engine, running the lesson's scenario with your preemption, matches the engine's own."""
    run = expect_engine_matches(lesson_scenario(__file__))
    expect(
        run.event_counts["preempted"] >= 1,
        _("the scenario must preempt a request"),
    )


def engine_heavy_pressure(fns):
    """With an even smaller pool and a token budget of 8 (many preemptions) it still matches."""
    run = expect_engine_matches(
        lesson_scenario(
            __file__,
            engine={
                "block_size": 4,
                "num_kv_blocks": 8,
                "max_num_batched_tokens": 8,
            },
        )
    )
    expect(
        run.event_counts["preempted"] >= 2,
        _("this run should preempt at least twice"),
    )
