"""Checks for lesson 16: fork and copy_on_write."""

from nanoengine.block_manager import BlockManager
from nanoengine.sequence import EventKind, Sequence
from nanoengine.step_record import StepRecord
from tracer.i18n import _
from tracer.teach.kit import (
    EngineRun,
    beam_search_under_pressure,
    expect,
    expect_engine_matches,
    lesson_scenario,
    make_block_manager,
    make_sequence,
    run_engine,
)
from tracer.teach.swap import original

TARGETS = {
    "fork": "BlockManager.fork",
    "copy_on_write": "BlockManager.copy_on_write",
}


# ---- the situations ---------------------------------------------------------
def first_beam(num_tokens: int = 6) -> tuple[BlockManager, Sequence]:
    """A beam after its prefill (block size 4): blocks [0, 1], its first token
    sampled; it writes position num_tokens next."""
    bm = make_block_manager(8)
    beam = make_sequence(num_tokens, name="A", generated=[5])
    bm.allocate(beam, num_tokens)
    beam.num_cached_tokens = num_tokens
    bm.register_full_blocks(beam)
    return bm, beam


def forked_by_engine(bm: BlockManager, parent: Sequence) -> Sequence:
    """A child forked by the engine's own code (not yours)."""
    child = parent.fork()
    original("BlockManager.fork")(bm, parent, child)
    return child


def step_beam(fns, bm: BlockManager, beam: Sequence) -> None:
    """What a step does to a beam's blocks: your copy_on_write, the engine's
    allocate for one token, the token written and a new one sampled."""
    fns.copy_on_write(bm, beam)
    bm.allocate(beam, 1)
    beam.num_cached_tokens += 1
    beam.token_ids.append(5)


def leaked(bm: BlockManager, why: str = "") -> str:
    """'' when every block is free again, else the mistake in one line (why:
    its cause, when the check saw it)."""
    held = {b: n for b, n in enumerate(bm.ref_counts) if n > 0}
    if held:
        return _(
            "a pruned beam's blocks leaked: with every beam finished, block(s) "
            "{blocks} still have ref count(s) {counts}. {why}"
        ).format(
            blocks=", ".join(map(str, held)),
            counts=", ".join(map(str, held.values())),
            why=why
            or _(
                "Each fork adds one holder to each block; each free, and each "
                "copy-on-write of a shared block, removes one"
            ),
        )
    below = {b: n for b, n in enumerate(bm.ref_counts) if n < 0}
    if below:
        return _(
            "with every beam finished, block(s) {blocks} have ref count(s) "
            "{counts}, below 0: a block was released more often than it was "
            "held"
        ).format(
            blocks=", ".join(map(str, below)),
            counts=", ".join(map(str, below.values())),
        )
    return ""


# ---- fork -------------------------------------------------------------------
def check_fork_shares_every_block(fns):
    """fork gives the child its parent's blocks and raises each one's ref count."""
    bm, parent = first_beam()
    child = parent.fork()
    fns.fork(bm, parent, child)
    expect(
        child.block_table == [0, 1],
        _(
            "after fork(parent, child) the child's block_table is {table}; "
            "it must be its parent's, [0, 1]: the child shares every block, "
            "no K/V is copied at a fork"
        ).format(table=child.block_table),
    )
    expect(
        bm.ref_counts[:2] == [2, 2],
        _(
            "ref count not raised on fork: after the fork blocks 0 and 1 have "
            "ref counts {counts}, expected [2, 2]: the child is one more "
            "holder of each of its parent's blocks"
        ).format(counts=bm.ref_counts[:2]),
    )
    expect(
        parent.block_table == [0, 1],
        _("fork changed the parent's block_table to {table}").format(
            table=parent.block_table
        ),
    )
    expect(
        bm.num_free_blocks == 6,
        _(
            "fork took blocks from the free list ({free} of 8 are free, "
            "expected 6): a fork copies nothing"
        ).format(free=bm.num_free_blocks),
    )
    expect(
        child.block_hashes == parent.block_hashes,
        _(
            "the child's block_hashes are {got}; they must be its parent's, "
            "{want}: its full blocks are the parent's, already cached"
        ).format(got=child.block_hashes, want=parent.block_hashes),
    )
    second = parent.fork()
    fns.fork(bm, parent, second)
    expect(
        bm.ref_counts[:2] == [3, 3],
        _(
            "ref count not raised on fork: a second child of the same beam "
            "makes 3 holders of blocks 0 and 1, but their ref counts are "
            "{counts}"
        ).format(counts=bm.ref_counts[:2]),
    )


