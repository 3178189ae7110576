"""Checks for lesson 1: check_stop."""

from nanoengine.sequence import FinishReason, Sequence
from tracer.teach.kit import (
    EOS,
    expect,
    expect_engine_matches,
    lesson_scenario,
    make_scheduler,
    make_sequence,
)
from tracer.teach.scenarios import Request

TARGETS = {"check_stop": "Scheduler.check_stop"}


def sequence_after(prompt_len: int, generated: list[int], **params) -> Sequence:
    """A sequence whose last generated token has just been appended (as postprocess does)."""
    return make_sequence(prompt_len, generated=generated, **params)


def ask(fns, seq: Sequence, max_model_len: int = 64):
    result = fns.check_stop(
        make_scheduler(max_model_len=max_model_len, eos=True),
        seq,
        seq.token_ids[-1],
    )
    expect(
        result is None or isinstance(result, FinishReason),
        f"check_stop must return a FinishReason member or None, got {result!r}",
    )
    return result


def check_ordinary_token_continues(fns):
    """An ordinary token, far from any limit, lets the request continue (None)."""
    result = ask(fns, sequence_after(5, [40], max_tokens=10))
    expect(
        result is None,
        f"after 1 of 10 tokens (not EOS) check_stop returned {result!r}; expected None",
    )


def check_eos_stops(fns):
    """The end-of-sequence token stops the request with FinishReason.STOP."""
    result = ask(fns, sequence_after(5, [40, EOS], max_tokens=10))
    expect(
        result == FinishReason.STOP,
        f"the token just appended is the EOS id {EOS} (it is in self.eos_token_ids) but check_stop "
        f"returned {result!r}; expected FinishReason.STOP",
    )


def check_ignore_eos(fns):
    """With ignore_eos=True the EOS token is just another token."""
    result = ask(
        fns, sequence_after(5, [40, EOS], max_tokens=10, ignore_eos=True)
    )
    expect(
        result is None,
        f"the request set ignore_eos=True, so EOS must not stop it; check_stop returned {result!r}; expected None",
    )


def check_max_tokens(fns):
    """The request stops with LENGTH exactly when it has generated max_tokens tokens."""
    before = ask(fns, sequence_after(5, [40, 41], max_tokens=3))
    expect(
        before is None,
        f"after 2 of max_tokens=3 generated tokens check_stop returned {before!r}; "
        f"expected None (one more token to go)"
        + (
            ". The prompt's 5 tokens are not generated tokens: count with seq.num_completion_tokens, not seq.num_tokens"
            if before == FinishReason.LENGTH
            else ""
        ),
    )
    at = ask(fns, sequence_after(5, [40, 41, 42], max_tokens=3))
    late = (
        ask(fns, sequence_after(5, [40, 41, 42, 43], max_tokens=3))
        if at is None
        else None
    )
    expect(
        at == FinishReason.LENGTH,
        f"after 3 of max_tokens=3 generated tokens check_stop returned {at!r}; expected FinishReason.LENGTH"
        + (
            f" (it returned {late.name} only one token later: compare with >=, not >: the request has "
            f"used its budget once num_completion_tokens == max_tokens)"
            if late is not None
            else ". Compare seq.num_completion_tokens with seq.params.max_tokens"
        ),
    )


def check_prompt_not_counted(fns):
    """max_tokens counts generated tokens only, not the prompt."""
    result = ask(fns, sequence_after(20, [40], max_tokens=5))
    expect(
        result is None,
        f"a 20-token prompt with 1 generated token and max_tokens=5: check_stop returned "
        f"{result!r}; expected None. Use seq.num_completion_tokens",
    )


def check_max_model_len(fns):
    """A sequence that reaches max_model_len (prompt + output) stops with LENGTH."""
    result = ask(
        fns, sequence_after(14, [40, 41], max_tokens=50), max_model_len=16
    )
    expect(
        result == FinishReason.LENGTH,
        f"14 prompt + 2 generated tokens = 16 = max_model_len, but "
        f"check_stop returned {result!r}; expected FinishReason.LENGTH",
    )
    below = ask(fns, sequence_after(14, [40], max_tokens=50), max_model_len=16)
    expect(
        below is None,
        f"15 tokens with max_model_len=16: check_stop returned {below!r}; expected None",
    )


def check_eos_wins_over_length(fns):
    """EOS arriving exactly at max_tokens is reported as STOP."""
    result = ask(fns, sequence_after(5, [40, EOS], max_tokens=2))
    expect(
        result == FinishReason.STOP,
        f"the 2nd of max_tokens=2 tokens is EOS: check_stop returned {result!r}; "
        f"expected FinishReason.STOP (test EOS first)",
    )


def engine_lesson_scenario(fns):
    """The engine, running the lesson's scenario with your check_stop, matches the engine's own."""
    expect_engine_matches(lesson_scenario(__file__))


def engine_context_limit(fns):
    """A request that hits max_model_len in the engine stops there, with reason 'length'."""
    scenario = lesson_scenario(
        __file__,
        engine={"block_size": 4, "num_kv_blocks": 16, "max_model_len": 8},
        requests=[Request("Hi!", {"max_tokens": 20, "ignore_eos": True})],
    )
    run = expect_engine_matches(scenario)
    out = run.outputs[0]
    expect(
        len(out.prompt_token_ids) + len(out.token_ids) == 8
        and out.finish_reason == "length",
        f"a 3-token prompt with max_model_len=8 must stop at 8 tokens with reason 'length'; it stopped at "
        f"{len(out.prompt_token_ids) + len(out.token_ids)} with reason {out.finish_reason!r}",
    )
