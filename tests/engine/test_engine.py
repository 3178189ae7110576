"""Engine behaviour on the tiny random model: scheduling choices never change greedy outputs."""

import random

import pytest

from nanoengine import LLM, LLMEngine, SamplingParams


def workload(seed: int = 0, n: int = 6) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(3, 259) for _ in range(37)]  # a common prefix across several prompts
    prompts = []
    for i in range(n):
        tail = [rng.randrange(3, 259) for _ in range(rng.randrange(1, 50))]
        prompts.append(shared + tail if i % 2 == 0 else tail)
    return prompts


def run(prompts, max_tokens=24, **options):
    engine = LLMEngine("tiny", **options)
    events = []
    engine.add_step_hook(lambda record: events.extend(e.kind for e in record.events))
    ids = [engine.add_request(p, SamplingParams(max_tokens=max_tokens, ignore_eos=True)) for p in prompts]
    while engine.has_unfinished():
        engine.step()
    return [engine.collect(i).token_ids for i in ids], events


@pytest.fixture(scope="module")
def reference():
    outputs, _ = run(workload(), enable_prefix_caching=False, max_num_batched_tokens=4096)
    return outputs


@pytest.mark.parametrize(
    "options, expected_event",
    [
        (dict(enable_prefix_caching=True, max_num_seqs=2), "prefix_hit"),
        (dict(max_num_batched_tokens=7), "prefill_chunk"),
        (dict(max_num_batched_tokens=1), "prefill_chunk"),
        (dict(block_size=1), None),
        (dict(block_size=3, max_num_batched_tokens=10), None),
        (dict(block_size=32), None),
        (dict(block_size=4, num_kv_blocks=30), "preempted"),
        (dict(block_size=8, num_kv_blocks=16, max_num_batched_tokens=16, enable_prefix_caching=True), "preempted"),
        (dict(max_num_seqs=1), None),
    ],
)
def test_greedy_outputs_do_not_depend_on_scheduling(reference, options, expected_event):
    outputs, events = run(workload(), **options)
    assert outputs == reference
    if expected_event:
        assert expected_event in events


