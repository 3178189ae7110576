"""The n samples of one request in the trace (request_id, the request's n) and their two invariants
(tracer/trace/invariants/samples.py): silent on the real engine, each naming its planted engine bug
(tests/trace/engine_bugs.py) from the step records alone; n = 1 traces are what they were."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import record_requests
from engine_bugs import SAMPLE_BUGS

import nanoengine.engine
from nanoengine import SamplingParams
from nanoengine.block_manager import BlockManager
from nanoengine.sequence import EventKind
from tracer.teach.plant import planted
from tracer.trace.invariants import check_trace
from tracer.trace.step_line import request_of
from tracer.trace.trace_file import load_trace

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPT = "the cat sat on the mat and looked at the dog"  # 44 tiny tokens: 11 blocks of 4
# chunked (the first sample's prefill is cut by the budget), and a request of one sample beside
OPTIONS = dict(block_size=4, max_num_batched_tokens=24, num_kv_blocks=64, num_threads=1)


def record(path: Path, requests: list[tuple[str, SamplingParams]], **options) -> tuple[list, Path]:
    recorder, _ = record_requests(path, requests, **{**OPTIONS, **options})
    return recorder.violations, path


def seeded(n: int, **kw) -> SamplingParams:
    return SamplingParams(n=n, max_tokens=4, temperature=1.0, seed=11, ignore_eos=True, **kw)


def named(violations) -> set[str]:
    return {v.invariant for v in violations}


def test_samples_carry_their_request_and_the_requests_n(tmp_path):
    violations, path = record(tmp_path / "t.jsonl", [("hi", SamplingParams(max_tokens=2)), (PROMPT, seeded(3))])
    assert violations == []
    trace = load_trace(path, validate="all")
    assert check_trace(trace) == []
    rows = trace.steps[-1]["seqs"]
    s0 = rows[0]["seq_id"]  # seq ids count on across engines
    assert [request_of(r) - s0 for r in rows] == [0, 1, 1, 1]
    assert ["request_id" in r for r in rows] == [False, False, True, True]  # only where it is not the seq_id
    params = [trace.requests[r["seq_id"]]["params"] for r in rows]
    assert [p.get("n") for p in params] == [None, 3, 3, 3]
    assert [p["seed"] for p in params[1:]] == [11, 12, 13]


def test_a_trace_of_single_samples_has_no_group_fields(tmp_path):
    _, path = record(tmp_path / "t.jsonl", [(PROMPT, SamplingParams(max_tokens=3, seed=4))])
    text = path.read_text()
    assert '"request_id"' not in text and '"n":' not in text and "new_token_logprobs" not in text


def test_logprobs_are_recorded_per_new_token_only_when_asked(tmp_path):
    _, path = record(tmp_path / "t.jsonl", [(PROMPT, seeded(2, logprobs=1)), ("hi", SamplingParams(max_tokens=2))])
    trace = load_trace(path, validate="all")
    by_seq: dict[int, list[float]] = {}
    for step in trace.steps:
        for row in step["seqs"]:
            if "new_token_logprobs" in row:
                assert len(row["new_token_logprobs"]) == len(row["new_token_ids"])
                by_seq.setdefault(row["seq_id"], []).extend(row["new_token_logprobs"])
            else:
                assert row["output_text"] is not None and trace.requests[row["seq_id"]]["prompt"] == "hi"
    assert len(by_seq) == 2 and all(len(v) == 4 for v in by_seq.values())  # the two samples that asked
    assert all(lp <= 0 for v in by_seq.values() for lp in v)


@pytest.mark.parametrize("budget", [512, 24], ids=["same-step", "chunked"])
@pytest.mark.parametrize("params", [seeded(4), SamplingParams(n=3, max_tokens=3)], ids=["seeded", "greedy"])
def test_the_real_engine_keeps_both_sample_rules_and_shares_the_prompt(tmp_path, params, budget):
    violations, path = record(tmp_path / "t.jsonl", [(PROMPT, params)], max_num_batched_tokens=budget)
    assert violations == []
    hits = [e for s in load_trace(path).steps for e in s["events"] if e["kind"] == EventKind.PREFIX_HIT]
    assert len(hits) == params.n - 1  # every sample after the first, in the step it was admitted


def test_with_prefix_caching_off_the_samples_share_nothing_and_no_rule_fires(tmp_path):
    violations, path = record(tmp_path / "t.jsonl", [(PROMPT, seeded(3))], enable_prefix_caching=False)
    assert violations == []
    assert not any(e["kind"] == EventKind.PREFIX_HIT for s in load_trace(path).steps for e in s["events"])


def test_samples_drawing_with_one_seed_are_named(tmp_path, monkeypatch):
    monkeypatch.setattr(nanoengine.engine, "child_params", planted(SAMPLE_BUGS["sample_params"]))
    violations, path = record(tmp_path / "t.jsonl", [(PROMPT, seeded(3))])
    assert named(violations) == {"sample_params"}
    s0 = min(load_trace(path).requests)
    assert [v.seq_id - s0 for v in violations] == [1, 2]
    assert "draws with seed 11, not 12" in violations[0].message


@pytest.mark.parametrize(
    ("budget", "hit"),
    [(512, 0), (24, 6)],  # all admitted in the first step; the first sample's prefill in two chunks
    ids=["same-step", "chunked"],
)
def test_blocks_findable_only_once_computed_are_named(tmp_path, monkeypatch, budget, hit):
    """The samples then each prefill what the first one scheduled: correct output, more of the prompt's KV."""
    broken = planted(SAMPLE_BUGS["sample_prefix_share"])
    monkeypatch.setattr(BlockManager, "register_full_blocks", broken)
    violations, path = record(tmp_path / "t.jsonl", [(PROMPT, seeded(3))], max_num_batched_tokens=budget)
    assert named(violations) == {"sample_prefix_share"}
    s0 = min(load_trace(path).requests)
    assert [v.seq_id - s0 for v in violations] == [1, 2]
    assert "held 10 full prompt blocks" in violations[0].message and f"hit {hit} of them" in violations[0].message


def test_a_sample_missing_from_the_trace_is_named(tmp_path):
    _, path = record(tmp_path / "t.jsonl", [(PROMPT, seeded(3))])
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    header = lines[0]
    s0 = header["requests"][0]["seq_id"]
    header["requests"] = [r for r in header["requests"] if r["seq_id"] != s0 + 2]
    for step in lines[1:]:
        step["seqs"] = [r for r in step["seqs"] if r["seq_id"] != s0 + 2]
        step["events"] = [e for e in step["events"] if e["seq_id"] != s0 + 2]
    broken = tmp_path / "broken.jsonl"
    broken.write_text("".join(json.dumps(line) + "\n" for line in lines))
    found = [v for v in check_trace(load_trace(broken, validate="none")) if v.invariant == "sample_params"]
    assert [(v.step, v.seq_id) for v in found] == [(0, s0)]
    assert "asked for n=3 samples but has 2" in found[0].message
