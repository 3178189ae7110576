"""Checks for lesson 5: compute_block_hash and find_cached_prefix."""

from nanoengine.block_manager import BlockManager
from tracer.i18n import _
from tracer.teach.kit import (
    batch_of,
    cache_prefix,
    expect,
    expect_engine_matches,
    lesson_scenario,
    make_block_manager,
    make_scheduler,
    make_sequence,
)

TARGETS = {
    "compute_block_hash": "compute_block_hash",
    "find_cached_prefix": "BlockManager.find_cached_prefix",
}


def check_hash_is_deterministic_int(fns):
    """The hash is a non-negative int, and the same inputs give the same hash."""
    for parent, tokens in (
        (None, [1, 2, 3, 4]),
        (12345, [5, 6, 7, 8]),
        (None, [0]),
    ):
        a, b = (
            fns.compute_block_hash(parent, list(tokens)),
            fns.compute_block_hash(parent, list(tokens)),
        )
        expect(
            isinstance(a, int) and not isinstance(a, bool),
            _(
                "compute_block_hash({parent}, {tokens}) returned {a!r}; "
                "it must be an int"
            ).format(parent=parent, tokens=tokens, a=a),
        )
        expect(
            a >= 0,
            _(
                "compute_block_hash({parent}, {tokens}) returned the "
                "negative {a}; mask it non-negative (& "
                "0x7FFF_FFFF_FFFF_FFFF)"
            ).format(parent=parent, tokens=tokens, a=a),
        )
        expect(
            a == b,
            _(
                "compute_block_hash({parent}, {tokens}) gave {a} then "
                "{b}: it must be deterministic"
            ).format(parent=parent, tokens=tokens, a=a, b=b),
        )


def check_hash_depends_on_tokens_and_parent(fns):
    """Different tokens, order or parent give different hashes (the chain)."""
    h = fns.compute_block_hash
    base = h(None, [1, 2, 3, 4])
    expect(
        h(None, [1, 2, 3, 5]) != base,
        _("changing a token must change the hash"),
    )
    expect(
        h(None, [4, 3, 2, 1]) != base,
        _("the same tokens in another order must hash differently"),
    )
    expect(
        h(base, [1, 2, 3, 4]) != base,
        _(
            "the same tokens after a parent block must hash "
            "differently from a first block: include parent_hash"
        ),
    )
    expect(
        h(h(None, [9, 9, 9, 9]), [5, 6, 7, 8]) != h(base, [5, 6, 7, 8]),
        _("the same block after different parents must hash differently"),
    )


def cached_manager(
    tokens: list[int],
    block_size: int = 4,
    num_kv_blocks: int = 16,
    enable: bool = True,
):
    """A block manager that has computed `tokens` as one sequence and registered its full blocks."""
    bm = make_block_manager(num_kv_blocks, block_size, prefix_caching=enable)
    seq = cache_prefix(
        bm, tokens, keep=True
    )  # hashes with *your* compute_block_hash (it is plugged in)
    return bm, seq


def lookup(fns, bm: BlockManager, tokens: list[int]):
    result = fns.find_cached_prefix(bm, make_sequence(tokens))
    expect(
        isinstance(result, tuple) and len(result) == 2,
        _(
            "find_cached_prefix must return a pair (block ids, "
            "hashes), got {result!r}"
        ).format(result=result),
    )
    blocks, hashes = result
    expect(
        len(blocks) == len(hashes),
        _("one hash per block: got {n} blocks and {n2} hashes").format(
            n=len(blocks), n2=len(hashes)
        ),
    )
    return list(blocks), list(hashes)


def check_full_prefix_hit(fns):
    """A prompt that extends a cached one reuses every full cached block, in order."""
    a = list(range(10, 20))  # 10 tokens: blocks 0,1 full, block 2 part-full
    bm, seq_a = cached_manager(a)
    blocks, hashes = lookup(fns, bm, a[:8] + [77, 78, 79])
    expect(
        blocks == seq_a.block_table[:2],
        _(
            "the first 8 tokens match A's two full blocks {a_blocks}, but "
            "find_cached_prefix returned blocks {blocks}"
        ).format(a_blocks=seq_a.block_table[:2], blocks=blocks),
    )
    expect(
        hashes == seq_a.block_hashes[:2],
        _(
            "the hashes returned must be the blocks' chained keys, "
            "the same ones register_full_blocks stored"
        ),
    )


