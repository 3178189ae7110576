"""Which invariants run, in which order: the profiles `nanoengine check --profile` chooses from.

    nanoengine   every rule: correctness, nanoengine's own policy (policy.py) and the numbers its
                 decisions record (decisions.py); 49 rules
    correctness  what any paged-KV engine that preempts by recompute must keep: the counters,
                 the flat batch, the KV slots and what they hold, the blocks, the tokens and each
                 request's life, a beam search's beams (beams.py), the n samples of a request
                 (samples.py), without the policy; 39 rules
    vllm         for traces of vLLM v1's scheduler: every rule, vLLM's variant where the engines
                 differ on purpose, and vLLM's own two (vllm.py); 51 rules (the decisions' rules
                 skip events without their numbers, as vLLM's are)

A trace is checked with the profile of the engine that wrote it (its header's `engine`), unless
one is asked for. The order is the checking order, and so the order a step's violations are listed
in; the KV shadow (kv_content) sees every step in turn whatever the profile.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tracer.trace.invariants import (
    beams,
    blocks,
    counters,
    decisions,
    flat_batch,
    kv_slots,
    lifecycle,
    policy,
    samples,
    tokens,
    vllm,
)
from tracer.trace.invariants.rule import Rule, rules_in

CORRECTNESS: tuple[Rule, ...] = (
    *rules_in(counters),
    *rules_in(flat_batch),
    *rules_in(kv_slots),
    *rules_in(blocks),
    *rules_in(tokens),
    *rules_in(lifecycle),
    *rules_in(beams),
    *rules_in(samples)[:1],  # sample_params: the n samples are one request
)
# nanoengine's choices, and that a sample admitted after a sibling shares its prompt blocks (vLLM v1 too)
POLICY: tuple[Rule, ...] = rules_in(policy) + rules_in(samples)[1:]
DECISIONS: tuple[Rule, ...] = rules_in(decisions)  # the numbers a decision records (trace schema 3)


def with_variants(rules: tuple[Rule, ...], engine: tuple[Rule, ...]) -> tuple[Rule, ...]:
    """rules with an engine's variants in their place, then the engine's own rules."""
    variants = {rule.name: rule for rule in engine}
    names = {rule.name for rule in rules}
    return tuple(variants.get(r.name, r) for r in rules) + tuple(r for r in engine if r.name not in names)


PROFILES: dict[str, tuple[Rule, ...]] = {
    "nanoengine": CORRECTNESS + POLICY + DECISIONS,
    "correctness": CORRECTNESS,
    "vllm": with_variants(CORRECTNESS + POLICY + DECISIONS, rules_in(vllm)),
}
DEFAULT_PROFILE = "nanoengine"

# name -> what must hold, for nanoengine's rules (the trace viewer and `nanoengine check --list` show these)
INVARIANTS: dict[str, str] = {rule.name: rule.text for rule in PROFILES[DEFAULT_PROFILE]}


def rules_of(profile: str) -> tuple[Rule, ...]:
    try:
        return PROFILES[profile]
    except KeyError:
        raise ValueError(f"unknown invariant profile {profile!r}; choose one of {', '.join(PROFILES)}") from None


def profile_for(header: Mapping[str, Any]) -> str:
    """The profile of the engine that wrote a trace: its header's `engine` ("vllm 0.33.0"), else
    nanoengine."""
    engine = str(header.get("engine") or DEFAULT_PROFILE).split()[0]
    return engine if engine in PROFILES else DEFAULT_PROFILE
