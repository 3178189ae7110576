"""Checks for lesson 2: postprocess."""

from nanoengine.scheduler import Scheduler
from nanoengine.sequence import FinishReason, Sequence, SequenceStatus
from tracer.i18n import _
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
        _(
            "postprocess must return a list of sequences, got {appended!r}"
        ).format(appended=appended),
    )
    return out, appended


def check_mid_prefill_keeps_no_token(fns):
    """A chunk that leaves the prompt unfinished advances the cache but keeps no token."""
    sched, seq = setup(6, budget=4, max_tokens=3)
    out, appended = run_step(fns, sched, [99])
    expect(
        seq.num_cached_tokens == 4,
        _(
            "after a 4-token chunk of a fresh prompt "
            "num_cached_tokens is {num_cached_tokens}; expected 4 "
            "(add num_scheduled_tokens)"
        ).format(num_cached_tokens=seq.num_cached_tokens),
    )
    expect(
        seq.num_scheduled_tokens == 0,
        _(
            "num_scheduled_tokens is {num_scheduled_tokens} after "
            "the step; it must be reset to 0"
        ).format(num_scheduled_tokens=seq.num_scheduled_tokens),
    )
    expect(
        seq.num_tokens == 6,
        _(
            "the prompt is only 4/6 computed, so the sampled token "
            "must be dropped, but num_tokens went from 6 to "
            "{num_tokens}"
        ).format(num_tokens=seq.num_tokens),
    )
    expect(
        appended == [],
        _(
            "no sequence gained a token, but postprocess returned "
            "{n} sequence(s)"
        ).format(n=len(appended)),
    )
    expect(
        seq.num_prefill_chunks == 1 and seq.is_prefilling,
        _(
            "after chunk 1 num_prefill_chunks is "
            "{num_prefill_chunks} and is_prefilling is "
            "{is_prefilling}; expected 1 and True (count the chunk: "
            "seq.num_prefill_chunks += 1)"
        ).format(
            num_prefill_chunks=seq.num_prefill_chunks,
            is_prefilling=seq.is_prefilling,
        ),
    )
    expect(
        "prefill_done" not in event_kinds(out),
        _("a 'prefill_done' event was recorded, but the prefill is not done"),
    )


def check_last_chunk_keeps_token(fns):
    """The chunk that completes the prompt keeps its token and records prefill_done."""
    sched, seq = setup(6, budget=4, max_tokens=3)
    run_step(fns, sched, [99])
    out, appended = run_step(fns, sched, [77])
    expect(
        seq.num_cached_tokens == 6,
        _(
            "num_cached_tokens is {num_cached_tokens} after both "
            "chunks; expected 6"
        ).format(num_cached_tokens=seq.num_cached_tokens),
    )
    expect(
        seq.token_ids[-1] == 77 and seq.num_tokens == 7,
        _(
            "the prompt is now fully computed, so the sampled token "
            "77 must be appended; token_ids ends with {last_two} "
            "(num_tokens {num_tokens}, expected 7)"
        ).format(last_two=seq.token_ids[-2:], num_tokens=seq.num_tokens),
    )
    expect(
        appended == [seq],
        _("postprocess must return the sequences that gained a token: [seq]"),
    )
    done = [e.detail for e in out.events if e.kind == "prefill_done"]
    expect(
        done == [{"chunks": 2}],
        _(
            "expected one 'prefill_done' event with detail "
            "{{'chunks': 2}}, got {done}"
        ).format(done=done),
    )
    expect(
        not seq.is_prefilling,
        _("is_prefilling must be False once the prefill is done, got True"),
    )


def check_decode_step(fns):
    """A decode step caches one token and appends the next: num_tokens stays num_cached_tokens + 1."""
    sched, seq = setup(3, budget=16, max_tokens=5)
    run_step(fns, sched, [50])
    out, appended = run_step(fns, sched, [51])
    expect(
        (seq.num_tokens, seq.num_cached_tokens) == (5, 4),
        _(
            "after a prefill and one decode step of a 3-token "
            "prompt, (num_tokens, num_cached_tokens) is {counts}; "
            "expected (5, 4)"
        ).format(counts=(seq.num_tokens, seq.num_cached_tokens)),
    )
    expect(
        seq.token_ids[3:] == [50, 51],
        _("the generated tokens are {generated}; expected [50, 51]").format(
            generated=seq.token_ids[3:]
        ),
    )
    expect(
        event_kinds(out) == [],
        _("a plain decode step records no events, got {events}").format(
            events=event_kinds(out)
        ),
    )


def check_tokens_go_to_their_sequence(fns):
    """With several sequences in the batch, token_ids[i] belongs to out.seqs[i]."""
    sched, a = setup(3, budget=16, max_tokens=5)
    b = make_sequence(5, name="B", max_tokens=5, ignore_eos=True)
    sched.add(b)
    out, appended = run_step(fns, sched, [61, 62])
    expect(
        (a.token_ids[-1], b.token_ids[-1]) == (61, 62),
        _(
            "the batch was [A, B] and the sampled tokens [61, 62], "
            "but A ends with {last_a} and B with {last_b}"
        ).format(last_a=a.token_ids[-1], last_b=b.token_ids[-1]),
    )
    expect(
        appended == [a, b],
        _("postprocess must return [A, B]: both gained a token"),
    )


def check_finishes_at_max_tokens(fns):
    """A sequence that reaches max_tokens is finished (check_stop, then finish) and frees its blocks."""
    sched, seq = setup(3, budget=16, max_tokens=2)
    run_step(fns, sched, [50])
    out, appended = run_step(fns, sched, [51])
    expect(
        seq.status == SequenceStatus.FINISHED
        and seq.finish_reason == FinishReason.LENGTH,
        _(
            "2 of max_tokens=2 tokens generated, but the sequence is "
            "{value} (finish_reason {finish_reason}); call "
            "self.check_stop and self.finish"
        ).format(value=seq.status.value, finish_reason=seq.finish_reason),
    )
    expect(
        appended == [seq],
        _("a sequence that finished this step still gained a token: return it"),
    )
    expect(
        sched.block_manager.num_free_blocks == 16,
        _("a finished sequence's blocks must be freed (self.finish does it)"),
    )
    expect(
        "finished" in event_kinds(out),
        _(
            "self.finish(seq, reason, out) records the 'finished' "
            "event; pass out to it"
        ),
    )


def check_eos_finishes(fns):
    """The EOS token finishes a request that does not ignore it."""
    sched, seq = setup(3, budget=16, max_tokens=8, ignore_eos=False)
    run_step(fns, sched, [EOS])
    expect(
        seq.finish_reason == FinishReason.STOP,
        _(
            "EOS was sampled; finish_reason is {finish_reason}, "
            "expected FinishReason.STOP"
        ).format(finish_reason=seq.finish_reason),
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
