"""Checks for lesson 8: choose_victim, make_room, preempt, recompute_later."""

from nanoengine.scheduler import Scheduler, SchedulerOutput
from nanoengine.sequence import Sequence, SequenceStatus
from tracer.i18n import _
from tracer.teach.kit import (
    add_sequences,
    beam_search_under_pressure,
    engine_step,
    expect,
    expect_engine_matches,
    fork_beams,
    lesson_scenario,
    make_beam_search,
    make_scheduler,
    make_sequence,
    names,
    prefilled,
)

TARGETS = {
    "choose_victim": "choose_victim",
    "make_room": "Scheduler.make_room",
    "preempt": "Scheduler.preempt",
    "recompute_later": "Scheduler.recompute_later",
}


def beams(
    num_kv_blocks: int = 16, later: int = 0
) -> tuple[Scheduler, Sequence, list[Sequence]]:
    """A (7 tokens, blocks [0, 1]) and the beam search B (6 tokens, 3 beams)
    prefilled by the engine's own code, then forked as the engine does: B, B1
    and B2 share blocks [2, 3], and each writes into block 3 next. later: a
    request C of that many tokens, admitted after the fork (the newest)."""
    sched = make_scheduler(num_kv_blocks)
    (a,) = add_sequences(sched, 7, names="A")
    first = make_beam_search(6, 3, name="B")
    sched.add(first)
    late = add_sequences(sched, later, names="C") if later else []
    engine_step(sched)  # admissions only: none of your functions runs here
    unit = fork_beams(sched, first)
    for c in late:  # C came in after the fork: last in admission order
        sched.running.remove(c)
        sched.running.append(c)
    return sched, a, unit


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


# ---- recompute_later: what happens to each preempted sequence ---------------
def check_recompute_later_resets_the_sequence(fns):
    """recompute_later frees the blocks, forgets the KV and puts the sequence back to WAITING."""
    sched = make_scheduler(16, budget=8)
    a, b = add_sequences(sched, 4, 12)
    engine_step(
        sched
    )  # a budget of 8: A's 4 tokens and the first 4 of B's 12, so B is mid-prefill
    assert b.is_prefilling, "the kit's situation: B is inside its prefill"
    tokens_before = list(b.token_ids)
    sched.running.remove(b)  # as preempt does first
    fns.recompute_later(sched, b, SchedulerOutput())
    expect(
        b.block_table == [] and sched.block_manager.num_free_blocks == 16 - 1,
        _(
            "after recompute_later B must hold no blocks (free them with "
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
            "tokens computed): is_prefilling must be False after "
            "recompute_later (set it with the other counters); it is still "
            "True, so a waiting B would claim a prefill in progress"
        ),
    )
    expect(
        b.status == SequenceStatus.WAITING,
        _("B must be WAITING, is {status}").format(status=b.status.value),
    )
    expect(
        b.token_ids == tokens_before,
        _(
            "recompute_later must keep token_ids (prompt and generated "
            "tokens): they are recomputed later"
        ),
    )


def check_recompute_later_queues_at_head(fns):
    """The sequence goes back to the head of waiting, before those already waiting."""
    sched = make_scheduler(16)
    a, b = prefilled(sched, 9, 10)
    later = make_sequence(2, name="C")
    sched.add(later)
    sched.running.remove(b)  # as preempt does first
    fns.recompute_later(sched, b, SchedulerOutput())
    expect(
        list(sched.waiting) == [b, later],
        _(
            "B must go to the HEAD of self.waiting (appendleft), before the "
            "request that was already waiting; waiting is {got}"
        ).format(got=names(sched.waiting)),
    )


def check_recompute_later_restarts_a_beam_search(fns):
    """A preempted beam search restarts: its first beam waits, cut back to its prompt; the others are pruned."""
    sched, a, (b, b1, b2) = beams()
    out = SchedulerOutput()
    for seq in (b2, b1, b):  # what preempt does, newest first
        sched.running.remove(seq)
        fns.recompute_later(sched, seq, out)
    waiting = names(sched.waiting)
    expect(
        waiting == ["B"],
        _(
            "the beam search B (beams B, B1, B2) was preempted; it starts "
            "again from its prompt with its first beam only, so only B may "
            "wait, got waiting {waiting}. seq.group.restart() cuts the first "
            "beam back and returns it; any other beam finishes as pruned"
        ).format(waiting=waiting),
    )
    expect(
        b.num_tokens == b.num_prompt_tokens and not b.logprobs,
        _(
            "B starts again from its prompt: its tokens must be its 6 prompt "
            "tokens (seq.group.restart() cuts them back), got {n}"
        ).format(n=b.num_tokens),
    )
    pruned = [
        (name, s.status.value, s.finish_reason)
        for name, s in zip(("B1", "B2"), (b1, b2))
    ]
    expect(
        all(s.is_finished and s.finish_reason == "pruned" for s in (b1, b2)),
        _(
            "B1 and B2 must finish with reason 'pruned' "
            "(seq.finish(FinishReason.PRUNED)); got {pruned}"
        ).format(pruned=pruned),
    )
    finished = [
        (names([s for s in (b1, b2) if s.seq_id == e.seq_id]), e.detail)
        for e in out.events
        if e.kind == "finished"
    ]
    expect(
        finished
        == [(["B2"], {"reason": "pruned"}), (["B1"], {"reason": "pruned"})],
        _(
            "record each pruned beam: out.add_event(EventKind.FINISHED, seq, "
            "reason=FinishReason.PRUNED.value); got {finished}"
        ).format(finished=finished),
    )
    expect(
        sched.block_manager.num_free_blocks == 16 - 2,
        _(
            "every beam's blocks go back to the pool (A holds 2 of 16): "
            "{free} are free; the beams still hold {tables}"
        ).format(
            free=sched.block_manager.num_free_blocks,
            tables=[s.block_table for s in (b, b1, b2)],
        ),
    )


