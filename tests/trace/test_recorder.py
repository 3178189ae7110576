"""The step recorder on real runs of the tiny model (and one of the real model)."""

from __future__ import annotations

import json

import pytest
from conftest import (
    SCENARIO_ABORT,
    SCENARIO_LATE_PROMPT,
    SCENARIO_PARAMS,
    SCENARIO_PROMPTS,
    TINY_OPTIONS,
    make_tiny_engine,
)

from nanoengine.llm import LLM
from nanoengine.sampling_params import SamplingParams
from tracer.trace.invariants import check_trace
from tracer.trace.recorder import HEAD_EVERY, Detokenizer, TraceRecorder, default_trace_path, record_run
from tracer.trace.trace_file import load_trace

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def read_lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def events_of(trace, kind: str) -> list[dict]:
    return [e for s in trace.steps for e in s["events"] if e["kind"] == kind]


def test_header_describes_the_run(tiny_trace):
    h = tiny_trace.header
    assert h["type"] == "header" and h["schema_version"] == 4 and h["model"] == "tiny"
    assert h["eos_token_ids"] == [2] and h["tokenizer"]["name"] == "tiny" and h["tokenizer"]["vocab_size"] == 259
    assert len(h["tokenizer"]["sha256"]) == 64
    assert h["nanoengine_version"] == "0.1.0" and h["title"] == "tiny scenario" and h["created"].startswith("20")
    assert {k: h["config"][k] for k in TINY_OPTIONS} == TINY_OPTIONS
    assert h["config"]["enable_prefix_caching"] is True and h["config"]["max_model_len"] == 2048
    assert [r["prompt"] for r in h["requests"]] == SCENARIO_PROMPTS
    first = h["requests"][0]
    assert first["num_prompt_tokens"] == len(SCENARIO_PROMPTS[0]) == len(first["prompt_token_ids"])
    assert "".join(first["prompt_token_texts"]) == SCENARIO_PROMPTS[0]
    assert first["params"]["max_tokens"] == 6 and first["params"]["ignore_eos"] is True


def test_requests_added_mid_run_are_recorded_in_their_first_step(tiny_trace):
    late = [(s["step"], r["prompt"]) for s in tiny_trace.steps for r in s.get("new_requests", [])]
    assert late == [(2, SCENARIO_LATE_PROMPT), (2, SCENARIO_ABORT)]
    assert [r["prompt"] for r in tiny_trace.requests.values()] == [
        *SCENARIO_PROMPTS,
        SCENARIO_LATE_PROMPT,
        SCENARIO_ABORT,
    ]


def test_one_line_per_step_and_every_sequence_stays_listed(tiny_trace):
    numbers = [s["step"] for s in tiny_trace.steps]
    assert numbers == list(range(len(numbers)))
    seen: set[int] = set()
    for step in tiny_trace.steps:
        ids = [q["seq_id"] for q in step["seqs"]]
        assert ids == sorted(ids) and seen <= set(ids)
        seen = set(ids)
    last = tiny_trace.steps[-1]["seqs"]
    assert [q["status_after"] for q in last] == ["FINISHED"] * 5
    assert sorted(q["finish_reason"] for q in last) == ["abort", "length", "length", "length", "length"]
    finished_early = tiny_trace.steps[-1]["seqs"][4]  # aborted at step 4, still listed and idle
    assert finished_early["status_before"] == "FINISHED" and finished_early["new_token_ids"] == []


def test_scenario_exercises_every_engine_path(tiny_trace):
    for kind in ("admitted", "prefix_hit", "prefill_chunk", "prefill_done", "preempted", "finished"):
        assert events_of(tiny_trace, kind), kind
    assert any(e["detail"]["chunks"] > 1 for e in events_of(tiny_trace, "prefill_done"))


def test_recorded_scenario_has_no_invariant_violations(tiny_trace):
    recorded = [v for s in tiny_trace.steps for v in s["violations"]]
    assert recorded == [] and check_trace(tiny_trace) == []


