"""The logits processors (nanoengine/logits_processors.py) against references computed by hand from
the logits with vLLM's definitions, and their effect on a real run (the tiny model)."""

from __future__ import annotations

import math

import pytest
import torch

from nanoengine import LLM, LLMEngine, SamplingParams
from nanoengine.logits_processors import process_logits
from nanoengine.sequence import Sequence
from tracer.trace.invariants import check_trace
from tracer.trace.trace_file import load_trace

VOCAB = 12
EOS = 11
PROMPT = [1, 2, 2, 3]
OUTPUT = [4, 4, 4, 2, 5]


def processed(row: list[float], output: list[int] = OUTPUT, **params) -> list[float]:
    seq = Sequence(list(PROMPT), SamplingParams(max_tokens=20, **params))
    seq.token_ids += output
    logits = torch.tensor([row], dtype=torch.float32)
    return process_logits(logits, [seq], frozenset({EOS}))[0].tolist()


def row_of(values) -> list[float]:
    return [float(v) for v in values]


ROW = row_of([0.5, -1.0, 2.0, -0.5, 1.5, 3.0, -2.0, 0.0, 1.0, -3.0, 0.25, 4.0])


def test_neutral_params_leave_the_logits_as_they_are():
    assert processed(ROW) == ROW


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_prompt_and_output():
    seen = set(PROMPT) | set(OUTPUT)  # 1, 2, 3, 4, 5
    want = [(v / 1.5 if v > 0 else v * 1.5) if i in seen else v for i, v in enumerate(ROW)]
    assert processed(ROW, repetition_penalty=1.5) == pytest.approx(want)


def test_frequency_and_presence_penalties_count_the_output_only():
    counts = {t: OUTPUT.count(t) for t in OUTPUT}  # 4: 3, 2: 1, 5: 1 (the prompt's 1, 2, 3 do not count)
    want = [v - 0.5 * counts.get(i, 0) - 0.25 * (i in counts) for i, v in enumerate(ROW)]
    assert processed(ROW, frequency_penalty=0.5, presence_penalty=0.25) == pytest.approx(want)
    assert processed(ROW, frequency_penalty=0.5)[1] == ROW[1]  # in the prompt only


def test_logit_bias_adds_to_the_named_tokens():
    want = list(ROW)
    want[0] += 5.0
    want[11] -= 100.0
    assert processed(ROW, logit_bias={0: 5.0, 11: -100.0}) == pytest.approx(want)


def test_min_tokens_masks_eos_and_the_stop_token_ids_until_enough_were_made():
    early = processed(ROW, min_tokens=6, stop_token_ids=[7])  # 5 made so far
    assert early[EOS] == -math.inf and early[7] == -math.inf
    assert [v for i, v in enumerate(early) if i not in (EOS, 7)] == [v for i, v in enumerate(ROW) if i not in (EOS, 7)]
    assert processed(ROW, min_tokens=5, stop_token_ids=[7]) == ROW  # 5 made: may stop now
    assert processed(ROW, min_tokens=6, ignore_eos=True)[EOS] == ROW[EOS]  # no EOS to mask


def test_min_p_drops_tokens_less_likely_than_min_p_times_the_likeliest_at_the_temperature():
    temperature, min_p = 0.7, 0.2
    probs = torch.tensor(ROW).div(temperature).softmax(-1)
    keep = probs >= min_p * probs.max()
    want = [v if k else -math.inf for v, k in zip(ROW, keep.tolist())]
    assert processed(ROW, min_p=min_p, temperature=temperature) == want
    assert processed(ROW, min_p=min_p) == ROW  # greedy: the likeliest survives any min_p


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(presence_penalty=3), r"presence_penalty must be in \[-2.0, 2.0\]"),
        (dict(frequency_penalty=float("nan")), "frequency_penalty must be in"),
        (dict(repetition_penalty=0), "repetition_penalty must be > 0"),
        (dict(min_p=1.5), "min_p must be in"),
        (dict(min_tokens=-1), "min_tokens must be in"),
        (dict(min_tokens=100, max_tokens=10), "min_tokens must be in"),
        (dict(logit_bias={"5": 1.0}), "logit_bias maps token ids"),
        (dict(logit_bias={5: 101}), "logit_bias maps token ids"),
        (dict(stop_token_ids=[-1]), "stop_token_ids must be a list of token ids"),
    ],
)
def test_bad_values_are_one_line_value_errors(kwargs, message):
    with pytest.raises(ValueError, match=message) as info:
        SamplingParams(**kwargs)
    assert "\n" not in str(info.value)


def test_token_ids_beyond_the_vocabulary_are_refused_by_add_request():
    llm = LLM("tiny", block_size=4, num_kv_blocks=64)
    for params in (SamplingParams(stop_token_ids=[10**6]), SamplingParams(logit_bias={10**6: 1.0})):
        with pytest.raises(ValueError, match=r"token ids are integers in \[0, 259\)"):
            llm.engine.add_request("hello", params)


def test_a_stop_token_id_finishes_a_run_and_min_tokens_holds_it_off(one_torch_thread):
    llm = LLM("tiny", block_size=4, num_kv_blocks=64)
    base = llm.generate(["hello world"], SamplingParams(max_tokens=12, ignore_eos=True))[0].token_ids
    stop = base[3]
    out = llm.generate(["hello world"], SamplingParams(max_tokens=12, ignore_eos=True, stop_token_ids=[stop]))[0]
    assert out.finish_reason == "stop" and out.token_ids == base[: base.index(stop) + 1]
    held = llm.generate(["hello world"], SamplingParams(max_tokens=12, min_tokens=8, stop_token_ids=[stop]))[0]
    assert stop not in held.token_ids[:7] and len(held.token_ids) >= 8


def record_stop_token_run(path, stop: int):
    from tracer.trace.recorder import TraceRecorder

    engine = LLMEngine("tiny", block_size=4, num_kv_blocks=64)
    with TraceRecorder(engine, path):
        engine.add_request("hello world", SamplingParams(max_tokens=12, ignore_eos=True, stop_token_ids=[stop]))
        engine.add_request("hello there", SamplingParams(max_tokens=6, ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
    return load_trace(path, validate="all")


def test_a_trace_with_stop_token_ids_checks_and_a_check_stop_that_ignores_them_is_caught(tmp_path, one_torch_thread):
    from tracer.teach.plant import Edit, Patch, planted
    from tracer.teach.swap import plugged

    llm = LLM("tiny", block_size=4, num_kv_blocks=64)
    stop = llm.generate(["hello world"], SamplingParams(max_tokens=12, ignore_eos=True))[0].token_ids[3]
    trace = record_stop_token_run(tmp_path / "ok.jsonl", stop)
    assert check_trace(trace) == []
    first, second = (trace.requests[i]["params"] for i in sorted(trace.requests))
    assert first["stop_token_ids"] == [stop] and "min_p" not in second  # neutral ones are left out
    bug = Patch(
        "Scheduler.check_stop",
        (Edit("(is_eos or token_id in p.stop_token_ids)", "is_eos"),),  # BUG: stop_token_ids never stop
    )
    with plugged({bug.target: planted(bug)}):
        broken = record_stop_token_run(tmp_path / "bug.jsonl", stop)
    assert {v.invariant for v in check_trace(broken)} == {"eos_finish"}
