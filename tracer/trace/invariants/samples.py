"""The n samples of one request (SamplingParams(n)): n sequences that are one request.

vLLM v1 fans `n` out into n child requests (its front end's ParentRequest); nanoengine does the same
inside add_request. A sample's row names its request (step_line.request_of: sample 0's seq_id), and
its request entry carries the request's `n` and its own seed. Two rules:

    sample_params        the samples are the request: one prompt, one set of params, seed + i
                         (correctness: any engine that fans n out must keep it)
    sample_prefix_share  a sample admitted while a sibling holds blocks finds the prompt's full blocks
                         that sibling computed or scheduled, in the same step too (vLLM v1's
                         same-step prefix hits: how the n samples come to share one prompt's KV; a
                         policy, as an engine may hash blocks only once computed)
"""

from __future__ import annotations

from collections.abc import Iterator

from nanoengine.sequence import EventKind
from tracer.i18n import N_
from tracer.trace.invariants.reading import events_of
from tracer.trace.invariants.rule import Context, Findings, invariant
from tracer.trace.step_line import beam_width_of, request_of


def groups(ctx: Context) -> dict[int, list[int]]:
    """request id -> its samples' seq_ids, in order (sample i is the i-th), from the step's rows. A beam
    search's beams are no samples (tracer/trace/invariants/beams.py checks them)."""
    found: dict[int, list[int]] = {}
    for sid in sorted(ctx.seqs):
        if not beam_width_of(ctx.seqs[sid]):
            found.setdefault(request_of(ctx.seqs[sid]), []).append(sid)
    return found


def new_groups(ctx: Context) -> Iterator[tuple[int, list[int]]]:
    """The requests with a sample seen for the first time in this step (checked once, when they arrive)."""
    for request_id, sids in groups(ctx).items():
        if ctx.prev is None or any(sid not in ctx.prev for sid in sids):
            yield request_id, sids


def without_seed(params: dict) -> dict:
    return {name: value for name, value in params.items() if name != "seed"}


@invariant(
    N_(
        "the n samples of a request are that request: its prompt tokens and its params, apart from the "
        "seed (sample i draws with the request's seed + i)"
    ),
)
def sample_params(ctx: Context) -> Findings:
    for request_id, sids in new_groups(ctx):
        params = [ctx.params.get(sid) for sid in sids]
        n = params[0].get("n", 1) if params[0] is not None else len(sids)
        if n != len(sids):
            yield request_id, f"request {request_id} asked for n={n} samples but has {len(sids)}: seqs {sids}"
        if len(sids) < 2:
            continue
        yield from same_prompt(ctx, request_id, sids)
        if all(p is not None for p in params):
            yield from same_params(request_id, sids, params)  # type: ignore[arg-type]


def same_prompt(ctx: Context, request_id: int, sids: list[int]) -> Findings:
    first = ctx.seqs[sids[0]]
    prompt = ctx.tokens.get(sids[0], [])[: first["num_prompt_tokens"]]
    for i, sid in enumerate(sids[1:], 1):
        row = ctx.seqs[sid]
        mine = ctx.tokens.get(sid, [])[: row["num_prompt_tokens"]]
        if row["num_prompt_tokens"] != first["num_prompt_tokens"] or (prompt and mine and mine != prompt):
            yield (
                sid,
                (
                    f"sample {i} of request {request_id} (seq {sid}) has a prompt of {row['num_prompt_tokens']} "
                    f"tokens that is not sample 0's ({first['num_prompt_tokens']} tokens): n samples share one prompt"
                ),
            )


def same_params(request_id: int, sids: list[int], params: list[dict]) -> Findings:
    seed0 = params[0].get("seed")
    for i, (sid, p) in enumerate(zip(sids[1:], params[1:]), 1):
        if without_seed(p) != without_seed(params[0]):
            differ = sorted(k for k in p.keys() | params[0].keys() if k != "seed" and p.get(k) != params[0].get(k))
            yield (
                sid,
                (
                    f"sample {i} of request {request_id} (seq {sid}) differs from sample 0 in {', '.join(differ)}: "
                    f"n samples share the request's params"
                ),
            )
        want = None if seed0 is None else seed0 + i
        if p.get("seed") != want:
            yield (
                sid,
                (
                    f"sample {i} of request {request_id} (seq {sid}) draws with seed {p.get('seed')}, not {want}: "
                    f"sample i of a seeded request uses seed + i (vLLM v1), so the samples differ"
                ),
            )


@invariant(
    N_(
        "a sample admitted while another sample of its request holds blocks hits every full prompt block that "
        "sample has computed or scheduled (prefix caching on, no prompt logprobs)"
    ),
    checks=("BlockManager.register_full_blocks", "BlockManager.find_cached_prefix"),
    field="num_cached_tokens",
)
def sample_prefix_share(ctx: Context) -> Findings:
    if not ctx.config.get("enable_prefix_caching"):
        return
    holders: dict[int, list[dict]] = {}  # request id -> its samples holding blocks when the next is admitted
    for row in ctx.seqs.values():
        if row["status_before"] == "RUNNING" and not beam_width_of(row):  # scheduled before any admission
            holders.setdefault(request_of(row), []).append(row)
    for event in events_of(ctx.step, EventKind.ADMITTED):
        admitted = ctx.seqs.get(event["seq_id"])
        if admitted is None or beam_width_of(admitted):
            continue
        before = holders.setdefault(request_of(admitted), [])
        fresh = admitted["num_tokens"] == admitted["num_prompt_tokens"]  # not a preempted sample coming back
        asks_prompt_logprobs = (ctx.params.get(admitted["seq_id"]) or {}).get("prompt_logprobs") is not None
        if before and fresh and not asks_prompt_logprobs:
            yield from shares_with(admitted, before, ctx.block_size)
        before.append(admitted)


def shares_with(row: dict, before: list[dict], bs: int) -> Findings:
    """row hits every full prompt block a sibling holds with computed or scheduled K/V (short of the
    prompt's last token, which is always computed)."""
    sid, prompt = row["seq_id"], row["num_prompt_tokens"]
    for other in before:
        known = other["num_cached_tokens"] + other["num_scheduled_tokens"]
        want = min(known, prompt - 1) // bs  # blocks
        table, theirs = list(row["block_table"][:want]), list(other["block_table"][:want])
        if row["num_cached_tokens"] < want * bs or table != theirs:
            yield (
                sid,
                (
                    f"seq {sid} was admitted while seq {other['seq_id']}, a sample of the same request, held "
                    f"{want} full prompt blocks {theirs}, but it hit {row['num_cached_tokens'] // bs} of them: "
                    f"its blocks {table} compute the same prompt again"
                ),
            )
            return
