"""Each event kind is spelled once, in nanoengine.sequence.EventKind; everything else imports it."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from nanoengine.sequence import EventKind
from tracer.trace.trace_file import SCHEMA_PATH

ROOT = Path(__file__).resolve().parents[2]
KINDS = {kind.value for kind in EventKind}
HOME = ROOT / "nanoengine" / "sequence.py"  # where the enum spells them
# Runs in vLLM's own Python, which must not import nanoengine; the schema's enum checks the kinds
# it writes whenever its traces are loaded.
EXEMPT = {ROOT / "tracer" / "vllm" / "record.py"}


def spelled_kinds(source: str, where: str) -> list[str]:
    """Every string constant in the code that equals an event kind (docstrings and comments never
    equal one; the invariant named prefix_hit is named by its function, not by a string)."""
    return [
        f"{where}:{node.lineno}: {node.value!r}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and node.value in KINDS
    ]


def test_no_event_kind_is_spelled_outside_the_enum():
    files = sorted(
        p for folder in ("nanoengine", "tracer") for p in (ROOT / folder).rglob("*.py") if p != HOME and p not in EXEMPT
    )
    found = [hit for p in files for hit in spelled_kinds(p.read_text(encoding="utf-8"), str(p.relative_to(ROOT)))]
    assert not found, "event kinds spelled as strings; use nanoengine.sequence.EventKind:\n" + "\n".join(found)


def test_the_finder_sees_a_spelled_kind():
    source = '"""A docstring about preempted requests."""\n\n\ndef f(e):\n    return e["kind"] == "preempted"\n'
    assert spelled_kinds(source, "planted.py") == ["planted.py:5: 'preempted'"]


def test_the_schema_lists_exactly_the_event_kinds():
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    assert schema["$defs"]["event"]["properties"]["kind"]["enum"] == [kind.value for kind in EventKind]


def test_an_event_kind_writes_and_prints_as_its_plain_value():
    assert json.dumps({"kind": EventKind.PREEMPTED}) == '{"kind": "preempted"}'
    assert f"{EventKind.PREFIX_HIT}" == "prefix_hit" == EventKind.PREFIX_HIT
    assert {"prefix_hit": 1}[EventKind.PREFIX_HIT] == 1
