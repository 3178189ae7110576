"""How invariants are written: each is named once (by its function), registered with one English
line, and belongs to one profile set; `nanoengine check --profile` picks the set."""

from __future__ import annotations

import pytest

from tracer.cli.main import main
from tracer.trace.invariants import CORRECTNESS, DECISIONS, INVARIANTS, POLICY, PROFILES
from tracer.trace.invariants import vllm as vllm_rules
from tracer.trace.invariants.flat_batch import seq_lens
from tracer.trace.invariants.rule import REGISTRY, invariant, rules_in

POLICY_NAMES = {
    "victim_policy",
    "preempted_to_head",
    "admission_order",
    "eos_finish",
    "abort_step",
    "sample_prefix_share",
}
DECISION_NAMES = {"chunk_budget", "chunk_size", "admission_blocks", "preemption_need"}


def test_every_rule_is_named_by_its_function_and_says_what_must_hold():
    assert len(INVARIANTS) == 49
    for rule in REGISTRY:
        assert rule.text and "\n" not in rule.text
        if rule.concern != "vllm":
            assert rule.name == rule.find.__name__ and INVARIANTS[rule.name] == rule.text
    for name, rules in PROFILES.items():
        names = [rule.name for rule in rules]
        assert len(names) == len(set(names)), f"{name} holds a rule twice"


def test_a_name_cannot_be_registered_twice():
    with pytest.raises(ValueError, match="'seq_lens' is defined twice in flat_batch.py"):
        invariant("seq_lens again")(seq_lens)
    assert [r.text for r in REGISTRY if r.name == "seq_lens"] == [
        "seq_lens == num_cached_tokens + num_scheduled_tokens"
    ]


def test_the_vllm_profile_swaps_in_vllms_variants_and_adds_its_own_rules():
    vllm = {rule.name: rule for rule in PROFILES["vllm"]}
    assert set(vllm) == set(INVARIANTS) | {"no_admission_after_preemption", "finished_ids_next_step"}
    swapped = {name for name, rule in vllm.items() if rule.concern == "vllm" and name in INVARIANTS}
    assert swapped == {"free_blocks", "shared_block_write", "unique_prefix_hash"}
    assert len(rules_in(vllm_rules)) == 5


def test_the_correctness_set_leaves_out_exactly_the_policy_rules():
    assert {rule.name for rule in POLICY} == POLICY_NAMES
    assert not {rule.name for rule in CORRECTNESS} & POLICY_NAMES
    assert PROFILES["correctness"] == CORRECTNESS
    assert {rule.name for rule in DECISIONS} == DECISION_NAMES
    assert not {rule.name for rule in CORRECTNESS} & DECISION_NAMES
    assert PROFILES["nanoengine"] == CORRECTNESS + POLICY + DECISIONS
    names = [rule.name for rule in CORRECTNESS]
    assert names.index("slot_mapping") < names.index("kv_content")  # the explicit order holds


def test_check_list_shows_the_chosen_profile(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    assert main(["check", "--list", "--profile", "correctness"]) == 0
    out = capsys.readouterr().out
    assert "39 invariants (correctness)" in out and "kv_content" in out and "kv_slots" in out
    assert not any(name in out for name in POLICY_NAMES)
    assert main(["check", "--list"]) == 0
    out = capsys.readouterr().out
    assert "49 invariants (nanoengine)" in out and all(name in out for name in POLICY_NAMES)
    with pytest.raises(SystemExit) as info:
        main(["check", "--list", "--profile", "bogus"])
    assert info.value.code == 2 and "unknown --profile 'bogus'" in capsys.readouterr().err
