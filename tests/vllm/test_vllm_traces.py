"""The committed traces of vLLM v1's own scheduler (tracer/vllm/traces/): each loads, passes the
checker under vLLM's profile and replays; the known differences between vLLM and nanoengine show
in them, each with its rule and a planted bug that the rule catches."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path

import pytest

from tracer.trace.invariants import InvariantChecker, Violation, check_trace, profile_for
from tracer.trace.trace_file import Trace, load_trace

TRACES = Path(__file__).parents[2] / "tracer" / "vllm" / "traces"
NAMES = sorted(p.name.removesuffix(".jsonl") for p in TRACES.glob("*.jsonl"))


def load(name: str) -> Trace:
    return load_trace(TRACES / f"{name}.jsonl", validate="all")


def check_with(trace: Trace, profile: str, steps=None) -> list[Violation]:
    h = trace.header
    checker = InvariantChecker(h["config"], h["requests"], h["eos_token_ids"], profile)
    return [v for step in (steps if steps is not None else trace.steps) for v in checker.check(step)]


def names(violations: list[Violation]) -> set[str]:
    return {v.invariant for v in violations}


def test_the_lessons_demos_and_issue_26s_two_workloads_are_committed():
    lessons = [n for n in NAMES if n[:2].isdigit()]
    demos = [n for n in NAMES if n.startswith("demo-") and not n.endswith(".default")]  # .default: on SmolLM2's ids
    assert len(lessons) == 15 and len(demos) == 4, NAMES
    assert {"shared-prefix-six", "shared-prefix-staggered"} <= set(NAMES)
    for name in NAMES:
        assert (TRACES / f"{name}.workload.json").exists(), f"{name} has no workload to re-record it from"


@pytest.mark.parametrize("name", NAMES)
def test_every_committed_vllm_trace_checks_clean_under_vllms_profile(name):
    trace = load(name)
    assert trace.header["engine"] == "vllm 0.33.0"
    assert profile_for(trace.header) == "vllm"
    assert check_trace(trace) == []
    assert all(step["violations"] == [] for step in trace.steps)


@pytest.mark.parametrize("name", NAMES)
def test_every_committed_vllm_trace_replays(name):
    from tracer.replay.app import ReplayApp

    trace = load(name)

    async def walk() -> list[int]:
        app = ReplayApp(trace, animations=False)
        seen = []
        async with app.run_test(size=(120, 40)) as pilot:
            for i in range(len(trace.steps)):
                app.go_to(i)
                await pilot.pause()
                seen.append(app.step_index)
        return seen

    assert asyncio.run(walk()) == list(range(len(trace.steps)))


# ---- the differences, each with its rule ----------------------------------------------------
def test_same_step_prefix_hit_is_vllms_rule_and_a_write_into_a_block_nobody_hit_is_still_caught():
    """Lesson 10: three identical 16-token prompts. vLLM caches A's full blocks when they are
    scheduled, so B and C, admitted later in step 0, hit blocks 1-3 that A computes in that step."""
    trace = load("10_sampling")
    step = trace.steps[0]
    batch = {r["seq_id"]: r["num_scheduled_tokens"] for r in step["seqs"]}
    assert batch == {0: 16, 1: 4, 2: 4}
    hits = {e["seq_id"]: e["detail"]["blocks"] for e in step["events"] if e["kind"] == "prefix_hit"}
    assert hits == {1: [1, 2, 3], 2: [1, 2, 3]}
    assert "shared_block_write" not in names(check_with(trace, "nanoengine", trace.steps[:1]))  # issue 26: ours too
    assert check_with(trace, "vllm", trace.steps[:1]) == []
    planted = copy.deepcopy(step)  # C holds A's block 2 without having hit it
    planted["events"] = [e for e in planted["events"] if not (e["kind"] == "prefix_hit" and e["seq_id"] == 2)]
    found = check_with(trace, "vllm", [planted])
    assert any(v.invariant == "shared_block_write" and "seqs [2]" in v.message for v in found), found


def test_a_full_prefix_hit_recomputes_the_last_block_into_a_duplicate_hash():
    """B's prompt is all in the cache, but a hit covers at most num_tokens - 1 tokens: its 4th block
    is computed again into a new block that gets the same hash as A's."""
    trace = load("10_sampling")
    step = trace.steps[0]
    tables = {r["seq_id"]: r["block_table_after"] for r in step["seqs"]}
    hashes = step["pool"]["hashes"]
    assert hashes[tables[0][3]] == hashes[tables[1][3]] is not None and tables[0][3] != tables[1][3]
    assert "unique_prefix_hash" in names(check_with(trace, "nanoengine", trace.steps[:1]))
    assert check_with(trace, "vllm", trace.steps[:1]) == []
    planted = copy.deepcopy(step)  # a block of another prefix given A's last hash
    planted["pool"]["hashes"][tables[0][0]] = hashes[tables[0][3]]
    found = check_with(trace, "vllm", [planted])
    assert any(v.invariant == "unique_prefix_hash" and "different KV" in v.message for v in found), found