def test_texts_match_the_tokenizer_and_the_final_output(tmp_path):
    engine = make_tiny_engine()
    prompts = ["héllo wörld", "abc"]
    path, outputs = record_run(
        prompts, SamplingParams(max_tokens=8, ignore_eos=True), tmp_path / "t.jsonl", engine=engine
    )
    trace = load_trace(path)
    decode = engine.tokenizer.decode
    for step in trace.steps:
        assert step["inputs"]["input_texts"] == [decode([t]) for t in step["inputs"]["input_ids"]]
        for q in step["seqs"]:
            assert q["new_token_texts"] == [decode([t]) for t in q["new_token_ids"]]
    final = {q["seq_id"]: q for q in trace.steps[-1]["seqs"]}
    for out in outputs:
        assert final[out.seq_id]["output_text"] == out.text
        assert final[out.seq_id]["num_tokens_after"] - final[out.seq_id]["num_prompt_tokens"] == 8
    assert "".join(trace.requests[outputs[0].seq_id]["prompt_token_texts"]) != prompts[0]  # bytes, not chars
    assert decode(trace.requests[outputs[0].seq_id]["prompt_token_ids"]) == prompts[0]


def test_recording_does_not_change_the_outputs(tmp_path):
    prompts, params = SCENARIO_PROMPTS, SamplingParams(max_tokens=5, temperature=0.8, seed=3)
    plain = LLM("tiny", **TINY_OPTIONS).generate(prompts, params)
    _, recorded = record_run(prompts, params, tmp_path / "t.jsonl", model="tiny", **TINY_OPTIONS)
    assert [o.token_ids for o in recorded] == [o.token_ids for o in plain]


def test_pool_owners_and_filled_follow_the_block_tables(tiny_trace):
    bs = tiny_trace.config["block_size"]
    for step in tiny_trace.steps:
        pool = step["pool"]
        assert [len(o) for o in pool["owners"]] == pool["ref_counts"]
        for q in step["seqs"]:
            for i, block in enumerate(q["block_table_after"]):
                assert q["seq_id"] in pool["owners"][block]
                assert pool["filled"][block] >= min(bs, max(0, q["num_cached_tokens_after"] - i * bs))
        for block in pool["free_block_ids"]:
            assert pool["filled"][block] == (bs if pool["hashes"][block] is not None else 0)
        assert all(0 <= f <= bs for f in pool["filled"])