# ---- preempt: a victim's whole unit ------------------------------------------
def check_preempt_takes_it_out_of_running(fns):
    """The preempted sequence leaves running, is listed and recorded, and goes to the head of waiting."""
    sched = make_scheduler(16)
    a, b = prefilled(sched, 9, 10)
    later = make_sequence(2, name="C")
    sched.add(later)
    out = SchedulerOutput()
    fns.preempt(sched, b, out, a)
    expect(sched.running == [a], _("B must be removed from self.running"))
    expect(
        b in sched.waiting,
        _(
            "B left running but is not waiting: hand each preempted sequence "
            "to self.recompute_later(seq, out)"
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
                "recompute_later frees them. The decision itself is right; only the recorded "
                "number is wrong"
            )
            if free == 13
            else _(
                "free= must be the free blocks BEFORE B's were given back: 10 "
                "(A and B hold 3 each of 16); you recorded {free}"
            )
        ).format(free=free if free == 13 else repr(free)),
    )


def check_preempt_takes_the_whole_unit(fns):
    """Preempting one beam preempts its beam search's every beam (unit_of)."""
    sched, a, (b, b1, b2) = beams()
    out = SchedulerOutput()
    fns.preempt(sched, b2, out, a)
    running = names(sched.running)
    expect(
        running == ["A"],
        _(
            "B2 is one of the beam search's beams B, B1, B2: they run together "
            "or not at all, so preempt takes the victim's whole unit, "
            "unit_of(victim), out of running; still running: {running}"
        ).format(running=running),
    )
    recorded = sorted(
        names(s for s in (b, b1, b2) if s.seq_id == e.seq_id)[0]
        for e in out.events
        if e.kind == "preempted"
    )
    expect(
        sorted(names(out.preempted)) == ["B", "B1", "B2"]
        and recorded == ["B", "B1", "B2"],
        _(
            "each beam of the unit is preempted: list it in out.preempted and "
            "record a 'preempted' event for it; out.preempted is {listed}, "
            "the events name {recorded}"
        ).format(listed=names(out.preempted), recorded=recorded),
    )
    expect(
        names(sched.waiting) == ["B"] and b1.is_finished and b2.is_finished,
        _(
            "each preempted beam goes through recompute_later: B waits, B1 "
            "and B2 are pruned; waiting is {waiting}"
        ).format(waiting=names(sched.waiting)),
    )


# ---- make_room ---------------------------------------------------------------
def check_make_room_when_it_fits(fns):
    """If the blocks are free, make_room preempts nobody and returns True."""
    sched = make_scheduler(16)
    a, b = prefilled(sched, 8, 8)
    out = SchedulerOutput()
    ok = fns.make_room(sched, [a], [1], out)
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
    ok = fns.make_room(sched, [a], [1], out)  # A's 9th token needs a 3rd block
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
        sched, [a], [12], out
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
    ok = fns.make_room(sched, [b], [1], out)
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


def check_make_room_counts_the_whole_unit(fns):
    """A unit needs the blocks of all its sequences at once."""
    sched, a, unit = beams(num_kv_blocks=8, later=7)  # C: blocks [4, 5]
    c = sched.running[-1]
    out = SchedulerOutput()
    ok = fns.make_room(sched, unit, [1, 1, 1], out)
    expect(
        c.status == SequenceStatus.WAITING,
        _(
            "B, B1 and B2 each write into their shared block 3 now, so each "
            "needs a block of its own (a copy): 3 for the unit, and 2 are "
            "free. make_room must count every sequence of the unit, "
            "bm.blocks_to_schedule(s, n) for each s and its n, and preempt C; "
            "C is still {status}"
        ).format(status=c.status.value),
    )
    expect(
        ok is True and names(sched.running) == ["A", "B", "B1", "B2"],
        _(
            "with C preempted the unit's 3 blocks fit: make_room must return "
            "True and keep A, B, B1, B2 running; got {ok!r}, running {running}"
        ).format(ok=ok, running=names(sched.running)),
    )


def check_make_room_when_the_unit_itself_goes(fns):
    """If the victim is any beam of the unit that needs room, make_room returns False."""
    sched, a, unit = beams(num_kv_blocks=4)  # the pool is full
    out = SchedulerOutput()
    ok = fns.make_room(sched, unit, [1, 1, 1], out)
    expect(
        ok is False,
        _(
            "the pool is full and the victim, B2 (the newest), is one of the "
            "beams B, B1, B2 that need the room: their whole unit was "
            "preempted, so make_room must return False at once (victim in "
            "unit, not victim is unit[0]); got {ok!r}, running {running}"
        ).format(ok=ok, running=names(sched.running)),
    )
    expect(
        names(sched.running) == ["A"],
        _(
            "the victim B2 is a beam of the unit that needs the room: its "
            "whole unit is preempted, and A alone runs on; running is "
            "{running}"
        ).format(running=names(sched.running)),
    )


# ---- the engine with your preemption ------------------------------------------
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


def engine_a_beam_search_restarts(fns):
    """A beam search that is preempted restarts from its prompt, and the run still matches."""
    run = expect_engine_matches(beam_search_under_pressure(__file__))
    expect(
        run.event_counts["preempted"] >= 3,
        _("this run should preempt the beam search's three beams"),
    )
