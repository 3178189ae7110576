"""Checks for lesson 4: can_allocate, allocate, free."""

from tracer.i18n import _
from tracer.teach.kit import (
    expect,
    expect_engine_matches,
    lesson_scenario,
    make_block_manager,
    make_sequence,
)

TARGETS = {
    "can_allocate": "BlockManager.can_allocate",
    "allocate": "BlockManager.allocate",
    "free": "BlockManager.free",
}


def check_can_allocate(fns):
    """can_allocate(n) is True exactly when n blocks are free."""
    bm = make_block_manager(8)
    for n, expected in ((0, True), (1, True), (8, True), (9, False)):
        got = fns.can_allocate(bm, n)
        expect(
            got is expected or got == expected,
            _(
                "8 free blocks: can_allocate({n}) returned {got!r}, "
                "expected {expected}"
            ).format(n=n, got=got, expected=expected),
        )
    bm.take_free_block(), bm.take_free_block(), bm.take_free_block()
    expect(
        not fns.can_allocate(bm, 6),
        _("with 5 of 8 blocks free, can_allocate(6) must be False"),
    )
    expect(
        fns.can_allocate(bm, 5),
        _("with 5 of 8 blocks free, can_allocate(5) must be True"),
    )


def check_allocate_prefill(fns):
    """A 6-token prefill (block size 4) takes the first two free blocks, ref count 1 each."""
    bm, seq = make_block_manager(8), make_sequence(6)
    fns.allocate(bm, seq, 6)
    expect(
        seq.block_table == [0, 1],
        _(
            "a fresh pool's first blocks are 0 and 1; the table is "
            "{block_table}"
        ).format(block_table=seq.block_table),
    )
    expect(
        bm.ref_counts[:3] == [1, 1, 0],
        _(
            "ref counts of blocks 0-2 are {ref_counts}; expected [1, 1, 0] "
            "(use self.take_free_block())"
        ).format(ref_counts=bm.ref_counts[:3]),
    )
    expect(
        bm.num_free_blocks == 6,
        _(
            "{num_free_blocks} blocks are free after taking 2 of 8; expected 6"
        ).format(num_free_blocks=bm.num_free_blocks),
    )


def check_allocate_decode(fns):
    """Decoding takes a new block only when the last one is full."""
    bm, seq = make_block_manager(8), make_sequence(6)
    fns.allocate(bm, seq, 6)
    seq.num_cached_tokens = 6
    seq.token_ids.append(99)
    fns.allocate(bm, seq, 1)  # position 6: still block 1
    expect(
        seq.block_table == [0, 1],
        _(
            "position 6 fits in the 2nd block (slots 4-7), but the "
            "table grew to {block_table}"
        ).format(block_table=seq.block_table),
    )
    seq.num_cached_tokens = 8
    seq.token_ids += [98, 97]
    fns.allocate(bm, seq, 1)  # position 8: a 3rd block
    expect(
        seq.block_table == [0, 1, 2],
        _("position 8 needs a 3rd block; the table is {block_table}").format(
            block_table=seq.block_table
        ),
    )


def check_allocate_uses_free_list_order(fns):
    """allocate takes blocks from the front of the free list (take_free_block), evicting stale hashes."""
    bm, a = make_block_manager(6), make_sequence(16)
    fns.allocate(bm, a, 16)  # blocks 0-3
    a.num_cached_tokens = 16
    bm.register_full_blocks(a)  # all four hashed
    for block in reversed(
        a.block_table
    ):  # free by hand, so this check does not depend on your free()
        bm.ref_counts[block] -= 1
        bm.free_blocks[block] = None
    a.block_table = []
    b = make_sequence(12)
    fns.allocate(bm, b, 12)
    expect(
        b.block_table == [4, 5, 3],
        _(
            "free list is [4, 5, 3, 2, 1, 0]; a 12-token prefill "
            "must take [4, 5, 3], got {block_table}"
        ).format(block_table=b.block_table),
    )
    expect(
        bm.hashes[3] is None,
        _(
            "block 3 held a cached prefix; taking it for new data "
            "must evict its hash (self.take_free_block() does)"
        ),
    )


def check_free(fns):
    """free() zeroes ref counts, returns blocks tail first, and empties the table."""
    bm, seq = make_block_manager(8), make_sequence(10)
    bm.allocate(seq, 10)  # blocks 0, 1, 2 (the engine's allocate)
    seq.block_hashes = [123]
    fns.free(bm, seq)
    expect(
        bm.ref_counts[:3] == [0, 0, 0],
        _("after free the ref counts of blocks 0-2 are {ref_counts}").format(
            ref_counts=bm.ref_counts[:3]
        ),
    )
    expect(
        list(bm.free_blocks)[-3:] == [2, 1, 0],
        _(
            "freed blocks join the back of the free list tail first: "
            "expected it to end with [2, 1, 0], got {free_list}"
        ).format(free_list=list(bm.free_blocks)),
    )
    expect(
        seq.block_table == [] and seq.block_hashes == [],
        _(
            "after free the sequence must hold nothing: block_table "
            "{block_table}, block_hashes {block_hashes}"
        ).format(block_table=seq.block_table, block_hashes=seq.block_hashes),
    )
    expect(
        bm.num_free_blocks == 8,
        _("all 8 blocks must be free again, {num_free_blocks} are").format(
            num_free_blocks=bm.num_free_blocks
        ),
    )


def check_free_shared_block(fns):
    """A block shared by two sequences stays allocated until both have freed it."""
    bm, a, b = make_block_manager(8), make_sequence(8), make_sequence(8)
    bm.allocate(a, 8)  # blocks 0, 1
    b.block_table = [0, 2]  # b shares block 0 (as a prefix-cache hit would)
    bm.ref_counts[0] += 1
    bm.take_free_block()  # block 2 for b
    fns.free(bm, a)
    expect(
        bm.ref_counts[0] == 1,
        _(
            "block 0 is still held by another sequence: its ref "
            "count must go 2 → 1, got {ref_count}"
        ).format(ref_count=bm.ref_counts[0]),
    )
    expect(
        0 not in bm.free_blocks,
        _("block 0 is still in use and must not be on the free list"),
    )
    expect(1 in bm.free_blocks, _("block 1 was only a's and must be free now"))
    fns.free(bm, b)
    expect(
        bm.ref_counts[0] == 0 and 0 in bm.free_blocks,
        _("after both frees block 0 must be free"),
    )


def engine_lesson_scenario(fns):
    """The engine, running the lesson's scenario with your block manager methods, matches the engine's own."""
    expect_engine_matches(lesson_scenario(__file__))


def engine_memory_pressure(fns):
    """With 7 blocks (B is preempted, freed, and re-admitted later) it still matches."""
    run = expect_engine_matches(
        lesson_scenario(__file__, engine={"block_size": 4, "num_kv_blocks": 7})
    )
    expect(
        run.event_counts["preempted"] >= 1,
        _("this run should preempt a request; none was preempted"),
    )
