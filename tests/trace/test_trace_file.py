"""Loading traces: schema validation, clear one-line errors, cut-short files, speed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from tracer.trace.invariants import check_trace
from tracer.trace.trace_file import SCHEMA_PATH, TraceError, load_trace

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def lines_of(path) -> list[str]:
    return path.read_text().splitlines()


def write(path, lines: list[str], end: str = "\n"):
    path.write_text("\n".join(lines) + end)
    return path


def edit_step(tiny_trace_path, tmp_path, index: int, change) -> object:
    """A copy of the tiny trace with step line `index` changed by change(step_dict)."""
    lines = lines_of(tiny_trace_path)
    step = json.loads(lines[index + 1])
    change(step)
    lines[index + 1] = json.dumps(step)
    return write(tmp_path / "edited.jsonl", lines)


def load_error(path, **kwargs) -> str:
    with pytest.raises(TraceError) as info:
        load_trace(path, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_schema_is_valid_json_schema():
    Draft202012Validator.check_schema(json.loads(SCHEMA_PATH.read_text()))


def test_a_recorded_trace_loads_and_validates_fully(tiny_trace_path):
    trace = load_trace(tiny_trace_path, validate="all")
    assert trace.warning is None and trace.num_steps == len(lines_of(tiny_trace_path)) - 1
    assert trace.header["type"] == "header" and all(s["type"] == "step" for s in trace.steps)
    assert sorted(trace.requests) == list(range(min(trace.requests), min(trace.requests) + 5))


@pytest.mark.parametrize(
    "content, expected",
    [
        ("", "is empty"),
        ("\n  \n", "is empty"),
        ("a,b,c\n1,2,3\n", "not a nanoengine trace (line 1 is not JSON)"),
        ('{"name": "something else"}\n', "not a nanoengine trace (line 1 is not a trace header)"),
        ('[1, 2, 3]\n', "not a nanoengine trace"),
        ('{"type": "header", "schema_version": 99}\n', "schema_version 99, newer than this nanoengine reads (4)"),
        ('{"type": "header", "schema_version": "one"}\n', "unknown trace schema_version"),
    ],
)
def test_bad_files_give_one_line_errors(tmp_path, content, expected):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    assert expected in load_error(path)


def test_missing_file_folder_and_binary_file(tmp_path):
    assert "no such trace file" in load_error(tmp_path / "nope.jsonl")
    assert "is a folder" in load_error(tmp_path)
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\x00garbage")
    assert "not UTF-8" in load_error(tmp_path / "bin.jsonl")


def test_a_damaged_middle_line_is_an_error(tiny_trace_path, tmp_path):
    lines = lines_of(tiny_trace_path)
    lines[3] = lines[3][:40]
    message = load_error(write(tmp_path / "t.jsonl", lines))
    assert "line 4 is not valid JSON" in message and "damaged" in message


def test_a_cut_short_last_line_loads_the_prefix_with_a_warning(tiny_trace_path, tmp_path):
    text = tiny_trace_path.read_text()
    cut = tmp_path / "cut.jsonl"
    cut.write_text(text[: text.rindex("\n", 0, len(text) - 1) + 200])  # mid-way through the last line
    trace = load_trace(cut)
    full = load_trace(tiny_trace_path)
    assert trace.num_steps == full.num_steps - 1 and list(trace.steps) == full.steps[:-1]
    assert "cut short" in trace.warning and f"{trace.num_steps} complete steps" in trace.warning
    assert check_trace(trace) == [v for v in check_trace(full) if v.step < trace.num_steps]


def test_a_cut_short_header_is_an_error(tiny_trace_path, tmp_path):
    cut = tmp_path / "cut.jsonl"
    cut.write_text(tiny_trace_path.read_text()[:50])
    assert "line 1 is not JSON" in load_error(cut)


def test_schema_errors_name_the_line_and_field(tiny_trace_path, tmp_path):
    path = edit_step(tiny_trace_path, tmp_path, 0, lambda s: s["seqs"][0].update(status_after="SLEEPING"))
    message = load_error(path)
    assert "line 2 does not match the trace schema" in message and "seqs/0/status_after" in message


def test_a_missing_field_in_any_step_is_caught_without_full_validation(tiny_trace_path, tmp_path):
    path = edit_step(tiny_trace_path, tmp_path, 5, lambda s: s["inputs"].pop("slot_mapping"))
    assert "line 7 does not match the trace schema: inputs lacks slot_mapping" in load_error(path)
    path = edit_step(tiny_trace_path, tmp_path, 5, lambda s: s["seqs"][1].pop("block_table"))
    assert "seqs/1 lacks block_table" in load_error(path)


def test_a_wrong_type_in_a_middle_step_is_caught_by_full_validation(tiny_trace_path, tmp_path):
    path = edit_step(tiny_trace_path, tmp_path, 5, lambda s: s["inputs"].update(positions=["x"]))
    load_trace(path)  # the default sample skips middle steps
    assert "line 7 does not match the trace schema" in load_error(path, validate="all")


def test_step_numbers_must_rise(tiny_trace_path, tmp_path):
    lines = lines_of(tiny_trace_path)
    lines[2], lines[3] = lines[3], lines[2]
    assert "step numbers must rise" in load_error(write(tmp_path / "t.jsonl", lines))


def test_a_header_in_place_of_a_step_is_an_error(tiny_trace_path, tmp_path):
    lines = lines_of(tiny_trace_path)
    lines.insert(2, lines[0])
    assert "line 3 is not a step line" in load_error(write(tmp_path / "t.jsonl", lines))


def test_ten_thousand_steps_load_with_their_marks(tiny_trace_path, tmp_path):
    lines = lines_of(tiny_trace_path)
    steps = [json.loads(line) for line in lines[1:]]
    out = [lines[0]]
    for n in range(10_000):
        step = steps[n % len(steps)]
        step["step"] = n
        out.append(json.dumps(step))
    path = write(tmp_path / "big.jsonl", out)
    trace = load_trace(path)  # its speed is measured by `python -m tracer.bench.tui` (first frame), not here
    assert trace.num_steps == 10_000
    assert [m.step for m in trace.marks] == list(range(10_000))
    assert trace.marks[5].kinds == frozenset(e["kind"] for e in steps[5]["events"])


V1_TRACE = Path(__file__).parents[1] / "data" / "trace_v1.jsonl"


def test_a_version_1_trace_still_loads_and_checks_clean():
    """tests/data/trace_v1.jsonl was written by the version-1 recorder (no eos ids, tokenizer, queues or
    requested_step): it loads against today's schema, and every invariant that needs a version-2 field is
    skipped rather than fired."""
    trace = load_trace(V1_TRACE, validate="all")
    assert trace.header["schema_version"] == 1 and "queues" not in trace.steps[0]
    assert trace.num_steps > 10 and check_trace(trace) == []
