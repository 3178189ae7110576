"""Plant a real engine bug (one per test), run random tiny-model workloads, and see the checker name it.

The trace mutations in test_invariants.py break a recorded step by hand; here the *engine* is
broken (a patch of tests/trace/engine_bugs.py planted into the engine's current function with
tracer.teach.plant, plugged in with tracer.teach.swap) and the recorder's live
checker must notice from the step records alone. For each workload the test also watches the
engine's own state for the moment the bug actually bites (not every workload exercises it: a
preemption needs a full pool, a stale hash needs an eviction and a later prefix hit), and asserts

    the bug bit  ->  the checker named one of the bug's invariants
    it did not   ->  the checker stayed silent (the bug's dormant path raises no false alarm)

Across the examples each bug must have bitten a few times, so the test cannot pass vacuously.
NANOENGINE_MUTATION_EXAMPLES sets the workloads per bug (default 12: a few seconds each).
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import BUSY_OPTIONS, BUSY_REQUESTS, drive
from engine_bugs import BUGS, Bug
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nanoengine.block_manager import BlockManager, blocks_needed
from nanoengine.engine import LLMEngine
from nanoengine.model_runner import compute_slot_mapping
from nanoengine.scheduler import Scheduler
from tracer.teach.plant import planted
from tracer.teach.swap import original, plugged
from tracer.trace.recorder import TraceRecorder

NUM_EXAMPLES = int(os.environ.get("NANOENGINE_MUTATION_EXAMPLES", "12"))
MAX_STEPS = 400
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@dataclass(frozen=True, slots=True)
class Workload:
    options: dict
    requests: tuple[tuple[str, int, int], ...]  # (prompt, max_tokens, arrival step)


@st.composite
def workloads(draw) -> Workload:
    """Prompts sharing a prefix (prefix hits, exact repeats), arriving over a few steps, in a small pool."""
    block_size = draw(st.integers(2, 4))
    base = draw(st.text(alphabet="ab", min_size=2, max_size=12))
    reqs = [("q" * draw(st.integers(1, 6)), 30, 0)]  # a long decode, in the batch for most of the run
    for _ in range(draw(st.integers(3, 6))):
        cut = draw(st.one_of(st.just(len(base)), st.integers(1, len(base))))
        prompt = base[:cut] + draw(st.text(alphabet="xyz", max_size=4))
        reqs.append((prompt, draw(st.integers(2, 10)), draw(st.integers(0, 6))))
    need = max(blocks_needed(len(p) + n, block_size) for p, n, _ in reqs)
    options = dict(
        block_size=block_size,
        num_kv_blocks=need + draw(st.integers(0, 3)),  # tight: preemption and eviction
        max_num_batched_tokens=draw(st.integers(4, 24)),
        max_num_seqs=draw(st.integers(3, 4)),
        enable_prefix_caching=True,
    )
    return Workload(options, tuple(reqs))


# ---- when each bug bites, seen from the engine's own state ----------------------------------------
class Bites:
    """Counts the moments a planted bug changes what the engine does."""

    def __init__(self) -> None:
        self.count = 0

    def watch(self, key: str, engine: LLMEngine, monkeypatch) -> dict:
        """Patches that count bites for this bug; returns the broken functions to plug in."""
        bug = BUGS[key]
        broken = planted(bug.patch)
        return getattr(self, key)(engine, broken, monkeypatch, bug)

    def stale_hash_entry(self, engine, broken, monkeypatch, bug: Bug) -> dict:
        use = BlockManager.use_cached_prefix

        def use_cached_prefix(bm, seq, block_ids, hashes):
            # A hit through an entry whose block has since been taken for other content.
            self.count += sum(bm.hashes[b] != h for b, h in zip(block_ids, hashes))
            use(bm, seq, block_ids, hashes)

        monkeypatch.setattr(BlockManager, "use_cached_prefix", use_cached_prefix)
        return {bug.target: broken}

    def stale_cached_count(self, engine, broken, monkeypatch, bug: Bug) -> dict:
        schedule = original("Scheduler.schedule")

        def watched(sched):
            out = schedule(sched)
            self.count += sum(s.num_cached_tokens > 0 for s in sched.waiting)  # KV counted, blocks gone
            return out

        return {bug.target: broken, "Scheduler.schedule": watched}

    def zero_length_query(self, engine, broken, monkeypatch, bug: Bug) -> dict:
        schedule = original("Scheduler.schedule")

        def watched(sched):
            out = schedule(sched)
            self.count += sum(s.num_scheduled_tokens == 0 for s in out.seqs)
            return out

        return {bug.target: broken, "Scheduler.schedule": watched}

    def slot_off_by_one_block(self, engine, broken, monkeypatch, bug: Bug) -> dict:
        def watched(block_tables, seq_index, positions, block_size):
            slots = broken(block_tables, seq_index, positions, block_size)
            self.count += int((slots != compute_slot_mapping(block_tables, seq_index, positions, block_size)).sum())
            return slots

        return {bug.target: watched}

    def preempt_to_tail(self, engine, broken, monkeypatch, bug: Bug) -> dict:
        def watched(sched: Scheduler, seq, out):
            self.count += bool(sched.waiting)  # with nobody waiting, the tail is the head
            broken(sched, seq, out)

        return {bug.target: watched}

    def decode_into_shared_block(self, engine, broken, monkeypatch, bug: Bug) -> dict:
        def watched(eng: LLMEngine, out, watch):
            bs, refs = eng.config.block_size, eng.block_manager.ref_counts
            # a decode whose first block is shared, at a position outside that block
            self.count += sum(
                s.num_scheduled_tokens == 1 and refs[s.block_table[0]] > 1 and s.num_cached_tokens >= bs
                for s in out.seqs
            )
            return broken(eng, out, watch)

        monkeypatch.setattr(LLMEngine, "run", watched)  # not a lesson's target: plugged in by hand
        return {}


def run_with_bug(key: str, w: Workload, monkeypatch) -> tuple[set[str], int, list]:
    """(invariants the live checker named, bites, violations) for one workload on the broken engine."""
    options = dict(w.options)
    if key == "zero_length_query":
        options["num_kv_blocks"] = 64  # no preemption: the long decode keeps the batch from being empty
    engine = LLMEngine("tiny", **options)
    bites = Bites()
    with monkeypatch.context() as m, tempfile.TemporaryDirectory() as tmp:
        with plugged(bites.watch(key, engine, m)), TraceRecorder(engine, Path(tmp) / "t.jsonl") as recorder:
            drive(engine, w.requests, MAX_STEPS)
    return {v.invariant for v in recorder.violations}, bites.count, recorder.violations


# One fixed workload that every bug bites: block size 4, a 10-block pool, prefix sharing, a repeat
# of a 5-block prompt (a full prefix hit), late arrivals, preemption.
FIXED = Workload({**BUSY_OPTIONS, "enable_prefix_caching": True}, BUSY_REQUESTS)
# bug -> (the invariant the checker names first on FIXED, at which step): the closing note's table
FIXED_FIRST = {
    "stale_hash_entry": ("kv_content", 7),
    "stale_cached_count": ("preempt_resets", 6),
    "zero_length_query": ("batch_membership", 3),
    "slot_off_by_one_block": ("slot_mapping", 0),
    "preempt_to_tail": ("preempted_to_head", 7),
    "decode_into_shared_block": ("shared_block_write", 2),
}


@pytest.mark.parametrize("key", sorted(BUGS))
def test_each_bug_is_named_at_a_known_step_of_a_fixed_workload(key, monkeypatch):
    invariant, step = FIXED_FIRST[key]
    fired, bites, violations = run_with_bug(key, FIXED, monkeypatch)
    assert bites and invariant in BUGS[key].invariants
    named = [(v.step, v.invariant) for v in violations if v.invariant in BUGS[key].invariants]
    assert min(named)[0] == step and (step, invariant) in named, named


def test_the_fixed_workload_is_clean_on_the_real_engine():
    engine = LLMEngine("tiny", **FIXED.options)
    with tempfile.TemporaryDirectory() as tmp, TraceRecorder(engine, Path(tmp) / "t.jsonl") as recorder:
        drive(engine, FIXED.requests, MAX_STEPS)
    assert recorder.violations == []


SEEN: Counter = Counter()


@pytest.mark.parametrize("key", sorted(BUGS))
def test_the_checker_names_a_planted_engine_bug(key, monkeypatch):
    bug = BUGS[key]
    SEEN.clear()

    @settings(
        max_examples=NUM_EXAMPLES,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(workloads())
    def bug_is_named_when_it_bites(w: Workload) -> None:
        fired, bites, violations = run_with_bug(key, w, monkeypatch)
        if bites:
            SEEN["bit"] += 1
            assert fired & set(bug.invariants), f"{bug.name} bit {bites} times but the checker named {fired}: {w}"
        else:
            assert not violations, f"{bug.name} never bit, yet the checker reported {violations[:2]}: {w}"

    bug_is_named_when_it_bites()
    print(f"[{key}] bit in {SEEN['bit']} of {NUM_EXAMPLES} workloads")
    assert SEEN["bit"] >= 2, f"only {SEEN['bit']} of {NUM_EXAMPLES} workloads exercised {bug.name}"
