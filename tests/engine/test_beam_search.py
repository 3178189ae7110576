"""Issue 33: beam search inside the engine (vLLM v0's SequenceGroup): beams fork and share blocks,
copy a shared block before writing into it, are scheduled as a whole, and give Hugging Face's beams.

HF transformers' `generate(num_beams=k)` is the reference with EOS off; with EOS on, a plain
re-implementation of vLLM's LLM.beam_search rule over HF's log_softmax is."""

import json
import math

import pytest
import torch

from nanoengine import LLM, BeamSearchParams, SamplingParams
from nanoengine.engine import LLMEngine
from nanoengine.sequence import EventKind
from tests.engine.test_golden import save_tiny_checkpoint

MAX_TOKENS = 10


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_llama_beams")
    hf = save_tiny_checkpoint("llama", folder)
    return hf, folder


def prompts(n: int = 3) -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(3, 300, (length,), generator=g).tolist() for length in (3, 6, 13)[:n]]


def hf_beams(hf, prompt: list[int], k: int) -> list[list[int]]:
    ids = torch.tensor([prompt])
    hf.generation_config.eos_token_id = None  # EOS off
    out = hf.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=MAX_TOKENS,
        num_beams=k,
        num_return_sequences=k,
        do_sample=False,
        early_stopping=False,
        pad_token_id=0,
    )
    return [row.tolist() for row in out]


@pytest.mark.parametrize("k", [2, 4])
def test_beams_equal_hf_generate_num_beams_token_for_token(tiny, k):
    hf, folder = tiny
    llm = LLM(str(folder), block_size=4, max_num_batched_tokens=64, num_kv_blocks=128)
    outs = llm.beam_search(prompts(), BeamSearchParams(beam_width=k, max_tokens=MAX_TOKENS, ignore_eos=True))
    for prompt, out in zip(prompts(), outs):
        assert [s.tokens for s in out.sequences] == hf_beams(hf, prompt, k), f"prompt of {len(prompt)}"
        assert all(s.tokens[: len(prompt)] == prompt for s in out.sequences)  # vLLM's: prompt included
        cums = [s.cum_logprob for s in out.sequences]
        assert cums == sorted(cums, reverse=True)


def reference_beam_search(hf, prompt: list[int], k: int, eos: frozenset[int], length_penalty: float):
    """vLLM's LLM.beam_search rule, written plainly over HF's logprobs: each beam's 2k likeliest
    tokens are candidates; one that is EOS is a finished hypothesis; the k best others live on; at
    the end the k best of all by cum_logprob / length ** length_penalty (a final EOS not counted)."""
    beams, completed = [(prompt, 0.0)], []
    for _ in range(MAX_TOKENS):
        candidates = []
        for tokens, cum in beams:
            with torch.no_grad():
                row = hf(torch.tensor([tokens])).logits[0, -1].float().log_softmax(-1)
            values, ids = row.topk(2 * k)
            for t, v in zip(ids.tolist(), values.tolist()):
                (completed if t in eos else candidates).append((tokens + [t], cum + v))
        beams = sorted(candidates, key=lambda c: c[1], reverse=True)[:k]
    everything = completed + beams

    def score(h):
        return h[1] / (len(h[0]) - (h[0][-1] in eos)) ** length_penalty

    return sorted(everything, key=score, reverse=True)[:k]


def test_with_eos_on_the_stopping_rule_is_vllms(tiny, tmp_path):
    """EOS is made a token the model likes (the one it picks third when greedy), so hypotheses end
    with it; they are kept aside and ranked with the live beams at the end, EOS not counted."""
    hf, folder = tiny
    prompt = prompts(1)[0]
    ids = torch.tensor([prompt])
    greedy = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False, pad_token_id=0)
    eos = int(greedy[0, -1])
    config = json.loads((folder / "config.json").read_text())
    config["eos_token_id"] = eos
    for f in folder.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / "config.json").write_text(json.dumps(config))
    llm = LLM(str(tmp_path), block_size=4, num_kv_blocks=128)
    (out,) = llm.beam_search([prompt], BeamSearchParams(beam_width=3, max_tokens=MAX_TOKENS, length_penalty=0.5))
    assert eos in llm.engine.eos_token_ids  # with the tokenizer's own (the tiny ByteTokenizer's)
    expected = reference_beam_search(hf, prompt, 3, llm.engine.eos_token_ids, 0.5)
    assert [s.tokens for s in out.sequences] == [tokens for tokens, _ in expected]
    for s, (_, cum) in zip(out.sequences, expected):
        assert math.isclose(s.cum_logprob, cum, abs_tol=1e-3)
    ended = [s for s in out.sequences if s.tokens[-1] in llm.engine.eos_token_ids]
    assert ended, "the test needs a hypothesis that ends in EOS"
    assert all(s.finish_reason == "stop" for s in ended)
    assert all(s.finish_reason == "length" for s in out.sequences if s not in ended)
    assert all(len(s.text or "") < len(s.tokens) for s in ended)  # the EOS is not in the text


