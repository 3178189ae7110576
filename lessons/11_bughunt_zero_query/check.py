"""Checks for bug hunt 11: find_cached_prefix must leave a token to compute."""

from tracer.i18n import _
from tracer.teach.kit import (
    cache_prefix,
    expect,
    expect_engine_matches,
    lesson_scenario,
    make_block_manager,
    make_sequence,
)

TARGETS = {"find_cached_prefix": "BlockManager.find_cached_prefix"}


def check_a_full_hit_leaves_the_last_token(fns):
    """A prompt whose every block is cached still gets one token to compute."""
    bm = make_block_manager()
    tokens = list(range(10, 18))  # 8 tokens: exactly 2 full blocks of 4
    cache_prefix(bm, tokens)
    blocks, _rest = fns.find_cached_prefix(bm, make_sequence(tokens))
    expect(
        len(blocks) * bm.block_size < len(tokens),
        _(
            "both blocks of the 8-token prompt are cached and your "
            "lookup returns {n} of them: that leaves {left} tokens to "
            "compute, and a step needs at least one to sample from"
        ).format(n=len(blocks), left=len(tokens) - 4 * len(blocks)),
    )
    expect(
        len(blocks) == 1,
        _("the first block can still be shared; got {n} blocks").format(
            n=len(blocks)
        ),
    )


def engine_the_scenario_keeps_every_invariant(fns):
    """The lesson's scenario runs with your lookup and breaks no invariant."""
    expect_engine_matches(lesson_scenario(__file__))
