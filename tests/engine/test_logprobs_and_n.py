"""Issue 33, first part: logprobs, prompt logprobs and n samples, in vLLM's output shape.

Logprobs are checked against HF transformers' log_softmax of the same tiny checkpoint; n samples
against single requests seeded seed + i (vLLM v1's rule)."""

import math

import pytest
import torch

from nanoengine import LLM, SamplingParams
from nanoengine.engine import LLMEngine
from tests.engine.test_golden import save_tiny_checkpoint


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_llama")
    hf = save_tiny_checkpoint("llama", folder)
    return hf, LLM(str(folder), block_size=4, max_num_batched_tokens=8, num_threads=1)


PROMPT = [5, 17, 42, 7, 99, 3, 250, 11, 64, 8, 120]


def hf_logprobs(hf, ids: list[int]) -> torch.Tensor:
    """[len(ids), vocab]: row p scores the token at p + 1."""
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0].float()
    return logits.log_softmax(-1)


def test_sampled_tokens_logprobs_match_hf(tiny):
    hf, llm = tiny
    (out,) = llm.generate([PROMPT], SamplingParams(max_tokens=6, ignore_eos=True, logprobs=3))
    c = out.outputs[0]
    ref = hf_logprobs(hf, PROMPT + c.token_ids)
    assert c.logprobs is not None and len(c.logprobs) == 6
    total = 0.0
    for i, (token, entry) in enumerate(zip(c.token_ids, c.logprobs)):
        row = ref[len(PROMPT) - 1 + i]
        assert next(iter(entry)) == token, "the chosen token comes first"
        assert entry[token].logprob == pytest.approx(float(row[token]), abs=1e-4)
        assert entry[token].rank == 1  # greedy: the likeliest
        top3 = row.topk(3).indices.tolist()
        assert set(entry) == {token, *top3}
        assert [entry[t].rank for t in top3] == [1, 2, 3]
        assert entry[token].decoded_token is not None
        total += entry[token].logprob
    assert c.cumulative_logprob == pytest.approx(total)


def test_sampled_logprobs_are_the_raw_models_not_the_temperatures(tiny):
    """vLLM's default: the model's logprobs, whatever temperature the token was drawn at."""
    hf, llm = tiny
    params = SamplingParams(max_tokens=4, temperature=1.5, seed=3, ignore_eos=True, logprobs=0)
    (out,) = llm.generate([PROMPT], params)
    c = out.outputs[0]
    ref = hf_logprobs(hf, PROMPT + c.token_ids)
    for i, (token, entry) in enumerate(zip(c.token_ids, c.logprobs or [])):
        row = ref[len(PROMPT) - 1 + i]
        assert list(entry) == [token] or len(entry) == 1 or entry[token].rank > 0
        assert entry[token].logprob == pytest.approx(float(row[token]), abs=1e-4)
        assert entry[token].rank == int((row > row[token]).sum()) + 1


def test_prompt_logprobs_match_hf_across_prefill_chunks(tiny):
    """max_num_batched_tokens 8: the 11-token prompt is computed in two chunks."""
    hf, llm = tiny
    (out,) = llm.generate([PROMPT], SamplingParams(max_tokens=1, prompt_logprobs=2))
    ref = hf_logprobs(hf, PROMPT)
    assert out.prompt_logprobs is not None and len(out.prompt_logprobs) == len(PROMPT)
    assert out.prompt_logprobs[0] is None
    for i in range(1, len(PROMPT)):
        entry = out.prompt_logprobs[i]
        assert entry is not None and next(iter(entry)) == PROMPT[i]
        assert entry[PROMPT[i]].logprob == pytest.approx(float(ref[i - 1][PROMPT[i]]), abs=1e-4)
        assert len(entry) in (2, 3)


