"""`nanoengine export --perfetto`: the Chrome Trace Event structure, and that it tells the trace's story."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from chrome_trace_format import format_errors

from tracer.cli.main import main
from tracer.export.perfetto import ENGINE_PID, LOGICAL_STEP_US, SEQS_PID, STEP_TID, perfetto_trace, seq_tid


@pytest.fixture(scope="module")
def exported(tiny_trace) -> dict:
    return perfetto_trace(tiny_trace)


def events_of(data: dict, ph: str, pid: int | None = None, tid: int | None = None, name: str | None = None):
    return [
        e
        for e in data["traceEvents"]
        if e["ph"] == ph
        and (pid is None or e["pid"] == pid)
        and (tid is None or e["tid"] == tid)
        and (name is None or e["name"] == name)
    ]


def shift_half(event: dict) -> None:
    """Move a slice half its length later: it now straddles the next one on its thread."""
    event["ts"] += event["dur"] / 2


def trace_events(trace, kind: str) -> list[tuple[int, int]]:
    return [(s["step"], e["seq_id"]) for s in trace.steps for e in s["events"] if e["kind"] == kind]


def test_structure_follows_the_trace_event_format(exported):
    assert format_errors(exported) == []
    assert exported["displayTimeUnit"] == "ms"
    assert json.loads(json.dumps(exported)) == exported  # plain JSON


@pytest.mark.parametrize(
    "break_it, message",
    [
        (lambda d: events_of(d, "X")[0].pop("dur"), "needs dur"),
        (lambda d: events_of(d, "C")[0]["args"].update(x="many"), "args of numbers"),
        (lambda d: d["traceEvents"].remove(events_of(d, "f")[0]), "has only ['s']"),
        (lambda d: events_of(d, "i")[0].update(s="x"), "scope s"),
        (lambda d: shift_half(events_of(d, "X", name="decode")[0]), "overlaps"),
        (lambda d: events_of(d, "M")[0].update(name="process"), "metadata name"),
    ],
)
def test_the_format_checker_catches_planted_mistakes(tiny_trace, break_it, message):
    broken = perfetto_trace(tiny_trace, logical=True)  # logical: the planted overlap does not hang on timings
    assert format_errors(broken) == []
    break_it(broken)
    assert any(message in error for error in format_errors(broken)), format_errors(broken)


def test_engine_step_track_has_each_step_split_into_host_and_model_time(tiny_trace, exported):
    slices = events_of(exported, "X", ENGINE_PID, STEP_TID)
    triples = [slices[i : i + 3] for i in range(0, len(slices), 3)]  # written as step, host part, model part
    assert [outer["args"]["step"] for outer, _, _ in triples] == [s["step"] for s in tiny_trace.steps]
    start = 0
    for (outer, host, model), step in zip(triples, tiny_trace.steps):
        assert (outer["name"], host["name"], model["name"]) == (
            f"step {step['step']}",
            "schedule + bookkeeping",
            "model forward + sample",
        )
        assert outer["ts"] == start  # laid end to end, in whole microseconds (the trace's resolution)
        assert outer["dur"] == round(step["wall_time"] * 1e6)
        assert host["ts"] == outer["ts"] and model["ts"] == host["ts"] + host["dur"]
        assert model["dur"] == pytest.approx(step["model_time"] * 1e6, abs=1)
        assert host["dur"] + model["dur"] == outer["dur"]
        start += outer["dur"]


def test_counters_follow_the_pool_the_queue_and_the_batch(tiny_trace, exported):
    by_name = {name: events_of(exported, "C", name=name) for name in ("KV pool", "sequences", "batch")}
    for i, step in enumerate(tiny_trace.steps):
        assert by_name["KV pool"][i]["args"] == {"free blocks": len(step["pool"]["free_block_ids"])}
        waiting = sum(s["status_after"] == "WAITING" for s in step["seqs"])
        assert by_name["sequences"][i]["args"] == {"running": len(step["inputs"]["seq_ids"]), "waiting": waiting}
        assert by_name["batch"][i]["args"] == {"batched tokens": len(step["inputs"]["input_ids"])}


def test_one_named_track_per_sequence_with_its_prefill_chunks_and_decodes(tiny_trace, exported):
    names = {e["tid"]: e["args"]["name"] for e in events_of(exported, "M", SEQS_PID, name="thread_name")}
    assert sorted(names) == sorted(seq_tid(seq_id) for seq_id in tiny_trace.requests)
    first = min(tiny_trace.requests)  # seq ids count up across the engines of a test run
    assert names[seq_tid(first)] == f"seq {first}: {tiny_trace.requests[first]['prompt']}"
    chunks = Counter(seq_id for _, seq_id in trace_events(tiny_trace, "prefill_chunk"))
    for seq_id in tiny_trace.requests:
        work = [e for e in events_of(exported, "X", SEQS_PID, seq_tid(seq_id)) if e["name"] not in ("waiting",)]
        prefills = [e for e in work if e["name"].startswith("prefill chunk")]
        assert len(prefills) == chunks[seq_id]
        scheduled = [s for s in tiny_trace.steps if seq_id in s["inputs"]["seq_ids"]]
        assert len([e for e in work if e["name"] != "preempted"]) == len(scheduled)
        for event in work:
            if event["name"] == "preempted":
                continue
            step = next(s for s in tiny_trace.steps if s["step"] == event["args"]["step"])
            seq = next(s for s in step["seqs"] if s["seq_id"] == seq_id)
            for key in ("num_tokens", "num_cached_tokens", "num_scheduled_tokens", "block_table"):
                assert event["args"][key] == seq[key]


def test_instant_events_for_admission_prefix_hits_preemption_and_finish(tiny_trace, exported):
    for kind in ("admitted", "prefix_hit", "preempted", "finished"):
        instants = events_of(exported, "i", SEQS_PID, name=kind.replace("_", " "))
        expected = trace_events(tiny_trace, kind)
        assert len(expected) > 0, f"the tiny scenario should show {kind}"
        assert sorted(e["tid"] for e in instants) == sorted(seq_tid(seq_id) for _, seq_id in expected)
    hit = events_of(exported, "i", name="prefix hit")[0]
    assert hit["args"]["tokens_saved"] > 0 and hit["args"]["blocks"]


def test_a_flow_arrow_links_each_preemption_to_its_readmission(tiny_trace, exported):
    starts, finishes = events_of(exported, "s"), events_of(exported, "f")
    preempted = trace_events(tiny_trace, "preempted")
    assert len(starts) == len(finishes) == len(preempted) > 0
    for (step_number, seq_id), start in zip(preempted, starts):
        finish = next(f for f in finishes if f["id"] == start["id"])
        assert start["tid"] == finish["tid"] == seq_tid(seq_id)
        readmitted = [s for s, i in trace_events(tiny_trace, "admitted") if i == seq_id and s > step_number]
        binding = [
            e
            for e in events_of(exported, "X", SEQS_PID, seq_tid(seq_id))
            if e["ts"] <= finish["ts"] <= e["ts"] + e["dur"]
        ]
        assert binding[0]["name"].startswith("prefill chunk") and binding[0]["args"]["step"] == readmitted[0]


def test_logical_time_is_one_millisecond_per_step(tiny_trace):
    data = perfetto_trace(tiny_trace, logical=True)
    assert format_errors(data) == []
    outer = [e for e in events_of(data, "X", ENGINE_PID, STEP_TID) if e["name"].startswith("step ")]
    assert [e["ts"] for e in outer] == [i * LOGICAL_STEP_US for i in range(len(tiny_trace.steps))]
    assert {e["dur"] for e in outer} == {LOGICAL_STEP_US}


def test_cli_writes_a_step_range(tiny_trace_path, tmp_path, capsys):
    out = tmp_path / "out" / "run.json"
    assert main(["export", str(tiny_trace_path), "--perfetto", str(out), "--steps", "3-8", "--logical"]) == 0
    data = json.loads(out.read_text())
    assert format_errors(data) == []
    outer = [e for e in events_of(data, "X", ENGINE_PID, STEP_TID) if e["name"].startswith("step ")]
    assert [e["args"]["step"] for e in outer] == list(range(3, 9))
    assert "Wrote" in capsys.readouterr().err
