"""Checks for lesson 7: try_admit."""

from nanoengine.scheduler import Scheduler, SchedulerOutput
from nanoengine.sequence import Sequence, SequenceStatus
from tracer.i18n import _
from tracer.teach.kit import (
    add_request,
    cache_prefix,
    event_kinds,
    expect,
    expect_engine_matches,
    lesson_scenario,
    make_scheduler,
    make_sequence,
)

TARGETS = {"try_admit": "Scheduler.try_admit"}


def add(sched: Scheduler, tokens) -> Sequence:
    seq = make_sequence(tokens, max_tokens=8, ignore_eos=True)
    sched.add(seq)
    return seq


def admit(
    fns, sched: Scheduler, seq: Sequence, budget: int
) -> tuple[bool, SchedulerOutput]:
    out = SchedulerOutput()
    ok = fns.try_admit(sched, seq, budget, out)
    expect(
        ok is True or ok is False,
        _("try_admit must return True or False, got {ok!r}").format(ok=ok),
    )
    return ok, out


def check_admits_whole_prompt(fns):
    """A prompt within the budget is admitted whole: RUNNING, moved from waiting to running."""
    sched = make_scheduler()
    seq = add(sched, range(10, 20))
    ok, out = admit(fns, sched, seq, budget=64)
    expect(
        ok,
        _(
            "a 10-token prompt, budget 64, 16 free blocks: try_admit "
            "must return True"
        ),
    )
    expect(
        seq.num_scheduled_tokens == 10,
        _("num_scheduled_tokens is {num_scheduled_tokens}; expected 10").format(
            num_scheduled_tokens=seq.num_scheduled_tokens
        ),
    )
    expect(
        seq.status == SequenceStatus.RUNNING,
        _("status is {value}; expected RUNNING").format(value=seq.status.value),
    )
    expect(
        list(sched.waiting) == [] and sched.running == [seq],
        _(
            "the sequence must move from self.waiting (popleft) to "
            "self.running (append)"
        ),
    )
    expect(
        len(seq.block_table) == 3,
        _("10 tokens need 3 blocks of 4; the table is {block_table}").format(
            block_table=seq.block_table
        ),
    )
    expect(
        seq.is_prefilling and seq.num_prefill_chunks == 0,
        _(
            "an admitted sequence starts its prefill: is_prefilling "
            "must be True and num_prefill_chunks 0, got "
            "{is_prefilling} and {num_prefill_chunks}"
        ).format(
            is_prefilling=seq.is_prefilling,
            num_prefill_chunks=seq.num_prefill_chunks,
        ),
    )
    expect(
        event_kinds(out) == ["admitted"],
        _("expected one 'admitted' event, got {events}").format(
            events=out.events
        ),
    )


def check_first_chunk_fits_budget(fns):
    """A prompt longer than the budget gets a first chunk of exactly `budget` tokens, and only its blocks."""
    sched = make_scheduler()
    seq = add(sched, range(10, 40))  # 30 tokens
    ok, _rest = admit(fns, sched, seq, budget=6)
    expect(
        ok and seq.num_scheduled_tokens == 6,
        _(
            "a 30-token prompt with budget 6 must be admitted with a "
            "6-token chunk; got ok={ok}, "
            "num_scheduled_tokens={num_scheduled_tokens}"
        ).format(ok=ok, num_scheduled_tokens=seq.num_scheduled_tokens),
    )
    expect(
        len(seq.block_table) == 2,
        _(
            "a 6-token chunk needs 2 blocks (not the 8 of the whole "
            "prompt); the table has {n}"
        ).format(n=len(seq.block_table)),
    )


def check_rejects_without_blocks(fns):
    """If the chunk's blocks do not fit, return False and leave everything as it was."""
    sched = make_scheduler(2)
    seq = add(sched, range(10, 22))  # 12 tokens: 3 blocks
    ok, out = admit(fns, sched, seq, budget=64)
    expect(
        ok is False,
        _(
            "12 tokens need 3 blocks but only 2 exist: try_admit "
            "must return False"
        ),
    )
    expect(
        list(sched.waiting) == [seq] and sched.running == [],
        _(
            "a rejected sequence stays at the head of self.waiting "
            "and is not running"
        ),
    )
    expect(
        seq.block_table == [] and sched.block_manager.num_free_blocks == 2,
        _(
            "a rejected sequence must not take any block (check "
            "can_allocate before allocating)"
        ),
    )
    expect(
        seq.status == SequenceStatus.WAITING
        and all(kind == "not_admitted" for kind in event_kinds(out)),
        _(
            "a rejected sequence stays WAITING, with no event (or "
            "only 'not_admitted')"
        ),
    )


