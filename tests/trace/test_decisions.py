"""tracer/trace/decisions.py is the one table of the engine's decision functions: it must name
functions the engine has, and every function that emits an event must be in it (the trace records
those functions' source and the replay shows them)."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

from tracer.replay.glossary import GLOSSARY, function_names
from tracer.teach.swap import SWAPPABLE
from tracer.trace.decisions import DECISIONS, SCHEDULES_TOKENS, decision_named
from tracer.trace.invariants.rule import REGISTRY
from tracer.trace.sources import ENGINE_FUNCTIONS

ENGINE = Path(__file__).resolve().parents[2] / "nanoengine"


def function_of(qualname: str, module: str):
    owner = importlib.import_module(module)
    for part in qualname.split("."):
        owner = getattr(owner, part)
    return owner


@pytest.mark.parametrize("qualname", sorted(DECISIONS))
def test_each_entry_names_a_function_of_its_module(qualname):
    fn = function_of(qualname, DECISIONS[qualname].module)
    assert callable(fn) and fn.__qualname__ == qualname


def emitting_functions() -> set[str]:
    """Qualified names of the engine functions whose body calls add_event."""
    found = set()
    for path in ENGINE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for cls in [None, *[n for n in tree.body if isinstance(n, ast.ClassDef)]]:
            body = tree.body if cls is None else cls.body
            for fn in (n for n in body if isinstance(n, ast.FunctionDef)):
                calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
                if fn.name != "add_event" and any(c.func.attr == "add_event" for c in calls):
                    found.add(fn.name if cls is None else f"{cls.name}.{fn.name}")
    return found


def test_every_function_that_emits_an_event_is_in_the_table():
    emitting = emitting_functions()
    assert {"Scheduler.preempt", "Scheduler.try_admit", "LLMEngine.fail"} <= emitting
    assert emitting <= set(DECISIONS), emitting - set(DECISIONS)


def test_the_tracer_tables_are_derived_from_the_table():
    assert set(ENGINE_FUNCTIONS) == set(DECISIONS)
    assert set(SWAPPABLE) == {name for name, d in DECISIONS.items() if d.swappable}
    assert (
        SCHEDULES_TOKENS in DECISIONS and DECISIONS[SCHEDULES_TOKENS].module == DECISIONS["Scheduler.schedule"].module
    )
    running_loop = inspect.getsource(function_of("Scheduler.schedule", DECISIONS["Scheduler.schedule"].module))
    assert running_loop.count(SCHEDULES_TOKENS.rsplit(".", 1)[-1] + "(") == 1  # the line a step without events marks
    for rule in REGISTRY:
        for name in rule.checks:
            decision_named(name)


def test_an_invariant_that_names_an_unknown_function_is_refused_at_import():
    from tracer.trace.invariants.rule import invariant

    with pytest.raises(KeyError, match="Scheduler.prempt"):
        invariant("typo", checks=("Scheduler.prempt",))


def test_the_glossary_names_only_engine_functions_the_table_has():
    named = {n for term in GLOSSARY for n in function_names(term.ours) if "(" not in n and n[:1].isalpha()}
    functions = {n for n in named if n.split(".")[-1][:1].islower() and not n.startswith("num_")}
    entry_points = {"LLMEngine.step"}  # the step's spine, shown by name only
    names_of_data = {"block_table", "query_start_loc", "seq_lens", "positions", "slot_mapping", "logits_indices"}
    names_of_data.add("kv_cache_dtype")  # an EngineConfig field
    unknown = functions - set(DECISIONS) - entry_points - names_of_data - {"hash_to_block"}
    assert not unknown, unknown
