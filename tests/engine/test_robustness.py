"""One bad request never breaks the engine: validation up front, fault isolation inside step(),
cleanup when generate() is interrupted, and stop strings of any length."""

from __future__ import annotations

import pytest
from conftest import make_tiny_engine

from nanoengine import LLM, LLMEngine, SamplingParams
from nanoengine.sequence import SequenceStatus

NAN, INF = float("nan"), float("inf")


def greedy(max_tokens: int = 6, **kwargs) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, **kwargs)


def assert_empty(engine: LLMEngine) -> None:
    """Nothing left behind: no request, no scheduled sequence, every block free."""
    assert not engine.sequences and not engine.has_unfinished()
    assert engine.block_manager.num_free_blocks == engine.config.num_kv_blocks
    assert not any(engine.block_manager.ref_counts)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(max_tokens=0), "max_tokens must be an integer >= 1"),
        (dict(temperature=-0.5), "temperature must be >= 0"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
        (dict(top_k=-2), "top_k must be an integer >= -1"),
        (dict(temperature=NAN), "temperature"),
        (dict(temperature=INF), "temperature"),
        (dict(temperature=1e-30), "temperature"),
        (dict(temperature="1"), "temperature"),
        (dict(top_p=NAN), "top_p"),
        (dict(top_k=2.5), "top_k"),
        (dict(top_k=True), "top_k"),
        (dict(seed=2**62), "seed"),
        (dict(seed=-1), "seed"),
        (dict(seed=1.0), "seed"),
        (dict(stop=5), "stop"),
        (dict(stop=[None]), "stop"),
        (dict(stop=[""]), "stop"),
        (dict(stop=[b"x"]), "stop"),
        (dict(max_tokens=True), "max_tokens"),
        (dict(max_tokens=3.0), "max_tokens"),
        (dict(ignore_eos="yes"), "ignore_eos"),
        (dict(stop=["\udfff"]), "a stop string holds '\\\\udfff' at index 0, a lone surrogate"),
    ],
)
def test_bad_sampling_params_are_one_line_value_errors(kwargs, message):
    with pytest.raises(ValueError, match=message) as info:
        SamplingParams(**kwargs)
    assert "\n" not in str(info.value)


def test_stop_accepts_none_a_string_or_a_tuple():
    assert SamplingParams(stop=None).stop == []
    assert SamplingParams(stop="END").stop == ["END"]
    assert SamplingParams(stop=("a", "b")).stop == ["a", "b"]


@pytest.mark.parametrize(
    "prompt, message",
    [
        ([5, 10**6], r"prompt token 1 is 1000000: token ids are integers in \[0, 259\)"),
        ([-1], "prompt token 0 is -1"),
        ([3, 4.0], "prompt token 1 is 4.0"),
        ([True], "prompt token 0 is True"),
        ([None], "prompt token 0 is None"),
        (None, "a prompt is a string or a list of token ids"),
        (b"abc", "a prompt is a string or a list of token ids"),
        (7, "a prompt is a string or a list of token ids"),
        ("a\ud800", "the prompt holds '\\\\ud800' at index 1, a lone surrogate that is not text"),
    ],
)
def test_bad_prompts_are_refused_before_they_reach_the_scheduler(prompt, message):
    llm = LLM("tiny", block_size=4, num_kv_blocks=16)
    with pytest.raises(ValueError, match=message):
        llm.generate([prompt], greedy())
    assert_empty(llm.engine)
    assert llm.generate([[5, 10]], greedy())[0].finish_reason == "length"  # still usable


