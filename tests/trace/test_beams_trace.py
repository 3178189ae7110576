"""A beam search in the trace: its rows (parent_id, beam_width), the step's blocks_to_copy, the forked,
copy_on_write and pruned events, and a checker that stays silent on correct beam-search traces of the
tiny model (forks, rewritten last tokens, pruned beams, copy-on-write, a restart after a preemption),
in process and from the command line."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import HANG_S, record_requests

from nanoengine import BeamSearchParams, SamplingParams
from nanoengine.engine import LLMEngine
from nanoengine.sequence import EventKind, FinishReason
from tracer.replay.decision_code import event_code
from tracer.trace.invariants import check_record, check_trace
from tracer.trace.kv_shadow import KvShadow
from tracer.trace.recorder import TraceRecorder
from tracer.trace.step_line import bare_line, beam_width_of, blocks_to_copy_of, parent_of, request_of
from tracer.trace.trace_file import Trace, load_trace

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPT = [5, 6, 7, 8, 9]
BEAMS = BeamSearchParams(beam_width=3, max_tokens=8, ignore_eos=True)
OPTIONS = dict(block_size=4, num_kv_blocks=64, max_num_batched_tokens=64, max_num_seqs=8, num_threads=1)
# A pool too small for two plain requests and the beam search: the search, admitted last, is the
# newest running (its forks stay beside their parent), so its beams are preempted, the search restarts
# from its prompt (recompute), the other beams are pruned.
TIGHT = dict(OPTIONS, num_kv_blocks=12)
PLAIN = SamplingParams(max_tokens=10, ignore_eos=True)
CROWD = [([11, 12, 13, 14, 15, 16], PLAIN), ([11, 12, 13, 14, 15, 17], PLAIN), (PROMPT, BEAMS)]


def record(path: Path, requests: list, **options) -> tuple[TraceRecorder, LLMEngine]:
    return record_requests(path, requests, **{**OPTIONS, **options})


def events(trace: Trace, kind: EventKind) -> list[tuple[dict, dict]]:
    """(step, event) of every event of one kind."""
    return [(step, e) for step in trace.steps for e in step["events"] if e["kind"] == kind]


def test_a_beam_search_trace_checks_clean_and_records_its_forks_and_copies(tmp_path):
    recorder, _ = record(tmp_path / "t.jsonl", [(PROMPT, BEAMS)])
    assert recorder.violations == []
    trace = load_trace(tmp_path / "t.jsonl", validate="all")  # every line against the schema
    assert check_trace(trace) == []
    forks, copies = events(trace, EventKind.FORKED), events(trace, EventKind.COPY_ON_WRITE)
    pruned = [e for _, e in events(trace, EventKind.FINISHED) if e["detail"]["reason"] == FinishReason.PRUNED]
    assert forks and copies and pruned
    first = trace.steps[0]["seqs"][0]["seq_id"]
    for step, e in forks:
        child = next(r for r in step["seqs"] if r["seq_id"] == e["seq_id"])
        parent = next(r for r in step["seqs"] if r["seq_id"] == e["detail"]["parent"])
        assert parent_of(child) == parent["seq_id"] and request_of(child) == first and beam_width_of(child) == 3
        assert list(child["block_table_after"]) == list(parent["block_table_after"]) == e["detail"]["blocks"]
        assert child["status_before"] == "RUNNING" and child["num_scheduled_tokens"] == 0
        assert len(child["new_token_ids"]) == 1 and len(child["new_token_logprobs"]) == 1
    for step, e in copies:
        assert (e["detail"]["source"], e["detail"]["copy"]) in blocks_to_copy_of(step)
    assert all("blocks_to_copy" not in s for s in trace.steps if not events_of_kind(s, EventKind.COPY_ON_WRITE))
    assert trace.requests[first]["params"]["beam_width"] == 3 and "n" not in trace.requests[first]["params"]


def events_of_kind(step: dict, kind: EventKind) -> list[dict]:
    return [e for e in step["events"] if e["kind"] == kind]


def test_each_beams_output_text_is_its_own_tokens(tmp_path):
    """A forked beam's text starts with its parent's: the recorder decodes its tokens, not only its own."""
    engine = LLMEngine("tiny", **OPTIONS)
    with TraceRecorder(engine, tmp_path / "t.jsonl"):
        engine.add_request(PROMPT, BEAMS)
        while engine.has_unfinished():
            engine.step()
    last = load_trace(tmp_path / "t.jsonl").steps[-1]
    texts = {r["seq_id"]: r["output_text"] for r in last["seqs"]}
    want = {
        sid: engine.tokenizer.decode(s.completion_token_ids, skip_special_tokens=True)
        for sid, s in engine.sequences.items()
    }
    assert len(texts) > 3 and texts == want


def test_a_restart_after_a_preemption_checks_clean(tmp_path):
    recorder, _ = record(
        tmp_path / "t.jsonl",
        CROWD,
        **TIGHT,
    )
    assert recorder.violations == []
    trace = load_trace(tmp_path / "t.jsonl", validate="all")
    assert check_trace(trace) == []
    preempted = {e["seq_id"] for _, e in events(trace, EventKind.PREEMPTED)}
    beams = {r["seq_id"] for s in trace.steps for r in s["seqs"] if beam_width_of(r)}
    assert preempted and preempted <= beams  # the newest running sequences: the beams, together
    restarted = [
        (before, row)
        for before, step in zip(trace.steps, trace.steps[1:])
        for row in step["seqs"]
        if row["seq_id"] in preempted and row["status_after"] == "WAITING"
        for before in [next(r for r in before["seqs"] if r["seq_id"] == row["seq_id"])]
    ]
    assert restarted  # its search restarts from the prompt: num_tokens shrinks
    assert all(row["num_tokens"] == row["num_prompt_tokens"] < before["num_tokens_after"] for before, row in restarted)
    reasons = Counter(e["detail"]["reason"] for _, e in events(trace, EventKind.FINISHED))
    assert reasons[FinishReason.PRUNED] > 0 and reasons[FinishReason.LENGTH] == 3 + 2  # 3 beams, 2 plain


def test_a_trace_of_plain_requests_has_no_beam_fields(tmp_path):
    record(tmp_path / "t.jsonl", [(PROMPT, SamplingParams(max_tokens=4, ignore_eos=True))])
    text = (tmp_path / "t.jsonl").read_text()
    assert all(f'"{key}"' not in text for key in ("parent_id", "beam_width", "blocks_to_copy"))


def test_check_on_the_command_line_passes_a_beam_search_trace(tmp_path):
    path = tmp_path / "t.jsonl"
    record(path, CROWD, **TIGHT)
    checked = subprocess.run(
        [sys.executable, "-m", "tracer.cli.main", "check", str(path)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "invariants (nanoengine) hold at every step" in " ".join(checked.stdout.split())


def test_the_code_panel_shows_the_line_that_forked_copied_or_pruned(tmp_path):
    record(
        tmp_path / "t.jsonl",
        CROWD,
        **TIGHT,
    )
    trace = load_trace(tmp_path / "t.jsonl")
    sources = trace.header["sources"]
    pruned = [e for _, e in events(trace, EventKind.FINISHED) if e["detail"]["reason"] == FinishReason.PRUNED]
    by_ranking = next(e for e in pruned if e["where"][1][0] == "LLMEngine.advance_beams")
    by_restart = next(e for e in pruned if e["where"][0][0] == "Scheduler.recompute_later")
    cases = [
        (events(trace, EventKind.FORKED)[0][1], "LLMEngine.advance_beams", "self.fork("),
        (events(trace, EventKind.COPY_ON_WRITE)[0][1], "Scheduler.schedule_unit", "EventKind.COPY_ON_WRITE"),
        (by_ranking, "LLMEngine.advance_beams", "FinishReason.PRUNED"),
        (by_restart, "Scheduler.recompute_later", "FinishReason.PRUNED"),
    ]
    for event, decider, text in cases:
        code = event_code(event, sources)
        assert f"decided in {decider}, line" in code.title, code.title
        section = next(s for s in code.sections if s.name == decider)
        assert text in section.lines[section.deciding - section.first_line], (decider, section.deciding)


def test_the_kv_shadow_copies_a_block_and_cuts_a_restarted_chain():
    kv = KvShadow()
    kv.start(4, 2, fresh_engine=True)
    chain = kv.chain(7, [1, 2, 3], 3)
    kv.write(7, chain, [1, 2, 3], [0, 1, 2], [0, 1, 2])
    kv.copy(1, 3)
    assert kv.blocks[3] == kv.blocks[1] and kv.blocks[3] is not kv.blocks[1] and kv.versions[3] == 1
    kv.cut(7, 1)
    assert kv.chains[7] == [[chain[0][0]]]
    assert kv.chain(7, [1, 9, 9], 3)[0][1] != kv.blocks[0][1]  # the new tokens chain afresh


def test_the_bare_step_records_of_a_beam_search_check_clean():
    """check_record reads a StepRecord without history: its copies come along (bare_line)."""
    engine = LLMEngine("tiny", **TIGHT)
    records: list = []
    engine.add_step_hook(records.append)
    for prompt, params in CROWD:
        engine.add_request(prompt, params)
    while engine.has_unfinished():
        engine.step()
    assert any(r.blocks_to_copy for r in records)
    assert [v for r in records for v in check_record(r, block_size=4)] == []
    copying = next(r for r in records if r.blocks_to_copy)
    assert bare_line(copying)["blocks_to_copy"] == [list(pair) for pair in copying.blocks_to_copy]
    assert "blocks_to_copy" not in bare_line(records[0])  # the first step copies nothing
