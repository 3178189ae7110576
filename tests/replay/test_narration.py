"""The narration sentence: a pure function of one step dict and the header."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracer.replay.narration import estimate_chunks, narrate
from tracer.trace.trace_file import load_trace

TRACE = Path(__file__).parents[1] / "data" / "replay_small.jsonl"
HEADER = {"config": {"max_num_batched_tokens": 4}}


def seq(seq_id: int, before: str = "RUNNING", after: str = "RUNNING", **fields) -> dict:
    row = {
        "seq_id": seq_id,
        "num_prompt_tokens": 8,
        "status_before": before,
        "status_after": after,
        "num_tokens": 9,
        "num_cached_tokens": 8,
        "num_scheduled_tokens": 1,
        "new_token_ids": [],
        "new_token_texts": [],
    }
    row.update(fields)
    return row


def step(number: int, seqs: list[dict], events: list[dict], batch: list[int]) -> dict:
    return {"step": number, "seqs": seqs, "events": events, "inputs": {"seq_ids": batch}}


def event(kind: str, seq_id: int, **detail) -> dict:
    return {"kind": kind, "seq_id": seq_id, "detail": detail}


@pytest.fixture(scope="module")
def trace():
    return load_trace(TRACE)


def test_chunk_estimate_uses_remaining_tokens_and_budget():
    assert estimate_chunks({"chunk": 1, "end": 4, "num_tokens": 10}, 4) == 3  # 6 left -> 2 more
    assert estimate_chunks({"chunk": 3, "end": 10, "num_tokens": 10}, 4) == 3  # last chunk
    assert estimate_chunks({"chunk": 2, "end": 5, "num_tokens": 10}, 0) == 2  # unknown budget


def test_admission_with_first_chunk():
    s = step(
        0,
        [seq(0, "WAITING", "RUNNING", num_scheduled_tokens=4)],
        [event("admitted", 0), event("prefill_chunk", 0, chunk=1, start=0, end=4, num_tokens=8)],
        [0],
    )
    assert (
        narrate(s, HEADER) == "Step 0: seq 0 (A) was admitted to RUNNING and prefilled 4 prompt tokens (chunk 1 of 2)."
    )


def test_last_chunk_generates_and_decode_is_listed():
    s = step(
        7,
        [
            seq(0, new_token_ids=[5], new_token_texts=[" Paris"]),
            seq(2, num_scheduled_tokens=3, new_token_ids=[9], new_token_texts=[" The"]),
        ],
        [event("prefill_chunk", 2, chunk=3, start=5, end=8, num_tokens=8), event("prefill_done", 2, chunks=3)],
        [0, 2],
    )
    assert narrate(s, HEADER) == (
        "Step 7: seq 2 (C) prefilled 3 prompt tokens (chunk 3 of 3) and generated ' The'; seq 0 (A) generated ' Paris'."
    )


def test_one_token_is_singular():
    s = step(
        5,
        [seq(1, num_scheduled_tokens=1, new_token_ids=[7], new_token_texts=["x"])],
        [event("prefill_chunk", 1, chunk=2, start=7, end=8, num_tokens=8), event("prefill_done", 1, chunks=2)],
        [1],
    )
    assert "prefilled 1 prompt token (chunk 2 of 2)" in narrate(s, HEADER)


def test_preemption_and_finish_are_told():
    s = step(
        9,
        [
            seq(0, after="FINISHED", new_token_ids=[2], new_token_texts=["!"]),
            seq(1, after="WAITING", num_scheduled_tokens=0),
        ],
        [event("preempted", 1, reason="KV cache full"), event("finished", 0, reason="length")],
        [0],
    )
    text = narrate(s, HEADER)
    assert text == (
        "Step 9: seq 0 (A) generated '!' and finished (length); "
        "seq 1 (B) was preempted back to WAITING (KV cache full)."
    )


def test_recompute_after_preemption_counts_tokens_not_prompt_tokens():
    s = step(
        4,
        [seq(1, "WAITING", "RUNNING", num_prompt_tokens=3)],
        [event("admitted", 1), event("prefill_chunk", 1, chunk=1, start=0, end=4, num_tokens=6)],
        [1],
    )
    assert "prefilled 4 tokens (chunk 1 of 2)" in narrate(s, HEADER)


def test_prefix_hit_tells_the_saving():
    s = step(
        3,
        [seq(2, "WAITING", "RUNNING")],
        [event("admitted", 2), event("prefix_hit", 2, blocks=[0, 1], tokens_saved=8)],
        [2],
    )
    assert "reused 8 cached tokens (2 blocks from the prefix cache)" in narrate(s, HEADER)


def test_many_decodes_are_summarised():
    seqs = [seq(i, new_token_ids=[1], new_token_texts=["x"]) for i in range(6)]
    assert (
        narrate(step(5, seqs, [], list(range(6))), HEADER)
        == "Step 5: 6 sequences (seq 0, 1, 2, ...) each generated one token."
    )


def test_idle_step():
    assert (
        narrate(step(11, [seq(0, "FINISHED", "FINISHED", num_scheduled_tokens=0)], [], []), HEADER)
        == "Step 11: nothing was scheduled."
    )


def test_every_step_of_the_fixture_names_each_scheduled_sequence(trace):
    header = dict(trace.header, requests=list(trace.requests.values()))
    for s in trace.steps:
        text = narrate(s, header)
        assert text.startswith(f"Step {s['step']}: ") and text.endswith(".")
        for seq_id in s["inputs"]["seq_ids"]:
            assert f"seq {seq_id} (" in text


def test_fixture_chunks_match_the_recorded_events(trace):
    header = dict(trace.header, requests=list(trace.requests.values()))
    texts = [narrate(s, header) for s in trace.steps]
    assert "seq 1 (B) prefilled 11 prompt tokens (chunk 2 of 3)" in texts[3]
    assert "seq 1 (B) prefilled 3 prompt tokens (chunk 3 of 3)" in texts[4]
    assert "seq 2 (C) was preempted back to WAITING" in texts[8]


def test_a_hit_on_blocks_computed_in_the_same_step_names_who_computes_them():
    a = seq(0, "WAITING", "RUNNING", num_cached_tokens=0, num_scheduled_tokens=16, block_table=[5, 6, 7, 8])
    b = seq(1, "WAITING", "RUNNING", num_cached_tokens=12, num_scheduled_tokens=4, block_table=[5, 6, 7, 9])
    s = step(
        0,
        [a, b],
        [event("admitted", 0), event("admitted", 1), event("prefix_hit", 1, blocks=[5, 6, 7], tokens_saved=12)],
        [0, 1],
    )
    s["inputs"].update(query_start_loc=[0, 16, 20], slot_mapping=list(range(20, 36)) + list(range(36, 40)))
    s["pool"] = {"block_size": 4}
    assert (
        "seq 1 (B) was admitted to RUNNING and reused A's blocks 0-2 (12 tokens), which A computes in this same step"
        in narrate(s, HEADER)
    )
    s["inputs"]["slot_mapping"] = list(range(60, 76)) + list(range(36, 40))  # A writes elsewhere: an old hit
    assert "reused 12 cached tokens (3 blocks from the prefix cache)" in narrate(s, HEADER)


# ---- the why of each decision (trace schema 3: the numbers its event records) -----------------------
V3 = {"schema_version": 3, "config": {"max_num_batched_tokens": 64, "max_num_seqs": 4, "block_size": 4}}


def batch_step(number: int, seqs: list[dict], events: list[dict], batch: list[int], waiting=(), running=()) -> dict:
    """A step whose inputs and queues are as the engine records them."""
    scheduled = {s["seq_id"]: s["num_scheduled_tokens"] for s in seqs}
    starts = [0]
    for sid in batch:
        starts.append(starts[-1] + scheduled[sid])
    s = step(number, seqs, events, batch)
    s["inputs"]["query_start_loc"] = starts
    s["pool"] = {"block_size": 4}
    s["queues"] = {"running": list(running), "waiting": list(waiting), "num_waiting": len(waiting)}
    return s


def test_a_chunk_capped_by_the_budget_says_what_the_budget_went_to():
    decodes = [seq(i, new_token_ids=[1], new_token_texts=["x"]) for i in range(16)]
    c = seq(
        16, "WAITING", "RUNNING", num_prompt_tokens=120, num_tokens=120, num_cached_tokens=0, num_scheduled_tokens=48
    )
    events = [
        event("admitted", 16, need=12, free=30),
        event("prefill_chunk", 16, chunk=1, start=0, end=48, num_tokens=120, budget=48),
    ]
    s = batch_step(3, [*decodes, c], events, list(range(17)), running=range(16))
    text = narrate(s, V3)
    assert (
        "seq 16 (Q) was admitted to RUNNING (takes 12 of the 30 free blocks) and prefilled 48 of 120 prompt tokens "
        "(chunk 1 of 3: 48 budget tokens left after 16 decodes)" in text
    )
    s["events"][1]["detail"].pop("budget")  # a version-2 event: the old wording
    assert "prefilled 48 prompt tokens (chunk 1 of 3)" in narrate(s, V3)


def test_a_chunk_after_another_chunk_and_the_whole_budget():
    a = seq(0, num_tokens=100, num_cached_tokens=40, num_scheduled_tokens=20)
    b = seq(1, "WAITING", "RUNNING", num_tokens=30, num_cached_tokens=0, num_scheduled_tokens=4)
    events = [
        event("prefill_chunk", 0, chunk=3, start=40, end=60, num_tokens=100, budget=24),
        event("admitted", 1, need=1, free=5),
        event("prefill_chunk", 1, chunk=1, start=0, end=4, num_tokens=30, budget=4),
    ]
    text = narrate(batch_step(2, [a, b], events, [0, 1], running=[0]), V3)
    assert "seq 0 (A) prefilled 20 of 60 tokens (chunk 3 of 4: the whole 24-token budget)" in text
    assert "prefilled 4 of 30 prompt tokens (chunk 1 of 2: 4 budget tokens left after a 20-token chunk)" in text


def test_a_wait_for_blocks_names_the_blocks_needed_and_free():
    a = seq(0, new_token_ids=[1], new_token_texts=["x"])
    d = seq(3, "WAITING", "WAITING", num_scheduled_tokens=0)
    s = batch_step(5, [a, d], [event("not_admitted", 3, need=3, free=1)], [0], waiting=[3], running=[0])
    assert narrate(s, V3) == "Step 5: seq 0 (A) generated 'x'; seq 3 (D) was not admitted: needs 3 blocks, 1 free."
    s["events"][0]["detail"] = {}
    assert narrate(s, V3).endswith("seq 3 (D) was not admitted.")


def test_the_waiting_head_says_why_it_waits_when_no_event_does():
    full = [seq(i, num_scheduled_tokens=16, new_token_ids=[1], new_token_texts=["x"]) for i in range(4)]
    s = batch_step(6, full, [], [0, 1, 2, 3], waiting=[4, 5], running=[0, 1, 2, 3])
    assert narrate(s, V3).endswith("; seq 4 (E) was not admitted: the 64-token budget is spent.")
    for row in s["seqs"]:
        row["num_scheduled_tokens"] = 1
    s["inputs"]["query_start_loc"] = [0, 1, 2, 3, 4]
    assert narrate(s, V3).endswith("; seq 4 (E) was not admitted: 4 sequences running, max_num_seqs is 4.")
    s["queues"]["running"] = [0, 1, 2]
    assert "not admitted" not in narrate(s, V3)  # room and budget left: nothing to explain
    assert "not admitted" not in narrate(s, dict(V3, schema_version=2))  # an older trace: no guess


def test_a_preemption_says_who_needed_how_many_blocks_of_how_few():
    a = seq(0, num_tokens=13, num_cached_tokens=12, num_scheduled_tokens=1, block_table=[0, 1, 2, 3])
    c = seq(2, after="WAITING", num_scheduled_tokens=0)
    s = batch_step(7, [a, c], [event("preempted", 2, by=0, free=0)], [0], running=[0, 2])
    s["seqs"][0]["new_token_ids"], s["seqs"][0]["new_token_texts"] = [5], ["y"]
    assert "seq 2 (C) was preempted back to WAITING (seq 0 (A) needed 1 block, 0 free)" in narrate(s, V3)
    s["events"][0]["detail"] = {"by": 2, "free": 0}  # it gave up its own place
    assert "seq 2 (C) was preempted back to WAITING (it needed a block, 0 free)" in narrate(s, V3)


def test_a_prefix_hit_says_why_it_stopped():
    b = seq(1, "WAITING", "RUNNING", num_tokens=20, num_cached_tokens=8, num_scheduled_tokens=12)
    events = [
        event("admitted", 1, need=3, free=9),
        event("prefix_hit", 1, blocks=[0, 1], tokens_saved=8),
        event("prefill_chunk", 1, chunk=1, start=8, end=20, num_tokens=20, budget=64),
    ]
    s = batch_step(4, [b], events, [1])
    assert "(2 blocks from the prefix cache; its 3rd block was not in the cache)" in narrate(s, V3)
    s["events"][1]["detail"]["blocks"] = [0, 1, 2, 3]  # (20 - 1) // 4 = 4 blocks: as far as a hit goes
    assert "(4 blocks from the prefix cache; the rest holds its last token, which is always computed)" in narrate(s, V3)
    s["events"][0]["detail"] = {}  # no numbers: the old wording
    assert "(4 blocks from the prefix cache)" in narrate(s, V3)


@pytest.mark.parametrize("name", ["trace_v1.jsonl", "replay_small.jsonl"])
def test_older_traces_narrate_with_the_old_wording(name):
    """Versions 1 and 2 record no decision numbers: no why is guessed for them."""
    old = load_trace(Path(__file__).parents[1] / "data" / name)
    assert old.header["schema_version"] < 3
    texts = [narrate(s, old.header) for s in old.steps]
    assert texts and all(t.startswith("Step ") for t in texts)
    for phrase in ("not admitted", "budget", "free block", "blocks, ", "always computed", "not in the cache"):
        assert not any(phrase in t for t in texts), phrase
    assert any("was admitted to RUNNING" in t for t in texts)