def test_finished_req_ids_are_reported_a_step_later():
    trace = load("08_preemption")
    finished_at = {e["seq_id"]: s["step"] for s in trace.steps for e in s["events"] if e["kind"] == "finished"}
    reported_at = {sid: s["step"] for s in trace.steps for sid in s["vllm"]["finished_req_ids"]}
    last = trace.steps[-1]["step"]
    assert reported_at == {sid: step + 1 for sid, step in finished_at.items() if step < last}
    planted = copy.deepcopy(list(trace.steps))
    for s in planted:  # reported in the step it happened, as nanoengine's events are
        s["vllm"]["finished_req_ids"] = [e["seq_id"] for e in s["events"] if e["kind"] == "finished"]
    assert "finished_ids_next_step" in names(check_with(trace, "vllm", planted))


def test_free_blocks_are_reused_in_lru_order_and_keep_their_hashes_until_reused():
    """Every block a step takes from the pool is the head of the free queue (least recently freed
    first; a request frees its tail first), and a freed block keeps its hash until it is taken."""
    taken_with_hash = 0
    for name in NAMES:
        steps = load(name).steps
        for prev, step in zip(steps, steps[1:]):
            held_before = {b for r in prev["seqs"] for b in r["block_table_after"]}
            hit = {b for e in step["events"] if e["kind"] == "prefix_hit" for b in e["detail"]["blocks"]}
            used = {b for r in step["seqs"] for b in (*r["block_table"], *r["block_table_after"])}
            new = used - held_before - hit
            free = [b for b in prev["pool"]["free_block_ids"] if b not in hit]
            assert set(free[: len(new)]) == new, f"{name} step {step['step']}: took {new}, free head {free}"
            for b in prev["pool"]["free_block_ids"]:
                if b not in new and b not in hit:
                    assert step["pool"]["hashes"][b] == prev["pool"]["hashes"][b], f"{name}: block {b} lost its hash"
            taken_with_hash += sum(prev["pool"]["hashes"][b] is not None for b in new)
    assert taken_with_hash > 0  # some reuse evicted a cached block


def test_the_null_block_is_never_free_and_never_held():
    trace = load("08_preemption")
    assert trace.header["config"]["num_kv_blocks"] == trace.header["vllm"]["usable_blocks"] + 1
    assert all(0 not in s["pool"]["free_block_ids"] for s in trace.steps)
    assert "free_blocks" in names(check_with(trace, "nanoengine", trace.steps[:1]))  # nanoengine's rule
    planted = copy.deepcopy(trace.steps[0])
    planted["pool"]["free_block_ids"].append(0)
    found = check_with(trace, "vllm", [planted])
    assert any(v.invariant == "free_blocks" and "null block" in v.message for v in found), found


