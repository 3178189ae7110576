"""The state machine's lanes over random traces: a chip sits where its counters and events say.

Hypothesis draws small tiny-model workloads (chunked prefill, prefix hits, preemption by
recompute); every step of each recorded trace is drawn by the real StateMachineView and each
chip's cell is checked against the sequence's state:

* WAITING and FINISHED chips sit in their boxes;
* a RUNNING chip sits in the prefill lane exactly while the engine's own events say a
  (re)computation is under way (admitted, no prefill_done yet), and then its counters agree:
  some tokens uncomputed, no sampled token kept this step;
* a chip in the decode lane has generated tokens and exactly one token (its newest) to compute.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from conftest import drive, torch_threads
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from textual.app import App, ComposeResult

from nanoengine.engine import LLMEngine
from tracer.replay.views.state_machine import StateMachineView, make_layout
from tracer.trace.recorder import TraceRecorder
from tracer.trace.trace_file import load_trace

SIZE = (70, 14)


class Host(App[None]):
    def compose(self) -> ComposeResult:
        yield StateMachineView(id="machine")


@st.composite
def workloads(draw) -> tuple[dict, list[tuple[str, int, int]]]:
    base = draw(st.text(alphabet="ab ", min_size=0, max_size=24))
    requests = [
        (base + draw(st.text(alphabet="xyz", min_size=1, max_size=8)), draw(st.integers(1, 6)), draw(st.integers(0, 4)))
        for _ in range(draw(st.integers(1, 5)))
    ]
    block_size = draw(st.integers(1, 6))
    longest = max(len(p) + n for p, n, _ in requests)
    options = dict(
        block_size=block_size,
        num_kv_blocks=-(-longest // block_size) + draw(st.integers(0, 6)),
        max_num_batched_tokens=draw(st.integers(1, 24)),
        max_num_seqs=draw(st.integers(1, 5)),
        enable_prefix_caching=draw(st.booleans()),
    )
    return options, requests


def record(options: dict, requests: list[tuple[str, int, int]], path: Path):
    engine = LLMEngine("tiny", **options)
    with torch_threads(1), TraceRecorder(engine, path):
        drive(engine, requests, max_steps=10_000)
    return load_trace(path, validate="none")


def expected_lanes(trace) -> list[dict[int, str]]:
    """seq_id -> lane at the end of each step, from the events alone (the engine's own account)."""
    prefilling: set[int] = set()
    lanes = []
    for step in trace.steps:
        for event in step["events"]:
            if event["kind"] == "admitted":
                prefilling.add(event["seq_id"])
            elif event["kind"] in ("prefill_done", "preempted", "finished"):
                prefilling.discard(event["seq_id"])
        lane = {}
        for seq in step["seqs"]:
            status = seq["status_after"]
            lane[seq["seq_id"]] = (
                status if status != "RUNNING" else "PREFILL" if seq["seq_id"] in prefilling else "DECODE"
            )
        lanes.append(lane)
    return lanes


def lane_at(x: int, y: int, layout) -> str:
    if layout.wait[0] < x < layout.wait[1]:
        return "WAITING"
    if layout.fin[0] < x < layout.fin[1]:
        return "FINISHED"
    assert layout.run[0] < x < layout.run[1], (x, y)
    if y in layout.prefill_rows:
        return "PREFILL"
    assert y in layout.decode_rows, (x, y)
    return "DECODE"


def counters_agree(seq: dict, lane: str) -> bool:
    generated = seq["num_tokens_after"] - seq["num_prompt_tokens"]
    left = seq["num_tokens_after"] - seq["num_cached_tokens_after"]
    if lane == "PREFILL":
        return left >= 1 and not (seq["num_scheduled_tokens"] and seq["new_token_ids"])
    if lane == "DECODE":
        return generated >= 1 and left == 1
    return True


async def check_trace(trace) -> int:
    checked = 0
    app = Host()
    async with app.run_test(size=SIZE):
        view = app.query_one(StateMachineView)
        view.animations = False
        layout = make_layout(view.content_size.width, view.content_size.height)
        for i, (step, lanes) in enumerate(zip(trace.steps, expected_lanes(trace))):
            view.show(step, trace.steps[i - 1] if i else None, trace.header)
            view.draw()
            seqs = {seq["seq_id"]: seq for seq in step["seqs"]}
            for (x, y), seq_id in view.chip_cells.items():
                seq, drawn = seqs[seq_id], lane_at(x, y, layout)
                left = seq["num_tokens_after"] - seq["num_cached_tokens_after"]
                generated = seq["num_tokens_after"] - seq["num_prompt_tokens"]
                if seq["num_scheduled_tokens"] or left > 1 or not generated:  # else: a skipped recompute, one left
                    assert drawn == lanes[seq_id], f"step {step['step']}: {seq}"
                assert counters_agree(seq, drawn), f"step {step['step']}: {drawn} but {seq}"
                checked += 1
    return checked


def test_lesson_2_step_4_mid_prefill_after_a_prefix_hit_is_in_the_prefill_lane(tmp_path):
    """The issue's case: B is chunk 1 of 2 after a prefix hit, cached 12→17 of 18, gen 0."""
    from tracer.cli.main import main

    out = tmp_path / "l2.jsonl"
    assert main(["lesson", "trace", "2", "--reference", "--no-tui", "--out", str(out), "--dir", str(tmp_path)]) == 0
    trace = load_trace(out)
    step = next(s for s in trace.steps if any(e["kind"] == "prefix_hit" for e in s["events"]))
    hit = next(e["seq_id"] for e in step["events"] if e["kind"] == "prefix_hit")
    seq = next(q for q in step["seqs"] if q["seq_id"] == hit)
    assert (
        seq["num_tokens_after"] == seq["num_prompt_tokens"] and seq["num_cached_tokens_after"] < seq["num_tokens_after"]
    )
    assert asyncio.run(check_trace(trace)) > 0


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_a_chips_lane_always_matches_its_counters(workload):
    options, requests = workload
    with tempfile.TemporaryDirectory() as tmp:
        trace = record(options, requests, Path(tmp) / "w.jsonl")
    assert asyncio.run(check_trace(trace)) > 0
