"""A trace that cannot be written never fails the engine's step: recording stops, the file keeps its
whole steps (or goes, if not even its header was written), and `failed` says why. One recorder per
file: a second is refused, and so is an earlier run's unfinished FILE.partial."""

from __future__ import annotations

import json
import os

import pytest
from conftest import SCENARIO_PARAMS, file_size_limit, make_tiny_engine

from tracer.trace.recorder import RecorderRefused, TraceRecorder, encode_line
from tracer.trace.trace_file import load_trace


def run_to_the_end(engine) -> None:
    while engine.has_unfinished():
        engine.step()


def test_a_full_disk_stops_the_recording_not_the_engine(tmp_path, one_torch_thread):
    engine = make_tiny_engine()
    path = tmp_path / "t.jsonl"
    recorder = TraceRecorder(engine, path)
    seq_id = engine.add_request("hello world", SCENARIO_PARAMS)
    engine.step()
    engine.step()
    with file_size_limit(path.stat().st_size + 100):  # the next line starts, then the disk is full
        run_to_the_end(engine)
    recorder.close()
    assert engine.collect(seq_id).finish_reason == "length"
    assert recorder.failed is not None and "File too large" in recorder.failed
    assert f"the trace {path} holds the 2 steps before it" in recorder.failed
    trace = load_trace(path, validate="all")
    assert trace.num_steps == 2 and trace.warning is None  # cut back to its last whole line


def test_a_trace_whose_header_cannot_be_written_is_removed(tmp_path, one_torch_thread):
    engine = make_tiny_engine()
    path = tmp_path / "t.jsonl"
    with file_size_limit(10):
        recorder = TraceRecorder(engine, path)
        seq_id = engine.add_request("hello world", SCENARIO_PARAMS)
        run_to_the_end(engine)
    recorder.close()
    assert engine.collect(seq_id).finish_reason == "length"
    assert recorder.failed is not None and recorder.failed.endswith("no trace was written")
    assert not path.exists()


def test_text_utf8_cannot_hold_is_written_as_a_json_escape():
    line = {"prompt": "caf\u00e9 \udfff"}
    assert encode_line({"prompt": "caf\u00e9"}) == '{"prompt":"café"}\n'.encode()  # as before: UTF-8 text
    written = encode_line(line)
    assert written == b'{"prompt":"caf\\u00e9 \\udfff"}\n' and json.loads(written) == line


def test_a_step_line_is_written_as_json_writes_it():
    """Step lines go through orjson, the header and lines with new requests through json: both read
    back the same; a lone surrogate, an int past 64 bits and a non-finite time take json's path."""
    step = {"type": "step", "step": 3, "wall_time": 1.5e-05, "model_time": 0.25, "seqs": [{"output_text": "café"}]}
    assert json.loads(encode_line(step)) == step and encode_line(step).endswith(b"}\n")
    for odd in ({"output_text": "caf\u00e9 \udfff"}, {"num_tokens": 2**70}):
        line = {**step, "seqs": [odd]}
        assert json.loads(encode_line(line)) == line
    for field in ("wall_time", "model_time"):
        for bad in (float("nan"), float("inf")):
            with pytest.raises(ValueError, match="not JSON compliant"):
                encode_line({**step, field: bad})
    with pytest.raises(ValueError, match="not JSON compliant"):  # a request's parameters: json's check
        encode_line({**step, "new_requests": [{"params": {"temperature": float("nan")}}]})


def test_a_second_recorder_on_one_file_is_refused(tmp_path, one_torch_thread):
    engine = make_tiny_engine()
    path = tmp_path / "t.jsonl"
    with TraceRecorder(engine, path) as first:
        with pytest.raises(
            RecorderRefused, match=f"{path} is being written by another nanoengine \\(pid {os.getpid()}\\)"
        ):
            TraceRecorder(make_tiny_engine(), path)
        engine.add_request("hello world", SCENARIO_PARAMS)
        run_to_the_end(engine)
    assert first.failed is None and load_trace(path).num_steps == first.num_steps > 0
    TraceRecorder(make_tiny_engine(), path).close()  # released with the file: a new run may write it again
    assert load_trace(path).num_steps == 0


def test_an_unfinished_partial_trace_is_never_truncated(tmp_path, one_torch_thread):
    partial = tmp_path / "run.jsonl.partial"
    partial.write_text('{"type": "header"}\n')
    with pytest.raises(RecorderRefused, match="holds an earlier run's unfinished trace \\(19 bytes\\): rename it"):
        TraceRecorder(make_tiny_engine(), partial)
    assert partial.read_text() == '{"type": "header"}\n'
    partial.write_text("")  # an empty one (what `nanoengine trace` makes to record into) is fine
    TraceRecorder(make_tiny_engine(), partial).close()
    assert load_trace(partial).header["schema_version"] == 4