def test_prompt_logprobs_skip_the_prefix_cache(tiny):
    """A prompt whose blocks are cached is still scored whole (vLLM v1 does the same)."""
    _, llm = tiny
    llm.generate([PROMPT], SamplingParams(max_tokens=1))  # caches the prompt's full blocks
    steps = []
    llm.engine.add_step_hook(steps.append)
    try:
        (out,) = llm.generate([PROMPT], SamplingParams(max_tokens=1, prompt_logprobs=0))
    finally:
        llm.engine.remove_step_hook(steps.append)
    assert not any(e.kind == "prefix_hit" for s in steps for e in s.events)
    assert out.prompt_logprobs is not None and all(e is not None for e in out.prompt_logprobs[1:])


def test_no_logprobs_unless_asked(tiny):
    _, llm = tiny
    (out,) = llm.generate([PROMPT], SamplingParams(max_tokens=3))
    assert out.prompt_logprobs is None
    assert out.outputs[0].logprobs is None and out.outputs[0].cumulative_logprob is None


def test_n_samples_are_single_requests_seeded_seed_plus_i(tiny):
    _, llm = tiny
    params = SamplingParams(n=3, max_tokens=8, temperature=1.0, seed=11, ignore_eos=True)
    (out,) = llm.generate([PROMPT], params)
    assert [c.index for c in out.outputs] == [0, 1, 2]
    for i, c in enumerate(out.outputs):
        single = SamplingParams(max_tokens=8, temperature=1.0, seed=11 + i, ignore_eos=True)
        (alone,) = llm.generate([PROMPT], single)
        assert c.token_ids == alone.token_ids, f"sample {i}"
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1
    assert out.token_ids == out.outputs[0].token_ids  # one sequence's fields: outputs[0]'s


def test_n_samples_share_the_prompt_blocks_in_their_first_step(tiny):
    """The children are admitted in one step; the later ones hit the first one's full blocks
    (5 + 1 + 1 tokens fit the budget of 8)."""
    _, llm = tiny
    engine: LLMEngine = llm.engine
    steps = []
    engine.add_step_hook(steps.append)
    try:
        prompt = [201, 202, 203, 204, 1]  # one full block and one token, not cached before
        request_id = engine.add_request(prompt, SamplingParams(n=3, max_tokens=2, ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
        out = engine.collect(request_id)
    finally:
        engine.remove_step_hook(steps.append)
    assert len(out.outputs) == 3
    seqs = {s.seq_id: s for s in steps[0].seqs if s.request_id == request_id}
    assert len(seqs) == 3
    hits = [e for e in steps[0].events if e.kind == "prefix_hit"]
    assert len(hits) == 2 and all(e.detail["tokens_saved"] == 4 for e in hits)


def test_aborting_a_request_aborts_all_its_samples(tiny):
    _, llm = tiny
    engine = llm.engine
    request_id = engine.add_request(PROMPT, SamplingParams(n=2, max_tokens=50, ignore_eos=True))
    engine.step()
    engine.abort(request_id)
    while engine.has_unfinished():
        engine.step()
    out = engine.collect(request_id)
    assert [c.finish_reason for c in out.outputs] == ["abort", "abort"]
    with pytest.raises(ValueError, match="already collected"):
        engine.collect(request_id)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("n", 0, "n must be"), ("logprobs", -1, "logprobs must be"), ("prompt_logprobs", 21, "prompt_logprobs")],
)
def test_bad_values_are_one_line_errors(field, value, message):
    with pytest.raises(ValueError, match=message) as e:
        SamplingParams(**{field: value})
    assert "\n" not in str(e.value)


def test_logprobs_are_finite_and_ranked(tiny):
    _, llm = tiny
    (out,) = llm.generate([PROMPT], SamplingParams(max_tokens=3, logprobs=5, ignore_eos=True))
    for entry in out.outputs[0].logprobs or []:
        assert all(math.isfinite(lp.logprob) and lp.logprob <= 0 for lp in entry.values())
        ranked = sorted(entry.values(), key=lambda lp: lp.rank)
        assert [lp.logprob for lp in ranked] == sorted((lp.logprob for lp in ranked), reverse=True)
