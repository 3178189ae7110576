"""Checks for lesson 3: blocks_needed and compute_slot_mapping."""

import random

import torch

from tracer.i18n import N_, _
from tracer.teach.kit import (
    expect,
    expect_engine_matches,
    expect_same_list,
    first_difference,
    lesson_scenario,
)

TARGETS = {
    "blocks_needed": "blocks_needed",
    "compute_slot_mapping": "compute_slot_mapping",
}


def check_blocks_needed(fns):
    """blocks_needed rounds up: 0→0, 1..block_size→1, block_size+1→2."""
    cases = [
        (0, 4, 0),
        (1, 4, 1),
        (3, 4, 1),
        (4, 4, 1),
        (5, 4, 2),
        (8, 4, 2),
        (9, 4, 3),
        (16, 16, 1),
        (17, 16, 2),
        (1, 1, 1),
        (7, 1, 7),
        (100, 3, 34),
    ]
    for num_tokens, block_size, expected in cases:
        got = fns.blocks_needed(num_tokens, block_size)
        expect(
            isinstance(got, int),
            _(
                "blocks_needed({num_tokens}, {block_size}) returned "
                "{got!r}, not an int"
            ).format(num_tokens=num_tokens, block_size=block_size, got=got),
        )
        expect(
            got == expected,
            _(
                "blocks_needed({num_tokens}, {block_size}) returned "
                "{got}; expected {expected}"
            ).format(
                num_tokens=num_tokens,
                block_size=block_size,
                got=got,
                expected=expected,
            ),
        )


def slots(
    fns,
    tables: list[list[int]],
    seq_index: list[int],
    positions: list[int],
    block_size: int,
) -> list[int]:
    width = max(len(t) for t in tables)
    bt = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    got = fns.compute_slot_mapping(
        bt, torch.tensor(seq_index), torch.tensor(positions), block_size
    )
    expect(
        isinstance(got, torch.Tensor),
        _(
            "compute_slot_mapping must return a torch tensor, got {type_name}"
        ).format(type_name=type(got).__name__),
    )
    expect(
        tuple(got.shape) == (len(positions),),
        _(
            "compute_slot_mapping must return one slot per token: "
            "shape ({n},), got {shape}"
        ).format(n=len(positions), shape=tuple(got.shape)),
    )
    expect(
        not got.is_floating_point(),
        _("slots are integers; got a {dtype} tensor").format(dtype=got.dtype),
    )
    return got.tolist()


def expected_slots(tables, seq_index, positions, block_size) -> list[int]:
    return [
        tables[s][p // block_size] * block_size + p % block_size
        for s, p in zip(seq_index, positions)
    ]


WRONG_FORMULAS = (
    (
        lambda b, p, bs: b * bs + p,
        N_(
            "add the offset inside the block, position % block_size, not the "
            "whole position"
        ),
    ),
    (
        lambda b, p, bs: b + p % bs,
        N_(
            "multiply the block id by block_size: block b starts at slot "
            "b * block_size"
        ),
    ),
    (
        lambda b, p, bs: (p // bs) * bs + p % bs,
        N_(
            "look the block id up in the block table: "
            "block_table[p // block_size]"
        ),
    ),
)


def expect_slots(
    got, tables, seq_index, positions, block_size, what: str
) -> None:
    """Compare with the right slots; when a known wrong formula explains `got`, name it."""
    want = expected_slots(tables, seq_index, positions, block_size)
    if got == want:
        return
    for formula, fix in WRONG_FORMULAS:
        wrong = [
            formula(tables[s][p // block_size], p, block_size)
            for s, p in zip(seq_index, positions)
        ]
        if got == wrong:
            raise AssertionError(
                _("{what}: {difference}: {fix}").format(
                    what=what,
                    difference=first_difference(got, want),
                    fix=_(fix),
                )
            )
    expect_same_list(
        got,
        want,
        what,
        _("slot = block_table[p // block_size] * block_size + p % block_size"),
    )


def check_slot_mapping_one_sequence(fns):
    """The README's example: block table [0, 1, 2, 6], position 12 → slot 24."""
    table, positions = [0, 1, 2, 6], list(range(16))
    got = slots(fns, [table], [0] * 16, positions, 4)
    expect_slots(
        got,
        [table],
        [0] * 16,
        positions,
        4,
        _("block table [0, 1, 2, 6], block_size 4, positions 0..15"),
    )


def check_slot_mapping_batch(fns):
    """A step with a decode token and a prefill chunk: each token uses its own sequence's table."""
    tables = [[5, 2], [1, 7, 3]]
    seq_index, positions = (
        [0, 1, 1, 1],
        [6, 4, 5, 6],
    )  # seq 0 decodes position 6; seq 1 prefills 4..6
    got = slots(fns, tables, seq_index, positions, 4)
    expect_slots(
        got,
        tables,
        seq_index,
        positions,
        4,
        _(
            "tables {tables}, seq_index {seq_index}, positions {positions}"
        ).format(tables=tables, seq_index=seq_index, positions=positions),
    )


def check_slot_mapping_random(fns):
    """Random batches and block sizes agree with slot = table[p // bs] * bs + p % bs."""
    rng = random.Random(3)
    for _i in range(40):
        block_size = rng.choice([1, 2, 3, 4, 16])
        lengths = [rng.randint(1, 40) for _ in range(rng.randint(1, 4))]
        free = list(range(200))
        rng.shuffle(free)
        tables = [
            [free.pop() for _ in range((n + block_size - 1) // block_size)]
            for n in lengths
        ]
        seq_index, positions = [], []
        for i, n in enumerate(lengths):
            start = rng.randint(0, n - 1)
            seq_index += [i] * (n - start)
            positions += list(range(start, n))
        got = slots(fns, tables, seq_index, positions, block_size)
        expect_slots(
            got,
            tables,
            seq_index,
            positions,
            block_size,
            _("block_size {block_size}, tables {tables}").format(
                block_size=block_size, tables=tables
            ),
        )


def engine_lesson_scenario(fns):
    """The engine, running the lesson's scenario with your functions, matches the engine's own."""
    expect_engine_matches(lesson_scenario(__file__))


def engine_other_block_sizes(fns):
    """It still matches with block sizes 1, 3 and 16."""
    for block_size in (1, 3, 16):
        expect_engine_matches(
            lesson_scenario(
                __file__, engine={"block_size": block_size, "num_kv_blocks": 64}
            )
        )