@pytest.mark.parametrize(
    "prompt, options, message",
    [
        ("", {}, "empty prompt"),
        ("   ", {}, "empty prompt"),
        ([], {}, "empty prompt"),
        ("x" * 80, dict(max_model_len=64), "max_model_len is 64"),
        ("x" * 30, dict(num_kv_blocks=8), "needs 10 KV blocks but the pool has 8"),
    ],
)
def test_a_prompt_that_cannot_run_is_refused_by_add_request(prompt, options, message):
    engine = make_tiny_engine(**options)
    with pytest.raises(ValueError, match=message):
        engine.add_request(prompt, SamplingParams(max_tokens=10))
    assert_empty(engine)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(block_size=0), "block_size must be >= 1"),
        (dict(num_kv_blocks=0), "num_kv_blocks must be >= 1"),
        (dict(num_threads=-1), "num_threads must be >= 1, got -1"),
        (dict(bogus=1), "unknown engine option"),
        (dict(attention_backend="magic"), "attention_backend must be"),
        (dict(kv_cache_memory_gb=float("nan")), "kv_cache_memory_gb must be a number of GiB > 0, got nan"),
        (dict(kv_cache_memory_gb=0), "kv_cache_memory_gb must be a number of GiB > 0"),
    ],
)
def test_bad_engine_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LLM("tiny", **kwargs)


@pytest.mark.parametrize("model", ["/no/such/folder", "./missing-model", "not a model"])
def test_an_unknown_model_path_is_refused(model):
    with pytest.raises(ValueError, match="check the path"):
        LLM(model)


def test_a_params_list_must_match_the_prompts():
    with pytest.raises(ValueError, match="2 prompts but 1 SamplingParams"):
        LLM("tiny").generate(["a", "b"], [SamplingParams()])


def test_params_changed_after_creation_are_checked_again_by_add_request():
    engine = make_tiny_engine()
    params = greedy()
    params.temperature = NAN
    with pytest.raises(ValueError, match="temperature"):
        engine.add_request("hi", params)
    with pytest.raises(ValueError, match="params must be a SamplingParams"):
        engine.add_request("hi", {"max_tokens": 3})  # type: ignore[arg-type]
    assert_empty(engine)


def run_alone(prompt: str | list[int], params: SamplingParams) -> list[int]:
    return LLM("tiny", block_size=4, num_kv_blocks=32).generate([prompt], params)[0].token_ids


@pytest.mark.parametrize("batch_budget", [64, 5])  # one batch; chunked prefill (fails mid-prefill)
def test_a_request_that_fails_inside_step_is_finished_with_error_and_the_others_go_on(batch_budget):
    engine = LLMEngine("tiny", block_size=4, num_kv_blocks=32, max_num_batched_tokens=batch_budget)
    good = engine.add_request("hello there", greedy())
    bad = engine.add_request("world of things", greedy())
    engine.sequences[bad].token_ids[-1] = 10**6  # gets past add_request's check: fails in the embedding
    while engine.has_unfinished():
        engine.step()
    failed = engine.collect(bad)
    assert failed.finish_reason == "error" and failed.token_ids == []
    assert failed.error.startswith("IndexError")
    assert engine.collect(good).token_ids == run_alone("hello there", greedy())
    assert_empty(engine)
    assert engine.block_manager.num_free_blocks == 32
    follow_up = engine.add_request("again", greedy())  # the engine is still usable
    while engine.has_unfinished():
        engine.step()
    assert engine.collect(follow_up).token_ids == run_alone("again", greedy())


def test_a_failed_request_leaves_no_hash_on_blocks_it_never_wrote_and_fails_who_hit_them():
    """B hits blocks A computes in the same step (vLLM v1's rule); A's forward fails, so those blocks
    hold no K/V: B cannot read them, and no later request may find them in the prefix cache."""
    engine = LLMEngine("tiny", block_size=4, num_kv_blocks=32)
    prompt = list(range(3, 3 + 12))
    a = engine.add_request(prompt + [20], greedy())
    b = engine.add_request(prompt + [21], greedy())
    engine.sequences[a].token_ids[1] = 10**6  # fails in A's embedding; B does not compute that token
    engine.sequences[b].token_ids[1] = 10**6  # B's first 3 blocks are A's: a hit on unwritten blocks
    engine.step()
    failed_a, failed_b = engine.collect(a), engine.collect(b)
    assert failed_a.finish_reason == failed_b.finish_reason == "error"
    assert failed_a.error.startswith("IndexError") and "failed in this step" in failed_b.error
    assert not engine.block_manager.hash_to_block and not any(engine.block_manager.hashes)
    assert_empty(engine)


