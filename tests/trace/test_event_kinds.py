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


def invariant_names(tree: ast.AST) -> set[int]:
    """ids of the string constants that name an invariant (the invariant "prefix_hit" is no event)."""
    named = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if func in ("invariant", "check", "violation"):
                named.add(id(node.args[0]))
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "INVARIANTS":
            named.update(id(key) for key in getattr(node.value, "keys", ()))
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "INVARIANTS":
            named.update(id(key) for key in getattr(node.value, "keys", ()))
    return named


def spelled_kinds(source: str, where: str) -> list[str]:
    tree = ast.parse(source)
    skip = invariant_names(tree)
    return [
        f"{where}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in KINDS and id(node) not in skip
    ]


def test_no_event_kind_is_spelled_outside_the_enum():
    files = sorted(
        p for folder in ("nanoengine", "tracer") for p in (ROOT / folder).rglob("*.py") if p != HOME and p not in EXEMPT
    )
    found = [hit for p in files for hit in spelled_kinds(p.read_text(encoding="utf-8"), str(p.relative_to(ROOT)))]
    assert not found, "event kinds spelled as strings; use nanoengine.sequence.EventKind:\n" + "\n".join(found)


def test_the_finder_sees_a_spelled_kind_but_not_an_invariant_name():
    source = 'def f(e):\n    return e["kind"] == "preempted"\n\n\n@invariant("prefix_hit", "...")\ndef g(): ...\n'
    assert spelled_kinds(source, "planted.py") == ["planted.py:2: 'preempted'"]


def test_the_schema_lists_exactly_the_event_kinds():
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    assert schema["$defs"]["event"]["properties"]["kind"]["enum"] == [kind.value for kind in EventKind]


def test_an_event_kind_writes_and_prints_as_its_plain_value():
    assert json.dumps({"kind": EventKind.PREEMPTED}) == '{"kind": "preempted"}'
    assert f"{EventKind.PREFIX_HIT}" == "prefix_hit" == EventKind.PREFIX_HIT
    assert {"prefix_hit": 1}[EventKind.PREFIX_HIT] == 1