# ---- copy_on_write ------------------------------------------------------------
def check_copy_on_write_leaves_an_own_block_alone(fns):
    """copy_on_write returns None when the block written next is the beam's own, or not there yet."""
    bm, beam = first_beam()
    got = fns.copy_on_write(bm, beam)
    expect(
        got is None and beam.block_table == [0, 1],
        _(
            "copy_on_write returned {got} and made the table {table}, but "
            "block 1 is the beam's alone (ref count 1): writing into it harms "
            "nobody, so return None and change nothing"
        ).format(got=got, table=beam.block_table),
    )
    expect(
        bm.ref_counts[:3] == [1, 1, 0] and bm.num_free_blocks == 6,
        _(
            "copy_on_write of a block nobody shares changed the pool: ref "
            "counts of blocks 0-2 {counts}, {free} blocks free (expected "
            "[1, 1, 0] and 6)"
        ).format(counts=bm.ref_counts[:3], free=bm.num_free_blocks),
    )
    bm, full = first_beam(8)  # its next token, position 8, opens block index 2
    forked_by_engine(bm, full)
    got = fns.copy_on_write(bm, full)
    expect(
        got is None and full.block_table == [0, 1],
        _(
            "the beam's next token (position 8) opens a new block, index 2, "
            "past the end of its 2-block table: nothing is shared there and "
            "allocate gives it a fresh block, so return None; got {got}, "
            "table {table}"
        ).format(got=got, table=full.block_table),
    )


def check_copy_on_write_copies_the_block_written_next(fns):
    """A beam about to write into a shared block gets a copy of that one block, and returns (source, copy)."""
    bm, parent = first_beam()
    child = forked_by_engine(bm, parent)  # both hold [0, 1], ref counts 2
    got = fns.copy_on_write(bm, child)
    table = child.block_table
    expect(
        got is not None or table != [0, 1],
        _(
            "writing into a shared block: copy_on_write returned None, but "
            "the beam writes its next token (position 6) into block 1, which "
            "2 beams hold: it would overwrite the other beam's K/V. Give it "
            "a copy of block 1"
        ),
    )
    expect(
        len(table) == 2 and table[1] != 1,
        _(
            "writing into a shared block: copy_on_write returned {got}, but "
            "the beam's block_table is {table}: index 1 must hold the copy, "
            "else the beam still writes into block 1, shared"
        ).format(got=got, table=table),
    )
    expect(
        table[0] == 0,
        _(
            "copied the whole block table: block 0 was replaced too (the "
            "table is {table}). Copy only the block the beam writes next, "
            "index num_cached_tokens // block_size = 1: the full blocks "
            "before it are never written again, and stay shared"
        ).format(table=table),
    )
    copy = table[1]
    expect(
        isinstance(got, (tuple, list)) and tuple(got) == (1, copy),
        _(
            "copy_on_write must return (source, copy) = (1, {copy}): the "
            "runner copies block 1's K/V into block {copy} before the step "
            "writes; it returned {got}"
        ).format(copy=copy, got=got),
    )
    expect(
        bm.ref_counts[1] == 1,
        _(
            "the copy not released from the source: block 1's ref count is "
            "{n} after the beam moved to its copy, expected 1. The beam no "
            "longer holds block 1: lower its ref count by one (the other "
            "beam still holds it)"
        ).format(n=bm.ref_counts[1]),
    )
    expect(
        bm.ref_counts[copy] == 1 and copy not in bm.free_blocks,
        _(
            "the copy, block {copy}, must come from self.take_free_block(): "
            "off the free list, ref count 1; its ref count is {n}"
        ).format(copy=copy, n=bm.ref_counts[copy]),
    )
    expect(
        parent.block_table == [0, 1],
        _(
            "copy_on_write changed the other beam's table to {table}: only "
            "the beam it is given moves to a copy"
        ).format(table=parent.block_table),
    )


def check_copy_on_write_among_three_beams(fns):
    """With three holders, the first two writers copy and the last one writes into the block itself."""
    bm, a = first_beam()
    b, c = forked_by_engine(bm, a), forked_by_engine(bm, a)  # ref counts 3
    first = fns.copy_on_write(bm, b)
    expect(
        first is not None,
        _(
            "writing into a shared block: three beams hold block 1 and "
            "copy_on_write returned None for the first of them to write"
        ),
    )
    expect(
        bm.ref_counts[1] == 2,
        _(
            "the copy not released from the source: three beams held block "
            "1; after one moved to a copy it has 2 holders, but its ref "
            "count is {n}"
        ).format(n=bm.ref_counts[1]),
    )
    second = fns.copy_on_write(bm, c)
    expect(
        second is not None and bm.ref_counts[1] == 1,
        _(
            "the second beam must copy block 1 too (2 holders before it), "
            "leaving the ref count 1; copy_on_write returned {got}, the ref "
            "count is {n}"
        ).format(got=second, n=bm.ref_counts[1]),
    )
    last = fns.copy_on_write(bm, a)
    expect(
        last is None and a.block_table == [0, 1],
        _(
            "the last holder of block 1 writes into it itself (its ref count "
            "is 1 now): copy_on_write must return None, got {got}"
        ).format(got=last),
    )