def check_prefix_hit(fns):
    """Cached prefix blocks are reused: num_cached_tokens covers them, only the rest is scheduled."""
    sched = make_scheduler()
    cache_prefix(
        sched.block_manager, list(range(10, 22))
    )  # 3 full blocks cached
    seq = add(sched, list(range(10, 22)) + [5, 6, 7])
    ok, out = admit(fns, sched, seq, budget=64)
    expect(ok, _("try_admit must admit a request whose prefix is cached"))
    expect(
        seq.num_cached_tokens == 12 and seq.num_scheduled_tokens == 3,
        _(
            "3 cached blocks = 12 tokens reused, 3 to compute; got "
            "num_cached_tokens={num_cached_tokens}, "
            "num_scheduled_tokens={num_scheduled_tokens} (use "
            "bm.use_cached_prefix)"
        ).format(
            num_cached_tokens=seq.num_cached_tokens,
            num_scheduled_tokens=seq.num_scheduled_tokens,
        ),
    )
    expect(
        seq.block_table[:3] == [0, 1, 2],
        _(
            "the table must start with the cached blocks [0, 1, 2], "
            "got {block_table}"
        ).format(block_table=seq.block_table),
    )
    hits = [e.detail for e in out.events if e.kind == "prefix_hit"]
    expect(
        hits == [{"blocks": [0, 1, 2], "tokens_saved": 12}],
        _(
            "expected the event ('prefix_hit', seq_id, {{'blocks': "
            "[0, 1, 2], 'tokens_saved': 12}}), got {events}"
        ).format(events=out.events),
    )


def check_cached_free_blocks_count(fns):
    """Reusing cached blocks that sit in the free list uses up free blocks too."""
    sched = make_scheduler(4)
    cache_prefix(
        sched.block_manager, list(range(10, 22))
    )  # blocks 0-2 cached, ref count 0, still in the free list
    seq = add(
        sched, list(range(10, 22)) + list(range(50, 58))
    )  # 20 tokens: 3 cached + 2 new blocks
    try:
        ok, _rest = admit(fns, sched, seq, budget=64)
    except KeyError:  # the free list ran dry inside allocate
        raise AssertionError(
            _(
                "try_admit admitted a request whose blocks did not fit, "
                "and allocate ran out of free blocks: the 3 cached "
                "blocks sit in the free list, so they count too. Add "
                "bm.num_free_in(hit_blocks) to the blocks you ask "
                "can_allocate for"
            )
        ) from None
    expect(
        ok is False,
        _(
            "the pool has 4 blocks: the 3 cached ones (in the free "
            "list) + 2 new = 5 > 4, so try_admit must return False. "
            "Count bm.num_free_in(hit_blocks) in the check"
        ),
    )
    expect(
        list(sched.waiting) == [seq] and seq.block_table == [],
        _("a rejected sequence must be left untouched"),
    )


def engine_lesson_scenario(fns):
    """The engine, running the lesson's scenario with your try_admit, matches the engine's own."""
    run = expect_engine_matches(lesson_scenario(__file__))
    expect(
        max(s.num_batched_tokens for s in run.steps) <= 16,
        _("a step went over the 16-token budget"),
    )


def engine_prefix_and_chunks(fns):
    """Prefix hits, chunks and a tight pool together still match the engine's own run."""
    scenario = lesson_scenario(
        __file__,
        engine={
            "block_size": 4,
            "num_kv_blocks": 20,
            "max_num_batched_tokens": 7,
        },
    )
    add_request(
        scenario,
        "A long prompt: chunked prefill splits it over many steps.",
        arrive=8,
        max_tokens=3,
        ignore_eos=True,
    )
    run = expect_engine_matches(scenario)
    expect(
        run.event_counts["prefix_hit"] >= 1,
        _("the last request should reuse the long prompt's first blocks"),
    )
