"""Checks for bug hunt 12: a preempted request forgets its KV."""

from nanoengine.scheduler import SchedulerOutput
from tracer.i18n import _
from tracer.teach.kit import (
    expect,
    expect_engine_matches,
    lesson_scenario,
    make_scheduler,
    prefilled,
)

TARGETS = {"recompute_later": "Scheduler.recompute_later"}


def check_recompute_later_forgets_the_kv(fns):
    """After a preemption, the request holds no blocks and claims no cached tokens."""
    sched = make_scheduler(16)
    a, b = prefilled(sched, 9, 10)
    sched.running.remove(b)  # as Scheduler.preempt does before calling it
    fns.recompute_later(sched, b, SchedulerOutput())
    expect(
        b.block_table == [],
        _(
            "B must hold no blocks after recompute_later, holds {block_table}"
        ).format(block_table=b.block_table),
    )
    expect(
        b.num_cached_tokens == 0,
        _(
            "B's blocks went back to the pool, yet it says "
            "num_cached_tokens = {num_cached_tokens}: KV it no "
            "longer has"
        ).format(num_cached_tokens=b.num_cached_tokens),
    )


def engine_the_scenario_keeps_every_invariant(fns):
    """The lesson's scenario runs with your recompute_later and breaks no invariant."""
    expect_engine_matches(lesson_scenario(__file__))