def record(engine: LLMEngine) -> list:
    steps: list = []
    engine.add_step_hook(steps.append)
    return steps


def test_beams_fork_share_blocks_copy_on_write_and_leave_nothing_behind(tiny):
    _, folder = tiny
    engine = LLMEngine(str(folder), block_size=4, num_kv_blocks=64)
    steps = record(engine)
    request = engine.add_request(
        prompts(1)[0] + [7], BeamSearchParams(beam_width=3, max_tokens=MAX_TOKENS, ignore_eos=True)
    )
    shared_seen = False
    while engine.has_unfinished():
        engine.step()
        shared_seen |= any(n > 1 for n in engine.block_manager.ref_counts)
    kinds = [e.kind for s in steps for e in s.events]
    assert EventKind.FORKED in kinds and EventKind.COPY_ON_WRITE in kinds and shared_seen
    for step in steps:
        cows = [e for e in step.events if e.kind == EventKind.COPY_ON_WRITE]
        assert [(e.detail["source"], e.detail["copy"]) for e in cows] == list(step.blocks_to_copy)
        forked = [
            r
            for r in step.seqs
            if r.parent_id >= 0 and r.status_before == "RUNNING" and r.num_scheduled_tokens == 0 and r.new_token_ids
        ]
        for row in forked:  # a beam forked in this step starts with its parent's blocks
            parent = next(r for r in step.seqs if r.seq_id == row.parent_id)
            assert row.block_table == parent.block_table_after
    out = engine.collect(request)
    assert len(out.outputs) == 3 and all(len(c.token_ids) == MAX_TOKENS for c in out.outputs)
    assert engine.block_manager.num_free_blocks == 64 and not any(engine.block_manager.ref_counts)
    assert not engine.sequences and not engine.requests


def test_a_beam_search_is_scheduled_as_a_whole(tiny):
    _, folder = tiny
    engine = LLMEngine(str(folder), block_size=4, num_kv_blocks=128, max_num_batched_tokens=5)
    steps = record(engine)
    engine.add_request(prompts(1)[0], BeamSearchParams(beam_width=4, max_tokens=MAX_TOKENS, ignore_eos=True))
    engine.add_request(list(range(10, 40)), SamplingParams(max_tokens=12, ignore_eos=True))  # chunked beside it
    while engine.has_unfinished():
        engine.step()
    for step in steps:
        beams = [r for r in step.seqs if r.beam_width and r.status_before == "RUNNING" and r.status_after != "FINISHED"]
        scheduled = {
            r.num_scheduled_tokens > 0
            for r in beams
            if not (r.parent_id >= 0 and not r.num_scheduled_tokens and r.new_token_ids)
        }
        assert len(scheduled) <= 1, f"step {step.step}: some beams ran, others did not"


def test_a_preempted_beam_search_restarts_from_its_prompt_and_finds_the_same_beams(tiny):
    _, folder = tiny
    params = BeamSearchParams(beam_width=3, max_tokens=20, ignore_eos=True)
    prompt = prompts(1)[0]
    alone = LLM(str(folder), block_size=4, num_kv_blocks=64).beam_search([prompt], params)[0]
    engine = LLMEngine(str(folder), block_size=4, num_kv_blocks=20)  # 18 for each request alone
    steps = record(engine)
    other = engine.add_request(list(range(50, 80)), SamplingParams(max_tokens=40, ignore_eos=True))
    request = engine.add_request(prompt, params)
    while engine.has_unfinished():
        engine.step()
    preempted = [e for s in steps for e in s.events if e.kind == EventKind.PREEMPTED]
    assert preempted, "the pool should be too small for both"
    beams = {e.seq_id for e in preempted}
    restarted = [r for s in steps for r in s.seqs if r.seq_id in beams and r.num_tokens_after == len(prompt)]
    assert restarted, "the first beam goes back to its prompt"
    out = engine.collect(request)
    assert [list(c.token_ids) for c in out.outputs] == [s.tokens[len(prompt) :] for s in alone.sequences]
    engine.collect(other)
    assert engine.block_manager.num_free_blocks == 20