def test_prefix_hit_saves_tokens_and_still_samples():
    engine = LLMEngine("tiny", block_size=4)
    prompt = list(range(3, 3 + 16))  # exactly four full blocks
    first = engine.add_request(prompt, SamplingParams(max_tokens=3, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    records = []
    engine.add_step_hook(records.append)
    second = engine.add_request(prompt, SamplingParams(max_tokens=3, ignore_eos=True))
    engine.step()
    hit = [e for e in records[0].events if e.kind == "prefix_hit"]
    # Full prefix hit: three blocks reused, the last block recomputed so there are logits to sample.
    assert hit and hit[0].detail["tokens_saved"] == 12
    assert records[0].seqs[0].num_scheduled_tokens == 4
    while engine.has_unfinished():
        engine.step()
    assert engine.collect(first).token_ids == engine.collect(second).token_ids


def test_shared_prefix_in_one_step_keeps_hashes_unique():
    engine = LLMEngine("tiny", block_size=4)
    prompt = list(range(3, 3 + 13))
    for _ in range(3):
        engine.add_request(prompt, SamplingParams(max_tokens=2, ignore_eos=True))
    records = []
    engine.add_step_hook(records.append)
    engine.step()
    hashes = [h for h in records[0].pool.hashes if h is not None]
    assert len(hashes) == 3 and len(set(hashes)) == 3  # three full blocks hashed once, not three times
    assert [s.num_scheduled_tokens for s in records[0].seqs] == [13, 1, 1]  # B and C hit A's 3 blocks


def test_a_request_admitted_later_in_a_step_hits_the_blocks_an_earlier_one_computes_in_it():
    """vLLM v1's rule: a full block is findable from the step it is scheduled in (lesson 10's twins)."""
    engine = LLMEngine("tiny", block_size=4, num_kv_blocks=24)
    prompt = list(range(3, 3 + 16))  # exactly 4 full blocks
    ids = [engine.add_request(prompt, SamplingParams(max_tokens=6, ignore_eos=True)) for _ in range(3)]
    records = []
    engine.add_step_hook(records.append)
    engine.step()
    step0 = records[0]
    a, b, c = step0.seqs
    assert [s.num_scheduled_tokens for s in (a, b, c)] == [16, 4, 4]
    hits = [e for e in step0.events if e.kind == "prefix_hit"]
    shared = list(a.block_table[:3])
    assert [(e.seq_id, e.detail["blocks"]) for e in hits] == [(ids[1], shared), (ids[2], shared)]
    # The last block of a full hit is computed again, into a block of the hitter's own, left unhashed.
    assert b.block_table[3] != a.block_table[3] and step0.pool.hashes[b.block_table[3]] is None
    while engine.has_unfinished():
        engine.step()
    outs = [engine.collect(i).token_ids for i in ids]
    alone = LLMEngine("tiny", block_size=4, num_kv_blocks=24)
    only = alone.add_request(prompt, SamplingParams(max_tokens=6, ignore_eos=True))
    while alone.has_unfinished():
        alone.step()
    assert outs == [alone.collect(only).token_ids] * 3  # the hitters read the K/V A wrote in that step


def test_preemption_victim_is_newest_and_recomputes():
    engine = LLMEngine("tiny", block_size=2, num_kv_blocks=10)
    a = engine.add_request(list(range(3, 9)), SamplingParams(max_tokens=8, ignore_eos=True))
    b = engine.add_request(list(range(20, 26)), SamplingParams(max_tokens=8, ignore_eos=True))
    preempted = []
    engine.add_step_hook(lambda r: preempted.extend(e.seq_id for e in r.events if e.kind == "preempted"))
    while engine.has_unfinished():
        engine.step()
    assert preempted and set(preempted) == {b}
    assert len(engine.collect(a).token_ids) == len(engine.collect(b).token_ids) == 8
    assert engine.block_manager.num_free_blocks == 10


def test_abort_frees_blocks_and_finishes():
    engine = LLMEngine("tiny", block_size=4, num_kv_blocks=16)
    seq_id = engine.add_request(list(range(3, 20)), SamplingParams(max_tokens=40, ignore_eos=True))
    engine.step()
    engine.abort(seq_id)
    engine.step()
    assert not engine.has_unfinished()
    assert engine.collect(seq_id).finish_reason == "abort"
    assert engine.block_manager.num_free_blocks == 16


def test_stops_at_eos_max_tokens_and_max_model_len():
    llm = LLM("tiny", max_model_len=20)
    out_len, out_model_len = llm.generate(
        [[5, 6, 7], list(range(3, 18))], SamplingParams(max_tokens=10, ignore_eos=True)
    )
    assert len(out_len.token_ids) == 10 and out_len.finish_reason == "length"
    assert len(out_model_len.token_ids) == 5 and out_model_len.finish_reason == "length"
    engine = llm.engine
    eos = engine.tokenizer.eos_token_id
    # Whatever the model says, a sequence that produced EOS stops there with reason "stop".
    outs = llm.generate([list(range(3, 3 + n)) for n in range(1, 19)], SamplingParams(max_tokens=1))
    for o in outs:
        assert o.finish_reason == ("stop" if o.token_ids == [eos] else "length")


def test_stop_string_truncates_text():
    llm = LLM("tiny")
    free = llm.generate(["abc"], SamplingParams(max_tokens=12, ignore_eos=True))[0]
    stop = free.text[3:5]
    assert stop
    out = llm.generate(["abc"], SamplingParams(max_tokens=12, ignore_eos=True, stop=[stop]))[0]
    assert out.finish_reason == "stop" and stop not in out.text and free.text.startswith(out.text)


def test_outputs_in_input_order_and_status_finished():
    llm = LLM("tiny")
    prompts = ["a" * n for n in (30, 1, 12)]
    outs = llm.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True))
    assert [o.prompt for o in outs] == prompts
    assert all(len(o.token_ids) == 4 for o in outs)
    assert not llm.engine.sequences  # collected outputs are dropped from the engine


def test_an_engine_without_hooks_builds_no_step_record(monkeypatch):
    """The no-hook fast path: no StepWatch, so no snapshots and no record, until a hook is added."""
    from nanoengine.step_record import StepWatch

    def tripwire(self, *args, **kwargs):
        raise AssertionError("a StepWatch was built")

    monkeypatch.setattr(StepWatch, "__init__", tripwire)
    engine = LLMEngine("tiny", block_size=4, num_kv_blocks=16)
    engine.add_request("hello", SamplingParams(max_tokens=3, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    engine.add_step_hook(lambda record: None)
    engine.add_request("again", SamplingParams(max_tokens=3, ignore_eos=True))
    with pytest.raises(AssertionError, match="a StepWatch was built"):
        engine.step()