def check_partial_hit_stops_at_miss(fns):
    """The walk stops at the first block that is not cached."""
    a = list(range(10, 22))  # 12 tokens: 3 full blocks
    bm, seq_a = cached_manager(a)
    blocks, _rest = lookup(fns, bm, a[:4] + [99, 99, 99, 99] + a[8:12] + [5])
    expect(
        blocks == seq_a.block_table[:1],
        _(
            "block 1 differs, so only block 0 can be reused (and "
            "block 2, though its tokens match, follows a different "
            "prefix); got {blocks}"
        ).format(blocks=blocks),
    )


def check_no_hit_for_shifted_text(fns):
    """The same tokens at another position are not a hit: keys are chained from the start."""
    a = list(range(10, 22))
    bm, _rest = cached_manager(a)
    blocks, _rest = lookup(fns, bm, [1, 1, 1, 1] + a)
    expect(
        blocks == [],
        _(
            "the prompt holds A's tokens shifted by one block; "
            "nothing may match, got {blocks}"
        ).format(blocks=blocks),
    )


def check_last_token_is_never_cached(fns):
    """Even an exact repeat leaves the last block to compute, so the step has logits to sample."""
    a = list(range(10, 26))  # 16 tokens: exactly 4 full blocks
    bm, seq_a = cached_manager(a)
    blocks, _rest = lookup(fns, bm, a)
    expect(
        blocks == seq_a.block_table[:3],
        _(
            "a 16-token repeat may reuse only (16 - 1) // 4 = 3 "
            "blocks, got {n}: {blocks}"
        ).format(n=len(blocks), blocks=blocks),
    )
    blocks, _rest = lookup(fns, bm, a + [7])
    expect(
        blocks == seq_a.block_table[:4],
        _(
            "with one more token all 4 blocks may be reused, got {blocks}"
        ).format(blocks=blocks),
    )


def check_hit_on_blocks_scheduled_in_the_same_step(fns):
    """Twins in one step: the second hits the blocks the first computes in that very step."""
    sched = make_scheduler(budget=64)
    a = make_sequence(16, name="A", ignore_eos=True)  # exactly 4 full blocks
    b = make_sequence(a.token_ids, name="B", ignore_eos=True)
    sched.add(a)
    sched.add(b)
    out = (
        sched.schedule()
    )  # A is scheduled first: its full blocks enter the cache now, not after
    expect(
        batch_of(out) == [("A", 16), ("B", 4)],
        _(
            "A's 4 blocks are findable from the step that computes "
            "them, so B reuses 3 of them (never the last token) and "
            "computes 4 tokens: expected [('A', 16), ('B', 4)], got "
            "{batch}"
        ).format(batch=batch_of(out)),
    )
    expect(
        b.block_table[:3] == a.block_table[:3]
        and b.block_table[3] != a.block_table[3],
        _(
            "B's table must start with A's blocks {blocks} and end with "
            "a block of its own; it is {block_table}"
        ).format(blocks=a.block_table[:3], block_table=b.block_table),
    )


def check_disabled(fns):
    """With prefix caching off, nothing is ever found."""
    a = list(range(10, 22))
    bm, _rest = cached_manager(a)
    bm.enable_prefix_caching = False
    blocks, hashes = lookup(fns, bm, a + [1])
    expect(
        blocks == [] and hashes == [],
        _(
            "enable_prefix_caching is False: expected ([], []), got "
            "({blocks}, {hashes})"
        ).format(blocks=blocks, hashes=hashes),
    )


def engine_lesson_scenario(fns):
    """The engine, running the lesson's scenario with your prefix cache, matches the engine's own."""
    run = expect_engine_matches(lesson_scenario(__file__))
    expect(
        sum(run.prefix_hits.values()) == 24,
        _("B should reuse 24 cached tokens, the run saved {saved}").format(
            saved=sum(run.prefix_hits.values())
        ),
    )


def engine_block_size_one(fns):
    """With block size 1 (every token its own block) it still matches."""
    expect_engine_matches(
        lesson_scenario(__file__, engine={"block_size": 1, "num_kv_blocks": 96})
    )
