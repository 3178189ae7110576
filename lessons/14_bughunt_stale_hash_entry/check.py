"""Checks for bug hunt 14: an evicted block leaves the prefix cache."""

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
        f"take_free_block must hand out the free blocks, got {taken}",
    )
    hits, _ = bm.find_cached_prefix(make_sequence(tokens))
    expect(
        hits == [],
        f"block {hits[0] if hits else '?'} was taken for new contents, yet the "
        f"prefix cache still finds it under its old hash: a later request would "
        f"read someone else's KV",
    )
    expect(all(h is None for h in bm.hashes), "a taken block carries no hash")


def engine_the_scenario_keeps_every_invariant(fns):
    """The lesson's scenario runs with your take_free_block and breaks no invariant."""
    expect_engine_matches(lesson_scenario(__file__))
