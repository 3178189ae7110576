"""Checks for bug hunt 13: one hash, one block."""

from tracer.i18n import _
from tracer.teach.kit import (
    expect,
    expect_engine_matches,
    lesson_scenario,
    make_block_manager,
    make_sequence,
)

TARGETS = {"register_full_blocks": "BlockManager.register_full_blocks"}


def scheduled(bm, tokens):
    """A request whose tokens are all scheduled in this step, not yet registered."""
    seq = make_sequence(tokens)
    bm.allocate(seq, len(tokens))
    seq.num_scheduled_tokens = len(tokens)
    return seq


def check_twins_in_one_step_register_one_block(fns):
    """Two requests that compute the same blocks in one step: one block keeps each hash."""
    bm = make_block_manager()
    tokens = list(range(10, 18))
    a, b = scheduled(bm, tokens), scheduled(bm, tokens)
    fns.register_full_blocks(bm, a)
    fns.register_full_blocks(bm, b)
    hashed = [block for block, h in enumerate(bm.hashes) if h is not None]
    expect(
        hashed == a.block_table,
        _(
            "A's blocks {block_table} and B's {block_table2} hold "
            "the same prefix; only A's may carry its hashes, but "
            "blocks {hashed} do"
        ).format(
            block_table=a.block_table, block_table2=b.block_table, hashed=hashed
        ),
    )
    expect(
        [bm.hash_to_block[h] for h in a.block_hashes] == a.block_table,
        _(
            "hash_to_block must keep pointing at the block "
            "registered first (A's)"
        ),
    )
    expect(
        b.block_hashes == a.block_hashes,
        _("B still records its blocks' hashes in b.block_hashes"),
    )


def engine_the_scenario_keeps_every_invariant(fns):
    """The lesson's scenario runs with your registration and breaks no invariant."""
    expect_engine_matches(lesson_scenario(__file__))
