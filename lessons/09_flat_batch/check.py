"""Checks for lesson 9: prepare_inputs."""

import torch

from nanoengine.model_runner import StepInputs
from nanoengine.sequence import Sequence
from tracer.i18n import _
from tracer.teach.kit import (
    add_request,
    expect,
    expect_engine_matches,
    first_difference,
    frames_of,
    lesson_scenario,
    make_sequence,
)

TARGETS = {"prepare_inputs": "prepare_inputs"}
INT_FIELDS = (
    "input_ids",
    "positions",
    "query_start_loc",
    "seq_lens",
    "slot_mapping",
    "block_tables",
    "logits_indices",
)


def seq(
    token_ids, num_cached: int, num_scheduled: int, block_table: list[int]
) -> Sequence:
    return make_sequence(
        token_ids,
        num_cached_tokens=num_cached,
        num_scheduled_tokens=num_scheduled,
        block_table=block_table,
    )


def readme_batch() -> list[Sequence]:
    a = seq([70, 71, 72, 73], 3, 1, [0])  # decoding: its 4th token
    b = seq([81, 104, 122], 0, 3, [1])  # "New"
    c = seq(list(range(100, 126)), 0, 8, [2, 3])  # a 26-token prompt, chunk 1
    return [a, b, c]


def flatten(fns, seqs, block_size: int = 4) -> dict[str, list]:
    try:
        inputs = fns.prepare_inputs(seqs, block_size)
    except IndexError as e:
        if "compute_slot_mapping" not in "".join(str(f) for f in frames_of(e)):
            raise
        raise AssertionError(
            _(
                "compute_slot_mapping indexed past a block table ({e}): "
                "some position points beyond its sequence's blocks. "
                "positions count from the start of each sequence "
                "(num_cached_tokens + the offset inside its chunk), not "
                "along the flat row"
            ).format(e=e)
        ) from None
    expect(
        isinstance(inputs, StepInputs),
        _("prepare_inputs must return a StepInputs, got {type_name}").format(
            type_name=type(inputs).__name__
        ),
    )
    got = {}
    for name in INT_FIELDS + ("discard",):
        value = getattr(inputs, name)
        expect(
            isinstance(value, torch.Tensor),
            _("{name} must be a torch tensor, got {type_name}").format(
                name=name, type_name=type(value).__name__
            ),
        )
        if name == "discard":
            expect(
                value.dtype == torch.bool,
                _("discard must be a bool tensor, got {dtype}").format(
                    dtype=value.dtype
                ),
            )
        else:
            expect(
                value.dtype == torch.int64,
                _(
                    "{name} must be an int64 tensor (torch.tensor of ints "
                    "is), got {dtype}"
                ).format(name=name, dtype=value.dtype),
            )
        got[name] = value.tolist()
    return got


def expect_field(got: dict, name: str, expected, why: str) -> None:
    expect(
        got[name] == expected,
        _(
            "{name}: expected {expected}, got {got} ({difference}). {why}"
        ).format(
            name=name,
            expected=expected,
            got=got[name],
            difference=first_difference(got[name], expected),
            why=why,
        ),
    )


def check_query_start_loc(fns):
    """query_start_loc: where each sequence starts in the flat row, ending with the total."""
    got = flatten(fns, readme_batch())
    expect_field(
        got,
        "query_start_loc",
        [0, 1, 4, 12],
        _(
            "It is the running sum of num_scheduled_tokens (1, 3, 8), starting at 0."
        ),
    )


def check_input_ids(fns):
    """input_ids: each sequence's scheduled tokens, back to back."""
    got = flatten(fns, readme_batch())
    expect_field(
        got,
        "input_ids",
        [73, 81, 104, 122] + list(range(100, 108)),
        _(
            "Take token_ids[num_cached_tokens : num_cached_tokens + num_scheduled_tokens] of each sequence."
        ),
    )