def test_an_interrupt_mid_forward_forgets_the_step_s_hashes_and_requeues_who_hit_them():
    engine = LLMEngine("tiny", block_size=4, num_kv_blocks=32)
    prompt = list(range(3, 3 + 12))
    a = engine.add_request(prompt + [20], greedy())
    b = engine.add_request(prompt + [21], greedy())
    real_run = engine.runner.run
    engine.runner.run = lambda seqs, inputs: (_ for _ in ()).throw(KeyboardInterrupt)  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        engine.step()
    engine.runner.run = real_run  # type: ignore[method-assign]
    assert not engine.block_manager.hash_to_block  # nothing was computed, so nothing can be hit
    seq_b = engine.sequences[b]
    assert seq_b.status == SequenceStatus.WAITING and seq_b.num_cached_tokens == 0 and not seq_b.block_table
    while engine.has_unfinished():
        engine.step()
    assert engine.collect(a).token_ids == run_alone(prompt + [20], greedy())
    assert engine.collect(b).token_ids == run_alone(prompt + [21], greedy())
    assert_empty(engine)


def test_a_sampling_failure_finishes_only_that_request():
    engine = make_tiny_engine(num_kv_blocks=32)
    sampled = SamplingParams(max_tokens=4, temperature=1.0, seed=1)
    good = engine.add_request("abc", greedy(4))
    bad = engine.add_request("abd", sampled)
    engine.step()
    sampled.temperature = NAN  # changed mid-run: the next draw fails in torch.multinomial
    while engine.has_unfinished():
        engine.step()
    out = engine.collect(bad)
    assert out.finish_reason == "error" and len(out.token_ids) == 1 and "RuntimeError" in out.error
    assert engine.collect(good).token_ids == run_alone("abc", greedy(4))
    assert_empty(engine)


def test_the_error_finish_is_recorded_in_the_trace_without_violations(tmp_path):
    from tracer.trace.invariants import check_trace
    from tracer.trace.recorder import TraceRecorder
    from tracer.trace.trace_file import load_trace

    engine = LLMEngine("tiny", block_size=4, num_kv_blocks=32, max_num_batched_tokens=64)
    path = tmp_path / "error.jsonl"
    with TraceRecorder(engine, path) as recorder:
        engine.add_request("hello there friend", greedy(4))
        bad = engine.add_request("world", greedy(4))
        engine.sequences[bad].token_ids.append(10**6)  # a prompt token out of the vocabulary
        engine.sequences[bad].num_prompt_tokens += 1
        while engine.has_unfinished():
            engine.step()
    assert recorder.violations == []
    trace = load_trace(path, "all")  # the schema accepts finish_reason "error"
    assert check_trace(trace) == []
    finished = [
        {k: e[k] for k in ("kind", "seq_id", "detail")} for e in trace.steps[0]["events"] if e["kind"] == "finished"
    ]
    assert finished == [
        {"kind": "finished", "seq_id": bad, "detail": {"reason": "error", "error": finished[0]["detail"]["error"]}}
    ]
    row = next(s for s in trace.steps[-1]["seqs"] if s["seq_id"] == bad)
    assert row["status_after"] == "FINISHED" and row["finish_reason"] == "error" and row["block_table_after"] == []


