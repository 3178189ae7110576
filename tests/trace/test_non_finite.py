"""JSON has no NaN or Infinity, though Python's json reads and writes them: a trace holding one is
refused in one line by every reader, the recorder never writes one, every JSON the project writes
says allow_nan=False, and a Perfetto export keeps its timestamps and thread ids in range."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest
from conftest import SCENARIO_PARAMS, make_tiny_engine, one_line_error

from tracer.cli.main import main
from tracer.trace.recorder import TraceRecorder
from tracer.trace.trace_file import load_trace

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "tests" / "data" / "replay_small.jsonl"  # 14 steps
MIDDLE_LINE = 8  # outside the schema check's sample: the reader itself must refuse it


def with_text(tmp_path: Path, old: str, new: str, line: int = MIDDLE_LINE) -> Path:
    """The small trace with one step's text edited (json.dumps cannot write what is planted here)."""
    lines = TRACE.read_text().splitlines()
    assert old in lines[line - 1]
    lines[line - 1] = lines[line - 1].replace(old, new, 1)
    path = tmp_path / "planted.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def wall_time_text(line: int = MIDDLE_LINE) -> str:
    step = json.loads(TRACE.read_text().splitlines()[line - 1])
    return f'"wall_time":{json.dumps(step["wall_time"])}'


@pytest.mark.parametrize("number", ["Infinity", "-Infinity", "NaN", "1e999"])
def test_check_refuses_a_number_json_does_not_have(tmp_path, capsys, number):
    path = with_text(tmp_path, wall_time_text(), f'"wall_time":{number}')
    assert main(["check", str(path)]) == 2
    error = one_line_error(capsys.readouterr().err)
    assert f"line {MIDDLE_LINE} holds the number {number}" in error


def test_check_refuses_nan_model_time_anywhere(tmp_path, capsys):
    step = json.loads(TRACE.read_text().splitlines()[MIDDLE_LINE - 1])
    path = with_text(tmp_path, f'"model_time":{json.dumps(step["model_time"])}', '"model_time":NaN')
    assert main(["check", str(path)]) == 2
    assert "NaN" in one_line_error(capsys.readouterr().err)


def test_export_perfetto_refuses_infinity_in_one_line(tmp_path, capsys):
    path = with_text(tmp_path, wall_time_text(), '"wall_time":Infinity')
    out = tmp_path / "t.json"
    assert main(["export", str(path), "--perfetto", str(out)]) == 2
    assert "Infinity" in one_line_error(capsys.readouterr().err) and not out.exists()


def test_perfetto_timestamps_and_thread_ids_stay_in_range(tmp_path, capsys):
    path = with_text(tmp_path, wall_time_text(), '"wall_time":1e300')
    out = tmp_path / "t.json"
    assert main(["export", str(path), "--perfetto", str(out)]) == 2
    assert "wall_time 1e+300" in one_line_error(capsys.readouterr().err) and not out.exists()
    lines = TRACE.read_text().splitlines()
    big = 2**40
    path.write_text("\n".join(line.replace('"seq_id":0,', f'"seq_id":{big},') for line in lines) + "\n")
    assert main(["export", str(path), "--perfetto", str(out)]) == 2
    assert f"seq_id {big}" in one_line_error(capsys.readouterr().err) and not out.exists()


def test_the_recorder_never_writes_nan(tmp_path, one_torch_thread):
    """A step whose time is NaN (a broken clock, a hook that changed it) stops the recording (the
    engine's step goes on) instead of writing a line that is not JSON; the lines before it still load."""
    engine = make_tiny_engine()
    path = tmp_path / "t.jsonl"
    steps = []

    def break_the_clock(record):
        steps.append(record.step)
        if len(steps) == 3:
            object.__setattr__(record, "model_time", math.nan)  # a frozen record, as a broken clock would fill it

    engine.add_step_hook(break_the_clock)  # runs before the recorder's hook
    with pytest.raises(OSError, match="recording the trace stopped: ValueError: .* not JSON compliant"):
        with TraceRecorder(engine, path) as recorder:
            engine.add_request("hello world", SCENARIO_PARAMS)
            for _ in range(4):
                engine.step()
    assert "not JSON compliant" in (recorder.failed or "") and len(steps) == 4
    assert "NaN" not in path.read_text()
    assert load_trace(path, validate="all").num_steps == 2


def json_writes_without_allow_nan_false(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            call = node.func
            if (
                isinstance(call.value, ast.Name)
                and call.value.id == "json"
                and call.attr in ("dump", "dumps", "JSONEncoder")
            ):
                allow = [k for k in node.keywords if k.arg == "allow_nan"]
                if not (allow and isinstance(allow[0].value, ast.Constant) and allow[0].value.value is False):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_every_json_the_project_writes_refuses_nan():
    files = sorted(p for folder in ("nanoengine", "tracer") for p in (ROOT / folder).rglob("*.py"))
    assert [where for path in files for where in json_writes_without_allow_nan_false(path)] == []


def test_orjson_writes_only_behind_the_recorders_check():
    """orjson writes NaN and Infinity as null instead of refusing them: only the recorder's
    encode_line may call it, after checking the line's floats (test_the_recorder_never_writes_nan)."""
    files = sorted(p for folder in ("nanoengine", "tracer") for p in (ROOT / folder).rglob("*.py"))
    users = [str(path.relative_to(ROOT)) for path in files if "orjson" in path.read_text(encoding="utf-8")]
    assert users == ["tracer/trace/recorder.py"]
    source = (ROOT / "tracer/trace/recorder.py").read_text(encoding="utf-8")
    assert source.count("orjson.dumps(") == 1
