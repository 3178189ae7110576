"""The flat, unpadded batch (input_ids, positions, query_start_loc, seq_lens, ...) is built from
the sequences' counters and block tables."""

from __future__ import annotations

from tracer.i18n import N_
from tracer.trace.invariants.reading import batch_tokens, short, starts
from tracer.trace.invariants.rule import Context, Findings, invariant


@invariant(
    N_("sum(num_scheduled_tokens) == len(input_ids) == len(positions) == len(slot_mapping)"), checks=("prepare_inputs",)
)
def token_count(ctx: Context) -> Findings:
    inp = ctx.step["inputs"]
    total = sum(ctx.seqs[sid]["num_scheduled_tokens"] for sid in ctx.batch if sid in ctx.seqs)
    lengths = {name: len(inp[name]) for name in ("input_ids", "positions", "slot_mapping")}
    if any(n != total for n in lengths.values()):
        shown = ", ".join(f"len({k}) = {v}" for k, v in lengths.items())
        yield None, f"the batch schedules {total} tokens but {shown}"


@invariant(
    N_("seq_lens, block_tables, logits_indices and discard have one entry per batched sequence"),
    checks=("prepare_inputs",),
)
def batch_shapes(ctx: Context) -> Findings:
    inp = ctx.step["inputs"]
    for name in ("seq_lens", "block_tables", "logits_indices", "discard"):
        if len(inp[name]) != len(ctx.batch):
            yield None, f"{name} has {len(inp[name])} entries for {len(ctx.batch)} batched sequences"


@invariant(
    N_("query_start_loc starts at 0, never decreases, steps by num_scheduled_tokens, ends at the token count"),
    checks=("prepare_inputs",),
)
def query_start_loc(ctx: Context) -> Findings:
    qsl = ctx.step["inputs"]["query_start_loc"]
    total = len(ctx.step["inputs"]["input_ids"])
    if len(qsl) != len(ctx.batch) + 1 or qsl[0] != 0 or qsl[-1] != total:
        yield (
            None,
            f"query_start_loc {short(qsl)} must have "
            f"{len(ctx.batch) + 1} entries, start at 0 and end at the token count {total}",
        )
        return
    for i, sid in enumerate(ctx.batch):
        length = qsl[i + 1] - qsl[i]
        if length < 0:
            yield sid, f"query_start_loc decreases from {qsl[i]} to {qsl[i + 1]}"
        elif sid in ctx.seqs and length != ctx.seqs[sid]["num_scheduled_tokens"]:
            yield (
                sid,
                f"query_start_loc gives seq {sid} {length} tokens but it "
                f"has num_scheduled_tokens = {ctx.seqs[sid]['num_scheduled_tokens']}",
            )


@invariant(
    N_("each position == its sequence's num_cached_tokens + offset inside the chunk"), checks=("prepare_inputs",)
)
def positions(ctx: Context) -> Findings:
    positions = ctx.step["inputs"]["positions"]
    for sid, i, offset in batch_tokens(ctx):
        want = ctx.seqs[sid]["num_cached_tokens"] + offset
        if positions[i] != want:
            yield (
                sid,
                f"token {i} of the batch (seq {sid}) has position "
                f"{positions[i]} but num_cached_tokens + offset = {want}",
            )
            return


@invariant(N_("seq_lens == num_cached_tokens + num_scheduled_tokens"), checks=("prepare_inputs",))
def seq_lens(ctx: Context) -> Findings:
    for sid, got in zip(ctx.batch, ctx.step["inputs"]["seq_lens"]):
        s = ctx.seqs[sid]
        want = s["num_cached_tokens"] + s["num_scheduled_tokens"]
        if got != want:
            yield sid, f"seq {sid} has seq_len {got} but num_cached_tokens + num_scheduled_tokens = {want}"


@invariant(
    N_("logits_indices == query_start_loc[1:] - 1 (each sequence's last scheduled token)"), checks=("prepare_inputs",)
)
def logits_indices(ctx: Context) -> Findings:
    inp = ctx.step["inputs"]
    want = [q - 1 for q in inp["query_start_loc"][1:]]
    if list(inp["logits_indices"]) != want:
        yield None, f"logits_indices {short(inp['logits_indices'])} should be query_start_loc[1:] - 1 = {short(want)}"


@invariant(
    N_("input_ids are the sequence's tokens num_cached_tokens .. num_cached_tokens + num_scheduled_tokens"),
    checks=("prepare_inputs",),
)
def input_ids(ctx: Context) -> Findings:
    input_ids = ctx.step["inputs"]["input_ids"]
    for sid, start in starts(ctx).items():
        tokens = ctx.tokens.get(sid)
        if tokens is None:
            continue
        s = ctx.seqs[sid]
        want = tokens[s["num_cached_tokens"] : s["num_cached_tokens"] + s["num_scheduled_tokens"]]
        got = list(input_ids[start : start + s["num_scheduled_tokens"]])
        if got != want:
            yield (
                sid,
                f"seq {sid}'s input_ids {short(got)} are not its tokens "
                f"from position {s['num_cached_tokens']} on, {short(want)}",
            )


@invariant(
    N_("the batch's block_tables row is the sequence's block_table"), checks=("prepare_inputs",), field="block_table"
)
def block_tables_match(ctx: Context) -> Findings:
    for sid, row in zip(ctx.batch, ctx.step["inputs"]["block_tables"]):
        if list(row) != list(ctx.seqs[sid]["block_table"]):
            yield (
                sid,
                f"the batch gives seq {sid} block table {short(row)} "
                f"but it holds {short(ctx.seqs[sid]['block_table'])}",
            )
