"""An invariant: a name, one English line (N_-marked: shown_text(rule) gives it in the reader's
language), and a function that finds where a step breaks it.

    @invariant("seq_lens == num_cached_tokens + num_scheduled_tokens")
    def seq_lens(ctx: Context) -> Findings:
        ...
        yield seq_id, "seq 3 has seq_len 9 but ..."

The function's name is the invariant's name: it is written once. An engine's own variant of a
rule says the name it stands in for (`@invariant("...", name="free_blocks")`, see vllm.py). A
rule yields (seq_id or None, message) pairs; the checker turns each into a Violation carrying the
rule's name and the step.

Where the checker can tell, a rule also says which engine functions make what it checks
(`checks=("Scheduler.preempt",)`, names from the engine's one table of its decision functions,
tracer/trace/decisions.py, refused at import when the table has no such name: the replay's code
panel shows the first the trace holds) and which sequence field a violation
is about (`field="num_cached_tokens"`: the replay marks that cell of the sequence's row).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from tracer.i18n import _
from tracer.trace.decisions import decision_named
from tracer.trace.kv_shadow import KvShadow
from tracer.trace.step_line import ViolationLine

Findings = Iterator[tuple[int | None, str]]


@dataclass(frozen=True, slots=True)
class Violation:
    step: int
    seq_id: int | None
    invariant: str
    message: str

    def to_dict(self) -> ViolationLine:
        return {"step": self.step, "seq_id": self.seq_id, "invariant": self.invariant, "message": self.message}

    @classmethod
    def from_dict(cls, d: dict) -> Violation:
        return cls(d["step"], d.get("seq_id"), d["invariant"], d["message"])


@dataclass(slots=True)
class Context:
    """One step, with its sequences indexed, handed to every rule."""

    step: Mapping[str, Any]
    seqs: dict[int, dict]
    batch: list[int]  # seq_ids in batch order
    block_size: int
    config: dict
    prev: dict[int, dict] | None  # previous step's sequences by id
    tokens: dict[int, list[int]]  # each sequence's tokens before this step
    memo: dict  # results a rule may reuse while its inputs are unchanged
    kv: KvShadow  # what each KV slot holds, across steps
    params: dict[int, dict]  # each request's sampling params, where known
    eos_token_ids: frozenset[int] | None  # None: unknown (a version-1 trace or a bare record)
    preempted_before: list[int] | None  # sequences the previous step preempted, in order; None: no previous


Find = Callable[[Context], Findings]


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    text: str  # what must hold, one line: `nanoengine check --list` and the trace viewer show it
    find: Find
    checks: tuple[str, ...] = ()  # the engine functions whose work it checks, when one can tell
    field: str = ""  # the sequence row's field a violation is about, when there is one

    @property
    def concern(self) -> str:
        """The file it is written in: counters ... lifecycle (correctness), policy, vllm."""
        return self.find.__module__.rsplit(".", 1)[-1]


REGISTRY: list[Rule] = []  # every rule defined, in definition order


def invariant(
    text: str, name: str | None = None, *, checks: tuple[str, ...] = (), field: str = ""
) -> Callable[[Find], Find]:
    """Register the decorated function as the invariant named after it (or `name`, for an
    engine's variant of a rule)."""

    for function in checks:
        decision_named(function)  # a KeyError for a name the engine's table does not have

    def register(find: Find) -> Find:
        rule = Rule(name or find.__name__, text, find, checks, field)
        if any(r.name == rule.name and r.concern == rule.concern for r in REGISTRY):
            raise ValueError(f"invariant {rule.name!r} is defined twice in {rule.concern}.py")
        REGISTRY.append(rule)
        return find

    return register


def rules_in(module: ModuleType) -> tuple[Rule, ...]:
    """The rules a module defines, in the order it defines them."""
    return tuple(rule for rule in REGISTRY if rule.find.__module__ == module.__name__)


def shown_text(rule: Rule) -> str:
    """The rule's line in the reader's language: the trace and the code keep the English one (each
    invariant marks its text with N_), the catalog translates it when it is shown."""
    return _(rule.text)


def rule_named(name: str) -> Rule | None:
    """The first rule registered under name (an engine's variant comes after the rule it stands for)."""
    return next((rule for rule in REGISTRY if rule.name == name), None)