@pytest.mark.parametrize(
    ("params", "options", "message"),
    [
        (dict(beam_width=11, max_tokens=4), {}, "beam_width must be an integer in [1, 10]"),
        (dict(beam_width=0, max_tokens=4), {}, "beam_width must be an integer in [1, 10]"),
        (dict(beam_width=2, max_tokens=0), {}, "max_tokens must be an integer >= 1"),
        (dict(beam_width=2, max_tokens=4, length_penalty=float("nan")), {}, "length_penalty must be a number"),
        (dict(beam_width=4, max_tokens=4), dict(max_num_seqs=2), "needs max_num_seqs and max_num_batched_tokens >= 4"),
        (dict(beam_width=4, max_tokens=4), dict(max_num_batched_tokens=3), "raise them or lower beam_width"),
        (dict(beam_width=4, max_tokens=40), dict(num_kv_blocks=20), "in each of 4 beams needs 44 KV blocks"),
    ],
)
def test_bad_beam_search_requests_are_one_line_errors(params, options, message):
    with pytest.raises(ValueError, match=None) as e:
        LLM("tiny", block_size=4, **options).beam_search([[5, 6, 7]], BeamSearchParams(**params))
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("width", [2, 3])
def test_a_beam_search_s_beams_stay_side_by_side_in_running(tiny, tmp_path, width):
    """Forked beams join running beside their parent, not at its end: so the running loop reaches a
    unit's beams together, and a victim taken from the end (the newest) is never a beam the same step
    already scheduled (with forks appended, a plain request admitted after the search took a
    scheduled beam as its victim, and the beams ran on freed blocks)."""
    from tracer.trace.invariants import check_trace
    from tracer.trace.recorder import TraceRecorder
    from tracer.trace.trace_file import load_trace

    _, folder = tiny
    engine = LLMEngine(str(folder), block_size=2, num_kv_blocks=18, max_num_batched_tokens=16)
    path = tmp_path / "beams-then-plain.jsonl"
    with TraceRecorder(engine, path):
        engine.add_request(prompts(1)[0], BeamSearchParams(beam_width=width, max_tokens=8, ignore_eos=True))
        engine.step()  # the beam search is admitted first: it is the older request
        engine.add_request(list(range(20, 31)), SamplingParams(max_tokens=20, ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
            running = engine.scheduler.running
            for seq in running:
                if seq.group:
                    where = sorted(running.index(b) for b in seq.group.live if b in running)
                    assert where == list(range(where[0], where[0] + len(where))), f"step {engine.num_steps}"
    assert check_trace(load_trace(path, "all")) == []


def test_beam_searches_hold_a_slot_per_beam_from_admission(tiny):
    _, folder = tiny
    engine = LLMEngine(str(folder), block_size=4, num_kv_blocks=128, max_num_seqs=8)
    for prompt in prompts(3):  # three searches of 4 beams: two fit 8 slots, the third waits
        engine.add_request(prompt, BeamSearchParams(beam_width=4, max_tokens=6, ignore_eos=True))
    most = 0
    while engine.has_unfinished():
        engine.step()
        most = max(most, len(engine.scheduler.running))
    assert most == 8


def test_a_beam_whose_step_fails_leaves_the_search_and_the_others_go_on(tiny):
    """Fault isolation: the failed beam finishes with its error; the search goes on with the others
    (it never schedules the failed one again), and nothing leaks."""
    _, folder = tiny
    engine = LLMEngine(str(folder), block_size=4, num_kv_blocks=64)
    request = engine.add_request(prompts(1)[0], BeamSearchParams(beam_width=3, max_tokens=MAX_TOKENS, ignore_eos=True))
    for _ in range(3):
        engine.step()
    group = engine.sequences[request].group
    failing = group.live[1]
    failing.token_ids[-1] = 10**6  # its next step fails in the embedding
    while engine.has_unfinished():
        engine.step()
    assert failing.finish_reason.value == "error" and failing not in group.live
    out = engine.collect(request)
    assert len(out.outputs) == 3 and all(c.finish_reason == "length" for c in out.outputs)
    assert all(len(c.token_ids) == MAX_TOKENS for c in out.outputs)
    assert engine.block_manager.num_free_blocks == 64 and not any(engine.block_manager.ref_counts)


def test_a_beam_search_whose_every_beam_failed_answers_with_the_error(tiny):
    _, folder = tiny
    engine = LLMEngine(str(folder), block_size=4, num_kv_blocks=64)
    request = engine.add_request(prompts(1)[0], BeamSearchParams(beam_width=2, max_tokens=MAX_TOKENS, ignore_eos=True))
    engine.sequences[request].token_ids[0] = 10**6  # the prompt's prefill fails
    while engine.has_unfinished():
        engine.step()
    out = engine.collect(request)
    assert out.finish_reason == "error" and out.error.startswith("IndexError")