def check_positions(fns):
    """positions: num_cached_tokens + the offset inside the chunk, per sequence (not the flat index)."""
    got = flatten(fns, readme_batch())
    expect_field(
        got,
        "positions",
        [3, 0, 1, 2, 0, 1, 2, 3, 4, 5, 6, 7],
        _("A token's position counts from the start of its own sequence."),
    )


def check_seq_lens_and_logits(fns):
    """seq_lens = cached + scheduled; logits_indices = each sequence's last flat index."""
    got = flatten(fns, readme_batch())
    expect_field(
        got,
        "seq_lens",
        [4, 3, 8],
        _("seq_lens = num_cached_tokens + num_scheduled_tokens."),
    )
    expect_field(
        got,
        "logits_indices",
        [0, 3, 11],
        _("The last token of each sequence: query_start_loc[1:] - 1."),
    )


def check_discard(fns):
    """discard marks exactly the sequences still mid-prefill after this step."""
    got = flatten(fns, readme_batch())
    expect_field(
        got,
        "discard",
        [False, False, True],
        _("C will have 8 of its 26 tokens: seq_lens < num_tokens."),
    )


def check_block_tables_and_slots(fns):
    """block_tables are padded with 0; slot_mapping follows the tables (lesson 3)."""
    got = flatten(fns, readme_batch())
    expect_field(
        got,
        "block_tables",
        [[0, 0], [1, 0], [2, 3]],
        _("Pad each block table with 0 to the longest."),
    )
    expect_field(
        got,
        "slot_mapping",
        [3, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14, 15],
        _(
            "Use compute_slot_mapping(block_tables, seq_index, positions, block_size)."
        ),
    )


def check_later_chunk(fns):
    """A later chunk starts at its cached position: positions continue where the cache ends."""
    c = seq(list(range(100, 126)), 8, 10, [2, 3, 5, 6, 7])
    got = flatten(fns, [c], block_size=4)
    expect_field(
        got,
        "positions",
        list(range(8, 18)),
        _("Chunk 2 of C covers positions 8..17."),
    )
    expect_field(
        got,
        "input_ids",
        list(range(108, 118)),
        _("Chunk 2 of C is token_ids[8:18]."),
    )
    expect_field(
        got,
        "slot_mapping",
        [20, 21, 22, 23, 24, 25, 26, 27, 28, 29],
        _("Positions 8..17 live in C's 3rd to 5th blocks (5, 6, 7)."),
    )
    expect_field(got, "seq_lens", [18], _("8 cached + 10 scheduled."))


def check_all_decodes(fns):
    """A batch of decodes: one token per sequence, at position num_cached_tokens."""
    seqs = [
        seq(
            list(range(50, 50 + n + 1)),
            n,
            1,
            list(range(i * 3, i * 3 + (n + 4) // 4)),
        )
        for i, n in enumerate((5, 8, 2))
    ]
    got = flatten(fns, seqs)
    expect_field(
        got,
        "query_start_loc",
        [0, 1, 2, 3],
        _("Each decode schedules one token."),
    )
    expect_field(
        got,
        "positions",
        [5, 8, 2],
        _("A decode computes the token at position num_cached_tokens."),
    )
    expect_field(
        got,
        "logits_indices",
        [0, 1, 2],
        _("Every token is its sequence's last one."),
    )


def engine_lesson_scenario(fns):
    """The engine, running the lesson's scenario with your prepare_inputs, matches the engine's own."""
    expect_engine_matches(lesson_scenario(__file__))


def engine_mixed_batches(fns):
    """A small pool, chunks of 5 and a prefix hit: the trace checker's batch invariants all hold."""
    scenario = lesson_scenario(
        __file__,
        engine={
            "block_size": 4,
            "num_kv_blocks": 12,
            "max_num_batched_tokens": 5,
        },
    )
    add_request(
        scenario,
        "Flatten this batch, thanks",
        arrive=3,
        max_tokens=4,
        ignore_eos=True,
    )
    run = expect_engine_matches(scenario)
    expect(
        run.event_counts["prefix_hit"] >= 1,
        _("the last request should reuse cached blocks"),
    )
