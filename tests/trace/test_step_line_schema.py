"""schema.json and tracer/trace/step_line.py name the same step-line fields, and a recorded trace
writes exactly those (nothing the module does not name, every field it requires)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import fields

import pytest

from nanoengine.step_record import SeqStep
from tracer.trace.step_line import (
    EngineRow,
    EventLine,
    InputsLine,
    PoolChange,
    PoolLine,
    QueuesLine,
    SeqRow,
    StepLine,
    ViolationLine,
)
from tracer.trace.trace_file import SCHEMA_PATH

SHAPES = {
    "step": StepLine,
    "seq": SeqRow,
    "event": EventLine,
    "inputs": InputsLine,
    "pool": PoolLine,
    "pool_change": PoolChange,
    "queues": QueuesLine,
    "violation": ViolationLine,
}
# where the step definition refers to each of the others (a version-4 change line's pool: pool_change)
STEP_REFS = {
    "seqs": ["seq"],
    "events": ["event"],
    "inputs": ["inputs"],
    "pool": ["pool", "pool_change"],
    "queues": ["queues"],
    "violations": ["violation"],
}


def schema_defs() -> dict:
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))["$defs"]


@pytest.mark.parametrize("name", SHAPES)
def test_the_schema_and_the_module_name_the_same_fields(name):
    definition, shape = schema_defs()[name], SHAPES[name]
    assert set(definition["properties"]) == set(shape.__annotations__), name
    assert set(definition["required"]) == shape.__required_keys__, name


def test_the_step_refers_to_the_definitions_the_module_pairs_with_its_shapes():
    properties = schema_defs()["step"]["properties"]
    for key, names in STEP_REFS.items():
        definition = properties[key].get("items", properties[key])
        refs = [d["$ref"] for d in definition.get("anyOf", [definition])]
        assert refs == [f"#/$defs/{name}" for name in names], key


def test_a_row_holds_every_field_nanoengine_reports_in_its_order():
    """engine_row reads the SeqStep by these names, and a row's bytes follow their order."""
    assert tuple(EngineRow.__annotations__) == tuple(f.name for f in fields(SeqStep))


def keys_beyond(obj: dict, shape) -> set[str]:
    return set(obj) - set(shape.__annotations__)


def test_a_recorded_trace_validates_and_writes_the_named_fields_in_the_builders_order(tiny_trace):
    assert tiny_trace.num_steps > 5  # loaded with validate="all": every line against the schema
    for step in tiny_trace.steps:
        assert not keys_beyond(step, StepLine) and StepLine.__required_keys__ <= set(step)
        assert "queues" in step and set(step["queues"]) == set(QueuesLine.__annotations__)
        assert not keys_beyond(step["inputs"], InputsLine) and "input_texts" in step["inputs"]
        assert set(step["pool"]) == set(PoolLine.__annotations__)  # with the layout
        for row in step["seqs"]:  # the optional fields (request_id, new_token_logprobs) only where they apply
            assert tuple(row) == tuple(name for name in SeqRow.__annotations__ if name in row)
            assert SeqRow.__required_keys__ | {"num_scheduled_tokens_after"} <= set(row)
        for event in step["events"]:
            assert not keys_beyond(event, EventLine) and EventLine.__required_keys__ <= set(event)


def test_the_module_imports_neither_torch_nor_the_engine():
    """vLLM's recorder writes with it in a venv without nanoengine's dependencies."""
    code = (
        "import sys, tracer.trace.step_line;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'nanoengine')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