def test_a_step_that_preempts_admits_nobody():
    trace = load("demo-preemption")
    preempting = [s for s in trace.steps if any(e["kind"] == "preempted" for e in s["events"])]
    assert preempting and not any(e["kind"] == "admitted" for s in preempting for e in s["events"])
    steps = copy.deepcopy(list(trace.steps))
    i = steps.index(next(s for s in steps if s in preempting))
    victim = next(e["seq_id"] for e in steps[i]["events"] if e["kind"] == "preempted")
    steps[i]["events"].append({"kind": "admitted", "seq_id": victim, "detail": {}})
    found = check_with(trace, "vllm", steps[: i + 1])
    assert any(v.invariant == "no_admission_after_preemption" for v in found), found


def test_preempted_is_vllms_own_status_kept_beside_nanoengines():
    trace = load("08_preemption")
    rows = [r for s in trace.steps for r in s["seqs"] if r["vllm_status_after"] == "PREEMPTED"]
    assert rows and all(r["status_after"] == "WAITING" and r["block_table_after"] == [] for r in rows)


@pytest.mark.parametrize("name", NAMES)
def test_every_committed_row_and_pool_layout_is_the_one_builders(name):
    """vLLM's recorder writes with tracer/trace/step_line.py: its rows carry nanoengine's fields in
    their order, then vLLM's own statuses; owners and fill are the layout nanoengine's recorder derives."""
    from tracer.trace.step_line import pool_layout
    from tracer.vllm.record import VllmRow

    for step in load(name).steps:
        fields = tuple(VllmRow.__annotations__)  # request_id only where a row is sample i > 0 of n
        assert all(tuple(row) == tuple(f for f in fields if f in row) for row in step["seqs"])
        assert all(VllmRow.__required_keys__ <= set(row) for row in step["seqs"])
        layout = pool_layout(step["seqs"], step["pool"])
        assert (step["pool"]["owners"], step["pool"]["filled"]) == (layout["owners"], layout["filled"])


def test_n_samples_are_vllms_child_requests_sharing_the_prompt_through_the_prefix_cache():
    """parallel-sampling (issue 33): a request of 4 samples and one of 2, fanned out as vLLM's front end
    does; a sample admitted while a sibling holds the prompt hits its full blocks, in the same step too."""
    from tracer.trace.step_line import request_of

    trace = load("parallel-sampling")
    last = trace.steps[-1]["seqs"]
    groups: dict[int, list[int]] = {}
    for row in last:
        groups.setdefault(request_of(row), []).append(row["seq_id"])
    assert groups == {0: [0], 1: [1, 2, 3, 4], 5: [5, 6]}
    assert [trace.requests[s]["params"]["seed"] for s in (1, 2, 3, 4, 5, 6)] == [5, 6, 7, 8, 9, 10]
    hits = {
        (step["step"], e["seq_id"]): e["detail"]["blocks"]
        for step in trace.steps
        for e in step["events"]
        if e["kind"] == "prefix_hit"
    }
    sample0 = trace.steps[2]["seqs"][1]["block_table"]
    assert [hits[(2, s)] for s in (2, 3, 4)] == [sample0[:7]] * 3  # (30 - 1) // 4 blocks: the last token is computed
    assert (4, 5) in hits and hits[(4, 6)] == hits[(4, 5)]  # admitted together: 6 hits what 5 hit and scheduled
    assert names(check_with(trace, "vllm")) == set()
    broken = copy.deepcopy(trace.steps)
    row = next(r for r in broken[2]["seqs"] if r["seq_id"] == 3)
    row["num_cached_tokens"], row["num_scheduled_tokens"] = 0, 30  # as if it prefilled the prompt again
    found = [v for v in check_with(trace, "vllm", broken) if v.invariant == "sample_prefix_share"]
    assert [(v.step, v.seq_id) for v in found] == [(2, 3)]
