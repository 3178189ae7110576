"""Checks for lesson 1: check_stop."""

from nanoengine.sequence import FinishReason, Sequence
from tracer.i18n import _
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
        _(
            "check_stop must return a FinishReason member or None, got {result!r}"
        ).format(result=result),
    )
    return result


def check_ordinary_token_continues(fns):
    """An ordinary token, far from any limit, lets the request continue (None)."""
    result = ask(fns, sequence_after(5, [40], max_tokens=10))
    expect(
        result is None,
        _(
            "after 1 of 10 tokens (not EOS) check_stop returned {result!r}; "
            "expected None"
        ).format(result=result),
    )


def check_eos_stops(fns):
    """The end-of-sequence token stops the request with FinishReason.STOP."""
    result = ask(fns, sequence_after(5, [40, EOS], max_tokens=10))
    expect(
        result == FinishReason.STOP,
        _(
            "the token just appended is the EOS id {eos} (it is in "
            "self.eos_token_ids) but check_stop returned {result!r}; expected "
            "FinishReason.STOP"
        ).format(eos=EOS, result=result),
    )


def check_ignore_eos(fns):
    """With ignore_eos=True the EOS token is just another token."""
    result = ask(
        fns, sequence_after(5, [40, EOS], max_tokens=10, ignore_eos=True)
    )
    expect(
        result is None,
        _(
            "the request set ignore_eos=True, so EOS must not stop it; "
            "check_stop returned {result!r}; expected None"
        ).format(result=result),
    )


def check_max_tokens(fns):
    """The request stops with LENGTH exactly when it has generated max_tokens tokens."""
    before = ask(fns, sequence_after(5, [40, 41], max_tokens=3))
    expect(
        before is None,
        (
            _(
                "after 2 of max_tokens=3 generated tokens check_stop returned "
                "{result!r}; expected None (one more token to go). The prompt's "
                "5 tokens are not generated tokens: count with "
                "seq.num_completion_tokens, not seq.num_tokens"
            )
            if before == FinishReason.LENGTH
            else _(
                "after 2 of max_tokens=3 generated tokens check_stop returned "
                "{result!r}; expected None (one more token to go)"
            )
        ).format(result=before),
    )
    at = ask(fns, sequence_after(5, [40, 41, 42], max_tokens=3))
    late = (
        ask(fns, sequence_after(5, [40, 41, 42, 43], max_tokens=3))
        if at is None
        else None
    )
    expect(
        at == FinishReason.LENGTH,
        (
            _(
                "after 3 of max_tokens=3 generated tokens check_stop returned "
                "{result!r}; expected FinishReason.LENGTH (it returned {late} "
                "only one token later: compare with >=, not >: the request has "
                "used its budget once num_completion_tokens == max_tokens)"
            )
            if late is not None
            else _(
                "after 3 of max_tokens=3 generated tokens check_stop returned "
                "{result!r}; expected FinishReason.LENGTH. Compare "
                "seq.num_completion_tokens with seq.params.max_tokens"
            )
        ).format(result=at, late=late.name if late is not None else ""),
    )


def check_prompt_not_counted(fns):
    """max_tokens counts generated tokens only, not the prompt."""
    result = ask(fns, sequence_after(20, [40], max_tokens=5))
    expect(
        result is None,
        _(
            "a 20-token prompt with 1 generated token and max_tokens=5: "
            "check_stop returned {result!r}; expected None. Use "
            "seq.num_completion_tokens"
        ).format(result=result),
    )


def check_max_model_len(fns):
    """A sequence that reaches max_model_len (prompt + output) stops with LENGTH."""
    result = ask(
        fns, sequence_after(14, [40, 41], max_tokens=50), max_model_len=16
    )
    expect(
        result == FinishReason.LENGTH,
        _(
            "14 prompt + 2 generated tokens = 16 = max_model_len, but "
            "check_stop returned {result!r}; expected FinishReason.LENGTH"
        ).format(result=result),
    )
    below = ask(fns, sequence_after(14, [40], max_tokens=50), max_model_len=16)
    expect(
        below is None,
        _(
            "15 tokens with max_model_len=16: check_stop returned {result!r}; "
            "expected None"
        ).format(result=below),
    )


def check_eos_wins_over_length(fns):
    """EOS arriving exactly at max_tokens is reported as STOP."""
    result = ask(fns, sequence_after(5, [40, EOS], max_tokens=2))
    expect(
        result == FinishReason.STOP,
        _(
            "the 2nd of max_tokens=2 tokens is EOS: check_stop returned "
            "{result!r}; expected FinishReason.STOP (test EOS first)"
        ).format(result=result),
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
        _(
            "a 3-token prompt with max_model_len=8 must stop at 8 tokens with "
            "reason 'length'; it stopped at {n} with reason {reason!r}"
        ).format(
            n=len(out.prompt_token_ids) + len(out.token_ids),
            reason=out.finish_reason,
        ),
    )