def check_beams_free_every_block(fns):
    """Fork, copy-on-write, prune and finish: every block is free again."""
    bm, parent = first_beam()
    children = [parent.fork(), parent.fork()]
    for child in children:
        fns.fork(bm, parent, child)
    same_list = any(c.block_table is parent.block_table for c in children)
    for beam in (parent, *children):
        step_beam(fns, bm, beam)
    bm.free(children[0])  # pruned
    bm.free(parent)  # finished
    bm.free(children[1])
    why = ""
    if same_list:
        why = _(
            "The children hold their parent's block_table list itself, not "
            "a copy: when one beam moves to a copy, all of them do. Give each "
            "child list(parent.block_table)"
        )
    message = leaked(bm, why)
    expect(
        not message,
        _("after 2 forks, a step of 3 beams and their frees: {message}").format(
            message=message
        ),
    )
    expect(
        bm.num_free_blocks == 8,
        _(
            "after every beam was freed {free} of 8 blocks are on the free list"
        ).format(free=bm.num_free_blocks),
    )


# ---- the engine -------------------------------------------------------------
def shared_write(record: StepRecord, block_size: int) -> str:
    """'' unless a sequence wrote K/V into a block another running one held.
    (One admitted in this step may hit a full block the step computes: it
    only reads it.)"""
    forked = {e.seq_id for e in record.events if e.kind == EventKind.FORKED}
    scheduled = dict(zip(record.inputs.seq_ids, record.inputs.block_tables))
    held: dict[int, set[int]] = {}
    for s in record.seqs:
        if s.status_before == "RUNNING" and s.seq_id not in forked:
            for block in scheduled.get(s.seq_id, s.block_table):
                held.setdefault(block, set()).add(s.seq_id)
    starts = record.inputs.query_start_loc
    for i, seq_id in enumerate(record.inputs.seq_ids):
        slots = record.inputs.slot_mapping[starts[i] : starts[i + 1]]
        for block in sorted({slot // block_size for slot in slots}):
            others = sorted(held.get(block, set()) - {seq_id})
            if others:
                return _(
                    "writing into a shared block: in step {step} seq {seq} "
                    "wrote K/V into block {block}, which seq(s) {others} "
                    "held too"
                ).format(
                    step=record.step,
                    seq=seq_id,
                    block=block,
                    others=", ".join(map(str, others)),
                )
    return ""


def beams_of(run: EngineRun) -> list[list[tuple[list[int], float]]]:
    """Each request's outputs: (tokens, cumulative logprob) per sequence."""
    return [
        [
            (c.token_ids, round(c.cumulative_logprob or 0.0, 4))
            for c in o.outputs
        ]
        for o in run.outputs
    ]


def expect_same_beam_search(scenario) -> EngineRun:
    """Run the scenario with your functions: no leak, no shared write, the
    copies and the beams of the engine's own code."""
    mine = run_engine(scenario)
    bm = mine.engine.block_manager
    message = leaked(bm)
    expect(
        not message,
        _("after the beam search: {message}").format(message=message),
    )
    for record in mine.records:
        message = shared_write(record, bm.block_size)
        expect(not message, message)
    ref = run_engine(scenario, reference=True)
    for a, b in zip(mine.records, ref.records):
        expect(
            a.blocks_to_copy == b.blocks_to_copy,
            _(
                "step {step} copied (source, copy) {mine}; the engine's own "
                "code copies {theirs}"
            ).format(
                step=a.step,
                mine=list(a.blocks_to_copy),
                theirs=list(b.blocks_to_copy),
            ),
        )
    for i, (got, want) in enumerate(zip(beams_of(mine), beams_of(ref))):
        expect(
            got == want,
            _(
                "request {i}'s sequences (tokens, cumulative logprob) are "
                "{got}; the engine's own code gives {want}"
            ).format(i=i, got=got, want=want),
        )
    expect_engine_matches(scenario)
    return mine


def engine_beam_search(fns):
    """The lesson's scenario (2 samples and a beam search of 3) runs as the engine's own code runs it."""
    run = expect_same_beam_search(lesson_scenario(__file__))
    kinds = {e.kind for r in run.records for e in r.events}
    expect(
        {EventKind.FORKED, EventKind.COPY_ON_WRITE} <= kinds,
        _("this run should fork beams and copy on write; it did not"),
    )


def engine_beam_search_restarts(fns):
    """With 12 blocks the beam search is preempted, restarts from its prompt and finds the same beams."""
    run = expect_same_beam_search(
        beam_search_under_pressure(__file__, focus={})
    )
    kinds = [e.kind for r in run.records for e in r.events]
    expect(
        EventKind.PREEMPTED in kinds,
        _("this run should preempt the beam search; nothing was preempted"),
    )
