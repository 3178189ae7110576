"""Traces that load but hold odd values: the reader, `check` and the replay answer in one line
naming the line and the field, never with a traceback or a Textual crash dump."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import one_line_error

from tracer.cli.main import main
from tracer.replay.app import ReplayApp, run_replay
from tracer.trace.trace_file import TraceError, check_step, load_trace

TRACE = Path(__file__).parents[1] / "data" / "replay_small.jsonl"  # 14 steps, 16 KV blocks
BAD_LINE = 8  # step index 6


def planted(tmp_path: Path, change: Callable[[dict], None], line: int = BAD_LINE) -> Path:
    lines = TRACE.read_text().splitlines()
    step = json.loads(lines[line - 1])
    change(step)
    lines[line - 1] = json.dumps(step)
    path = tmp_path / "odd.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


CONTAINERS = {
    "seqs as an object": (lambda s: s.__setitem__("seqs", {}), "seqs is dict, not a list"),
    "events as a string": (lambda s: s.__setitem__("events", "x"), "events is str, not a list"),
    "an event kind that is a list": (lambda s: s["events"].append({"kind": [], "seq_id": 0, "detail": {}}), "kind"),
    "pool as a list": (lambda s: s.__setitem__("pool", []), "pool is list, not an object"),
    "new_requests of numbers": (lambda s: s.__setitem__("new_requests", [1]), "new_requests/0"),
}


@pytest.mark.parametrize("change, message", CONTAINERS.values(), ids=CONTAINERS.keys())
def test_odd_containers_are_refused_at_load_and_by_check(tmp_path, capsys, change, message):
    path = planted(tmp_path, change)
    with pytest.raises(TraceError, match=f"line {BAD_LINE} does not match the trace schema: .*{message}"):
        load_trace(path)
    assert main(["check", str(path)]) == 2
    assert message in one_line_error(capsys.readouterr().err)


ODD_VALUES = {
    "status EXPLODED": (lambda s: s["seqs"][0].__setitem__("status_after", "EXPLODED"), "EXPLODED"),
    "a status that is markup": (lambda s: s["seqs"][0].__setitem__("status_after", "[/x]"), "'[/x]'"),
    "block_size 0": (lambda s: s["pool"].__setitem__("block_size", 0), "block_size"),
    "ref_counts null": (lambda s: s["pool"].__setitem__("ref_counts", None), "ref_counts"),
    "a token that is a string": (lambda s: s["inputs"].__setitem__("input_ids", ["x"]), "input_ids"),
    "owners for 1 block": (lambda s: s["pool"].__setitem__("owners", [[0]]), "pool/owners has 1 entries for 16"),
    "a block id past the pool": (lambda s: s["seqs"][0].__setitem__("block_table_after", [10**9]), "block id"),
}


@pytest.mark.parametrize("change, message", ODD_VALUES.values(), ids=ODD_VALUES.keys())
def test_a_step_with_odd_values_is_named_by_check_step(tmp_path, change, message):
    trace = load_trace(planted(tmp_path, change))  # loads: the values are checked when the step is shown
    with pytest.raises(TraceError, match=f"line {BAD_LINE} does not match the trace schema") as info:
        check_step(trace, BAD_LINE - 2)
    assert message in str(info.value) and "\n" not in str(info.value)
    check_step(trace, BAD_LINE - 3)  # its neighbour is fine


@pytest.mark.parametrize("change, message", ODD_VALUES.values(), ids=ODD_VALUES.keys())
def test_the_replay_refuses_to_open_at_an_odd_step_in_one_line(tmp_path, capsys, change, message):
    path = planted(tmp_path, change)
    assert run_replay(path, start_step=BAD_LINE - 2) == 2
    err = one_line_error(capsys.readouterr().err)
    assert f"line {BAD_LINE}" in err and message in err


@pytest.mark.parametrize("change, message", ODD_VALUES.values(), ids=ODD_VALUES.keys())
def test_the_replay_stays_on_the_last_good_step_and_says_why(tmp_path, change, message):
    trace = load_trace(planted(tmp_path, change))
    notes: list[str] = []

    async def walk() -> None:
        app = ReplayApp(trace, animations=False)
        shown = app.notify
        app.notify = lambda text, **kw: (notes.append(str(text)), shown(text, **kw))[1]  # type: ignore[method-assign]
        async with app.run_test(size=(100, 30)) as pilot:
            for _ in range(10):
                await pilot.press("right")
            assert app.step_index == BAD_LINE - 3  # could not move onto the odd step
            await pilot.press("end")  # jumping past it works: its neighbours are fine
            assert app.step_index == trace.num_steps - 1
        assert app.return_code in (None, 0) and app.failure is None

    asyncio.run(walk())
    assert notes and all(f"line {BAD_LINE}" in note and message in note for note in notes)


def test_check_never_tracebacks_on_a_value_the_sampled_schema_check_skips(tmp_path, capsys):
    path = planted(tmp_path, lambda s: s["pool"].__setitem__("ref_counts", None))
    assert main(["check", str(path)]) == 1  # the checker reports the malformed step as violations
    assert "Traceback" not in capsys.readouterr().err


def test_deeply_nested_json_is_refused_in_one_line(tmp_path, capsys):
    lines = TRACE.read_text().splitlines()
    lines[BAD_LINE - 1] = "[" * 100_000 + "]" * 100_000
    path = tmp_path / "deep.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=f"line {BAD_LINE} is nested too deeply"):
        load_trace(path)
    assert main(["check", str(path)]) == 2
    assert "nested too deeply" in one_line_error(capsys.readouterr().err)
    (tmp_path / "deep-header.jsonl").write_text("{" * 0 + "[" * 100_000 + "\n")
    assert main(["check", str(tmp_path / "deep-header.jsonl")]) == 2
    one_line_error(capsys.readouterr().err)


def test_a_damaged_line_deep_in_a_lazily_read_trace_is_one_line(tmp_path, capsys):
    path = planted(tmp_path, lambda s: s["seqs"][0].__setitem__("status_after", "EXPLODED"))
    trace = load_trace(path, lazy=True)
    with pytest.raises(TraceError, match=f"line {BAD_LINE}.*EXPLODED"):
        check_step(trace, BAD_LINE - 2)
    text = path.read_text().splitlines()
    # Damage inside the long seqs part, which the lazy scan skips: found only when the step is read.
    text[BAD_LINE - 1] = text[BAD_LINE - 1].replace('"num_prompt_tokens": ', '"num_prompt_tokens": #', 1)
    path.write_text("\n".join(text) + "\n")
    trace = load_trace(path, lazy=True)
    with pytest.raises(TraceError, match=f"line {BAD_LINE} is not valid JSON"):
        check_step(trace, BAD_LINE - 2)