def test_each_step_is_flushed_before_the_next_starts(tmp_path):
    engine = make_tiny_engine()
    path = tmp_path / "t.jsonl"
    lines_seen = []
    with TraceRecorder(engine, path) as recorder:
        engine.add_step_hook(lambda record: lines_seen.append(len(path.read_text().splitlines())))
        engine.add_request("hello there", SamplingParams(max_tokens=3, ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
    assert lines_seen == [n + 2 for n in range(recorder.num_steps)]  # header + steps so far


def test_interrupt_mid_run_leaves_a_replayable_prefix(tmp_path):
    engine = make_tiny_engine()
    path = tmp_path / "t.jsonl"

    def interrupt(record):
        if record.step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), TraceRecorder(engine, path):
        engine.add_step_hook(interrupt)
        for prompt in SCENARIO_PROMPTS:
            engine.add_request(prompt, SCENARIO_PARAMS)
        while engine.has_unfinished():
            engine.step()
    trace = load_trace(path)
    assert trace.num_steps == 4 and trace.warning is None and check_trace(trace) == []


def test_recorder_detaches_on_close_and_ignores_a_second_registration(tmp_path):
    engine = make_tiny_engine()
    recorder = TraceRecorder(engine, tmp_path / "t.jsonl")
    engine.add_step_hook(recorder)  # registered twice by mistake
    engine.add_request("abc", SamplingParams(max_tokens=2, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    recorder.close()
    assert recorder not in engine.step_hooks
    lines = read_lines(tmp_path / "t.jsonl")
    assert [line["step"] for line in lines[1:]] == list(range(recorder.num_steps))


def test_the_header_names_a_kv_cache_dtype_other_than_auto(tmp_path):
    """The default engine's header is what it was before the option; a bfloat16 cache is written."""
    for kv_cache_dtype in ("auto", "bfloat16"):
        path = tmp_path / f"{kv_cache_dtype}.jsonl"
        with TraceRecorder(make_tiny_engine(kv_cache_dtype=kv_cache_dtype), path):
            pass
        config = read_lines(path)[0]["config"]
        assert config.get("kv_cache_dtype") == (None if kv_cache_dtype == "auto" else "bfloat16")


def test_a_recorder_closed_before_any_step_writes_a_header(tmp_path):
    with TraceRecorder(make_tiny_engine(), tmp_path / "t.jsonl"):
        pass
    trace = load_trace(tmp_path / "t.jsonl")
    assert len(trace.steps) == 0 and trace.header["requests"] == []


def test_default_trace_path_is_timestamped_and_unique(tmp_path):
    first = default_trace_path(tmp_path)
    assert first.parent == tmp_path and first.name.startswith("trace-") and first.suffix == ".jsonl"
    first.write_text("")
    assert default_trace_path(tmp_path) != first


def test_record_run_checks_its_arguments(tmp_path):
    with pytest.raises(ValueError, match="2 prompts but 1 SamplingParams"):
        record_run(["a", "b"], [SamplingParams()], tmp_path / "t.jsonl", model="tiny")


@pytest.mark.real_model
def test_real_model_trace_has_readable_token_texts(tmp_path):
    path, outputs = record_run(
        ["What is the capital of France?"],
        SamplingParams(max_tokens=8),
        tmp_path / "real.jsonl",
        model="default",
        max_num_seqs=4,
        max_model_len=256,
    )
    trace = load_trace(path, validate="all")
    assert trace.header["model"] == "SmolLM2-135M-Instruct"
    request = trace.requests[outputs[0].seq_id]
    assert "<|im_start|>" in request["prompt_token_texts"]
    assert request["prompt"] == "What is the capital of France?"
    final = trace.steps[-1]["seqs"][0]
    assert final["output_text"] == outputs[0].text and "Paris" in final["output_text"]
    generated = "".join(t for s in trace.steps for t in s["seqs"][0]["new_token_texts"])
    assert generated.replace("<|im_end|>", "") == outputs[0].text
    assert check_trace(trace) == []


def test_a_fresh_trace_loads_lazily_with_its_late_requests(tiny_trace, tiny_trace_path):
    """The recorder writes new_requests before the events, where the lazy loader's scan looks."""
    from tracer.trace.trace_file import load_trace

    lazy = load_trace(tiny_trace_path, lazy=True)
    assert lazy.requests == tiny_trace.requests and len(lazy.requests) == 5


def growing_texts_match_full_decodes(tokenizer, ids: list[int]) -> None:
    texts = Detokenizer(tokenizer)
    for n in range(1, len(ids) + 1):
        assert texts.text(7, ids[:n]) == tokenizer.decode(ids[:n], skip_special_tokens=True), n
    # a head was kept, and kept growing: a step decodes only the completion's last few ids
    assert texts.heads[7][0] >= len(ids) - 2 * HEAD_EVERY
    assert texts.decode_each(ids) == [tokenizer.decode([t], skip_special_tokens=False) for t in ids]


def test_completion_texts_equal_a_full_decode_at_every_length():
    from nanoengine.loading.tiny import ByteTokenizer

    tokenizer = ByteTokenizer()
    # multi-byte characters: a kept head never ends inside one (its text would end in U+FFFD)
    ids = tokenizer.encode("naïve café 東京 ok " * 8) + [2] + tokenizer.encode(" ✓ done")
    growing_texts_match_full_decodes(tokenizer, ids)


@pytest.mark.real_model
def test_completion_texts_with_the_real_tokenizer():
    from nanoengine.loading.checkpoint import load_model

    tokenizer = load_model("default").tokenizer
    text = "Paris is the capital of France. Le café coûte 3 €; 東京は日本の首都です 🙂. " * 3
    ids = tokenizer.encode(text, add_special_tokens=False)
    growing_texts_match_full_decodes(tokenizer, ids[:40] + [tokenizer.eos_token_id] + ids[40:])