def test_keyboard_interrupt_inside_generate_leaves_the_engine_empty():
    llm = LLM("tiny", block_size=4, num_kv_blocks=64)
    calls = []

    def interrupt(record):
        calls.append(record.step)
        if len(calls) == 2:
            raise KeyboardInterrupt

    llm.engine.add_step_hook(interrupt)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(["one", "two", "three"], greedy(50))
    assert_empty(llm.engine)
    assert all(s.num_scheduled_tokens == 0 for s in llm.engine.scheduler.running)
    llm.engine.step_hooks.clear()
    steps_before = llm.engine.num_steps
    outs = llm.generate(["four"], greedy(3))
    assert llm.engine.num_steps - steps_before == 3  # no leftover request was finished first
    assert outs[0].token_ids == run_alone("four", greedy(3))


def test_an_interrupt_mid_forward_leaves_nothing_scheduled():
    llm = LLM("tiny", block_size=4, num_kv_blocks=64)
    real_run = llm.engine.runner.run
    llm.engine.runner.run = lambda seqs, inputs: (_ for _ in ()).throw(KeyboardInterrupt)  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        llm.generate(["one", "two"], greedy(5))
    llm.engine.runner.run = real_run  # type: ignore[method-assign]
    assert_empty(llm.engine)
    assert llm.generate(["two"], greedy(5))[0].token_ids == run_alone("two", greedy(5))


def test_an_invalid_later_prompt_drops_the_requests_generate_already_added():
    llm = LLM("tiny", block_size=4, num_kv_blocks=64)
    with pytest.raises(ValueError, match="prompt token 0"):
        llm.generate(["fine", [10**9]], greedy())
    assert_empty(llm.engine)


def test_collect_refuses_a_live_request_and_a_second_collect():
    engine = make_tiny_engine()
    seq_id = engine.add_request("hi", greedy(3))
    with pytest.raises(ValueError, match=f"request {seq_id} is still WAITING"):
        engine.collect(seq_id)
    engine.step()
    with pytest.raises(ValueError, match=f"request {seq_id} is still RUNNING"):
        engine.collect(seq_id)
    assert engine.sequences[seq_id].status == SequenceStatus.RUNNING  # not orphaned: still there
    while engine.has_unfinished():
        engine.step()
    assert engine.collect(seq_id).finish_reason == "length"
    with pytest.raises(ValueError, match="already collected"):
        engine.collect(seq_id)
    with pytest.raises(ValueError, match="never added"):
        engine.collect(12345)


def test_a_hook_that_raises_does_not_make_the_next_step_reuse_its_number():
    engine = make_tiny_engine()
    seen: list[int] = []

    def hook(record):
        seen.append(record.step)
        if len(seen) == 1:
            raise RuntimeError("hook bug")

    engine.add_step_hook(hook)
    engine.add_request("hello", greedy(4))
    with pytest.raises(RuntimeError, match="hook bug"):
        engine.step()
    engine.step()
    assert seen == [0, 1]


def test_an_absurd_kv_memory_is_capped_by_what_the_requests_can_need():
    """1e300 GiB is inf bytes: the pool is sized by max_num_seqs full-length requests, not a NaN."""
    engine = LLMEngine("tiny", kv_cache_memory_gb=1e300, max_num_seqs=2, max_model_len=64, block_size=16)
    assert engine.config.num_kv_blocks == 2 * 4


def test_a_kv_pool_bigger_than_memory_is_refused_before_allocating():
    with pytest.raises(ValueError, match=r"num_kv_blocks=1000000000000 needs .* GiB of KV cache but only"):
        LLMEngine("tiny", num_kv_blocks=10**12)


# ---- stop strings ------------------------------------------------------------------------
def completion_text(prompt: str, max_tokens: int) -> str:
    return LLM("tiny").generate([prompt], greedy(max_tokens))[0].text


def test_a_stop_string_longer_than_16_tokens_stops_generation():
    text = completion_text("stop strings", 80)
    # Random weights: the text is mostly partial UTF-8; a stop string may hold replacement characters
    # but not start or end with one (that one could still become a different character).
    start = next(i for i in range(5, len(text) - 30) if "\ufffd" not in (text[i], text[i + 29]))
    stop = text[start : start + 30]  # the byte tokenizer: at least 30 tokens
    out = LLM("tiny").generate(["stop strings"], greedy(80, stop=[stop]))[0]
    assert out.finish_reason == "stop"
    assert out.text == text[: text.index(stop)]
    assert len(out.token_ids) < 80


