"""Checks for lesson 2: postprocess."""

from nanoengine.scheduler import Scheduler
from nanoengine.sequence import FinishReason, Sequence, SequenceStatus
from tracer.teach.kit import (
    EOS,
    event_kinds,
    expect,
    expect_engine_matches,
    lesson_scenario,
    make_scheduler,
    make_sequence,
)

TARGETS = {"postprocess": "Scheduler.postprocess"}


def setup(
    prompt_len: int, budget: int = 4, **params
) -> tuple[Scheduler, Sequence]:
    sched = make_scheduler(budget=budget, max_model_len=64, eos=True)
    seq = make_sequence(
        prompt_len, ignore_eos=params.pop("ignore_eos", True), **params
    )
    sched.add(seq)
    return sched, seq


def run_step(fns, sched: Scheduler, token_ids: list[int]):
    """One step: the engine's schedule(), then your postprocess with the given sampled tokens."""
    out = sched.schedule()
    appended = fns.postprocess(sched, out, token_ids[: len(out.seqs)])
    expect(
        isinstance(appended, list),
        f"postprocess must return a list of sequences, got {appended!r}",
    )
    return out, appended


def check_mid_prefill_keeps_no_token(fns):
    """A chunk that leaves the prompt unfinished advances the cache but keeps no token."""
    sched, seq = setup(6, budget=4, max_tokens=3)
    out, appended = run_step(fns, sched, [99])
    expect(
        seq.num_cached_tokens == 4,
        f"after a 4-token chunk of a fresh prompt num_cached_tokens is "
        f"{seq.num_cached_tokens}; expected 4 (add num_scheduled_tokens)",
    )
    expect(
        seq.num_scheduled_tokens == 0,
        f"num_scheduled_tokens is {seq.num_scheduled_tokens} after the step; it must be reset to 0",
    )
    expect(
        seq.num_tokens == 6,
        f"the prompt is only 4/6 computed, so the sampled token must be dropped, but "
        f"num_tokens went from 6 to {seq.num_tokens}",
    )
    expect(
        appended == [],
        f"no sequence gained a token, but postprocess returned {len(appended)} sequence(s)",
    )
    expect(
        seq.num_prefill_chunks == 1 and seq.is_prefilling,
        f"after chunk 1 num_prefill_chunks is {seq.num_prefill_chunks} and is_prefilling is "
        f"{seq.is_prefilling}; expected 1 and True (count the chunk: seq.num_prefill_chunks += 1)",
    )
    expect(
        "prefill_done" not in event_kinds(out),
        "a 'prefill_done' event was recorded, but the prefill is not done",
    )


def check_last_chunk_keeps_token(fns):
    """The chunk that completes the prompt keeps its token and records prefill_done."""
    sched, seq = setup(6, budget=4, max_tokens=3)
    run_step(fns, sched, [99])
    out, appended = run_step(fns, sched, [77])
    expect(
        seq.num_cached_tokens == 6,
        f"num_cached_tokens is {seq.num_cached_tokens} after both chunks; expected 6",
    )
    expect(
        seq.token_ids[-1] == 77 and seq.num_tokens == 7,
        f"the prompt is now fully computed, so the sampled token 77 must be appended; token_ids ends with "
        f"{seq.token_ids[-2:]} (num_tokens {seq.num_tokens}, expected 7)",
    )
    expect(
        appended == [seq],
        "postprocess must return the sequences that gained a token: [seq]",
    )
    done = [e.detail for e in out.events if e.kind == "prefill_done"]
    expect(
        done == [{"chunks": 2}],
        f"expected one 'prefill_done' event with detail {{'chunks': 2}}, got {done}",
    )
    expect(
        not seq.is_prefilling,
        "is_prefilling must be False once the prefill is done, got True",
    )


def check_decode_step(fns):
    """A decode step caches one token and appends the next: num_tokens stays num_cached_tokens + 1."""
    sched, seq = setup(3, budget=16, max_tokens=5)
    run_step(fns, sched, [50])
    out, appended = run_step(fns, sched, [51])
    expect(
        (seq.num_tokens, seq.num_cached_tokens) == (5, 4),
        f"after a prefill and one decode step of a 3-token prompt, (num_tokens, num_cached_tokens) is "
        f"{(seq.num_tokens, seq.num_cached_tokens)}; expected (5, 4)",
    )
    expect(
        seq.token_ids[3:] == [50, 51],
        f"the generated tokens are {seq.token_ids[3:]}; expected [50, 51]",
    )
    expect(
        event_kinds(out) == [],
        f"a plain decode step records no events, got {event_kinds(out)}",
    )


def check_tokens_go_to_their_sequence(fns):
    """With several sequences in the batch, token_ids[i] belongs to out.seqs[i]."""
    sched, a = setup(3, budget=16, max_tokens=5)
    b = make_sequence(5, name="B", max_tokens=5, ignore_eos=True)
    sched.add(b)
    out, appended = run_step(fns, sched, [61, 62])
    expect(
        (a.token_ids[-1], b.token_ids[-1]) == (61, 62),
        f"the batch was [A, B] and the sampled tokens [61, 62], but A ends with {a.token_ids[-1]} and B with "
        f"{b.token_ids[-1]}",
    )
    expect(
        appended == [a, b],
        "postprocess must return [A, B]: both gained a token",
    )


def check_finishes_at_max_tokens(fns):
    """A sequence that reaches max_tokens is finished (check_stop, then finish) and frees its blocks."""
    sched, seq = setup(3, budget=16, max_tokens=2)
    run_step(fns, sched, [50])
    out, appended = run_step(fns, sched, [51])
    expect(
        seq.status == SequenceStatus.FINISHED
        and seq.finish_reason == FinishReason.LENGTH,
        f"2 of max_tokens=2 tokens generated, but the sequence is {seq.status.value} "
        f"(finish_reason {seq.finish_reason}); call self.check_stop and self.finish",
    )
    expect(
        appended == [seq],
        "a sequence that finished this step still gained a token: return it",
    )
    expect(
        sched.block_manager.num_free_blocks == 16,
        "a finished sequence's blocks must be freed (self.finish does it)",
    )
    expect(
        "finished" in event_kinds(out),
        "self.finish(seq, reason, out) records the 'finished' event; pass out to it",
    )


def check_eos_finishes(fns):
    """The EOS token finishes a request that does not ignore it."""
    sched, seq = setup(3, budget=16, max_tokens=8, ignore_eos=False)
    run_step(fns, sched, [EOS])
    expect(
        seq.finish_reason == FinishReason.STOP,
        f"EOS was sampled; finish_reason is {seq.finish_reason}, expected FinishReason.STOP",
    )


def engine_lesson_scenario(fns):
    """The engine, running the lesson's scenario with your postprocess, matches the engine's own."""
    expect_engine_matches(lesson_scenario(__file__))


def engine_budget_of_one(fns):
    """Even with a budget of 1 token per step (every prompt token its own chunk), it still matches."""
    expect_engine_matches(
        lesson_scenario(
            __file__,
            engine={
                "block_size": 4,
                "num_kv_blocks": 16,
                "max_num_batched_tokens": 1,
            },
        )
    )
