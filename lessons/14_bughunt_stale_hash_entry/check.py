"""Checks for bug hunt 14: an evicted block leaves the prefix cache."""

from tracer.i18n import _
from tracer.teach.kit import (
    cache_prefix,
    expect,
    expect_engine_matches,
    lesson_scenario,
    make_block_manager,
    make_sequence,
)

TARGETS = {"take_free_block": "BlockManager.take_free_block"}


def check_an_evicted_block_is_not_found_again(fns):
    """Once a cached block is taken for new contents, the lookup no longer finds it."""
    bm = make_block_manager(num_kv_blocks=2)
    tokens = list(
        range(10, 15)
    )  # one full block of 4 (cached), one part-filled
    cache_prefix(bm, tokens)  # freed: block 0 stays cached, with ref count 0
    taken = [
        fns.take_free_block(bm) for _ in range(2)
    ]  # a new owner takes both
    expect(
        sorted(taken) == [0, 1],
        _("take_free_block must hand out the free blocks, got {taken}").format(
            taken=taken
        ),
    )
    hits, _rest = bm.find_cached_prefix(make_sequence(tokens))
    expect(
        hits == [],
        _(
            "block {block} was taken for new contents, yet the prefix "
            "cache still finds it under its old hash: a later "
            "request would read someone else's KV"
        ).format(block=hits[0] if hits else '?'),
    )
    expect(
        all(h is None for h in bm.hashes), _("a taken block carries no hash")
    )


def engine_the_scenario_keeps_every_invariant(fns):
    """The lesson's scenario runs with your take_free_block and breaks no invariant."""
    expect_engine_matches(lesson_scenario(__file__))