def test_the_stop_check_decodes_a_bounded_tail():
    llm = LLM("tiny")
    tokenizer = llm.engine.tokenizer
    lengths: list[int] = []
    real_decode = tokenizer.decode

    def counting_decode(token_ids, skip_special_tokens=True):
        lengths.append(len(token_ids))
        return real_decode(token_ids, skip_special_tokens)

    tokenizer.decode = counting_decode
    llm.engine.add_request("bounded", greedy(200, stop=["never-appears-xyz"]))
    while llm.engine.has_unfinished():
        llm.engine.step()
    assert len(lengths) >= 200  # at least one check a step
    assert max(lengths) <= 4 * (len("never-appears-xyz") + 4)  # never the whole 200-token completion


@pytest.mark.real_model
def test_a_long_stop_string_with_the_real_tokenizer():
    llm = LLM("default", block_size=16)
    prompt = "Explain what a paged KV cache is, in two sentences."
    text = llm.generate([prompt], greedy(80))[0].text
    stop = text[10:-10]
    assert len(llm.engine.tokenizer.encode(stop, add_special_tokens=False)) >= 40
    out = llm.generate([prompt], greedy(80, stop=[stop]))[0]
    assert out.finish_reason == "stop" and out.text == text[:10]


# ---- hooks and long queues -------------------------------------------------------------------
def test_a_hooked_step_records_the_batch_not_the_whole_waiting_queue():
    engine = LLMEngine("tiny", block_size=4, num_kv_blocks=64, max_num_seqs=2)
    records = []
    engine.add_step_hook(records.append)
    for i in range(300):
        engine.add_request(f"request {i}", greedy(3))
    for _ in range(6):
        engine.step()
    assert len(records[0].seqs) == 300  # the first step shows the hook every request once
    later = [len(r.seqs) for r in records[1:]]
    assert max(later) <= 4, later  # running + admitted/finished this step: not the 298 waiting ones
    queues = records[1].queues  # the queues: only the head a step can admit from, and the length
    assert len(queues.waiting) == 2 and queues.num_waiting == 298
    first = records[0].seqs[0].seq_id
    assert queues.running == (first, first + 1) and queues.waiting == (first + 2, first + 3)
    for _ in range(2):  # a request added later is shown once, in the next step
        engine.add_request("late", greedy(3))
    engine.step()
    assert 2 <= len(records[-1].seqs) <= 6


def test_a_hook_added_mid_run_is_shown_every_waiting_request_once():
    engine = LLMEngine("tiny", block_size=4, num_kv_blocks=64, max_num_seqs=1)
    ids = [engine.add_request(f"r{i}", greedy(3)) for i in range(5)]
    engine.step()
    records = []
    engine.add_step_hook(records.append)
    engine.step()
    assert {s.seq_id for s in records[0].seqs} == set(ids)


def test_the_recorder_still_lists_untouched_waiting_requests_in_every_step(tmp_path):
    from tracer.trace.invariants import check_trace
    from tracer.trace.recorder import TraceRecorder
    from tracer.trace.trace_file import load_trace

    engine = LLMEngine("tiny", block_size=4, num_kv_blocks=64, max_num_seqs=2)
    path = tmp_path / "queue.jsonl"
    with TraceRecorder(engine, path):
        ids = [engine.add_request(f"request {i}", greedy(3)) for i in range(12)]
        while engine.has_unfinished():
            engine.step()
    trace = load_trace(path, "all")
    assert all({s["seq_id"] for s in step["seqs"]} == set(ids) for step in trace.steps)
    assert check_trace(trace) == []
