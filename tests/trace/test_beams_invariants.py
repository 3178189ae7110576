"""The beam-search invariants (tracer/trace/invariants/beams.py) and the rules beam search extended:
each names its bug, planted into the engine (a tracer.teach.plant Patch of the engine's current
function) or edited into a correct recorded beam-search trace, from the step records alone."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest

import nanoengine.scheduler
from nanoengine import BeamSearchParams, SamplingParams
from nanoengine.block_manager import BlockManager
from nanoengine.engine import LLMEngine
from nanoengine.scheduler import Scheduler
from nanoengine.sequence import EventKind, FinishReason
from tracer.teach.plant import Edit, Patch, planted
from tracer.trace.invariants import Violation, check_steps
from tracer.trace.recorder import TraceRecorder
from tracer.trace.trace_file import Trace, load_trace

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPT = [5, 6, 7, 8, 9]
BEAMS = BeamSearchParams(beam_width=3, max_tokens=8, ignore_eos=True)
OPTIONS = dict(block_size=4, num_kv_blocks=64, max_num_batched_tokens=64, max_num_seqs=8, num_threads=1)
PLAIN = SamplingParams(max_tokens=10, ignore_eos=True)
# a pool too small for all three: the beam search, admitted last, is the newest running (its forks
# stay beside their parent), so its beams are preempted together and the search restarts
CROWD = [([11, 12, 13, 14, 15, 16], PLAIN), ([11, 12, 13, 14, 15, 17], PLAIN), (PROMPT, BEAMS)]
MAX_STEPS = 40  # a broken engine may never finish: the checker names the bug within a few steps


# ---- bugs planted into the engine ------------------------------------------------------------------
NO_COPY = Patch(
    "BlockManager.copy_on_write",
    (
        Edit(
            "if not self.must_copy(seq):", "if True:  # BUG: no copy: the beam writes into the block its siblings read"
        ),
    ),
)
COPY_NOT_MADE = Patch(
    "Scheduler.schedule_unit",
    (
        Edit(
            "out.blocks_to_copy.append(copied)",
            "pass  # BUG: the copy is not passed to the runner: the fresh block keeps whatever it held",
        ),
    ),
)
ONE_BEAM_AT_A_TIME = Patch(
    "nanoengine.scheduler:unit_of",
    (
        Edit(
            "return list(seq.group.live) if seq.group else [seq]",
            "return [seq]  # BUG: each beam scheduled on its own: a short budget runs some of them",
        ),
    ),
)
FORK_WITHOUT_A_HOLDER = Patch(
    "BlockManager.fork",
    (Edit("self.ref_counts[block_id] += 1", "pass  # BUG: the child holds the blocks but their ref counts stay"),),
)
FORK_SHORT_OF_A_BLOCK = Patch(
    "BlockManager.fork",
    (
        Edit(
            "child.block_table = list(parent.block_table)",
            "child.block_table = list(parent.block_table[:-1])  # BUG: the partly written last block left out",
        ),
    ),
)


def plug(monkeypatch, patch: Patch) -> None:
    broken = planted(patch)
    owner = {"BlockManager": BlockManager, "Scheduler": Scheduler}.get(patch.target.split(".")[0], nanoengine.scheduler)
    monkeypatch.setattr(owner, broken.__name__, broken)


def run_until_named(path: Path, ahead: list, **options) -> list[Violation]:
    """One beam search, behind the requests ahead, stepped until the live checker names something
    (or it finishes)."""
    engine = LLMEngine("tiny", **{**OPTIONS, **options})
    with TraceRecorder(engine, path) as recorder:
        for prompt, params in ahead:
            engine.add_request(prompt, params)
        engine.add_request(PROMPT, BEAMS)
        for _ in range(MAX_STEPS):
            if not engine.has_unfinished() or recorder.violations:
                break
            engine.step()
    return recorder.violations


# A budget of 3 (a beam search needs one token per beam) with an older plain request decoding first:
# 2 tokens are left for the 3 beams.
SHORT_BUDGET = ({"max_num_batched_tokens": 3}, [([11, 12, 13, 14, 15, 16], PLAIN)])


@pytest.mark.parametrize(
    ("patch", "workload", "named", "said"),
    [
        (NO_COPY, ({}, []), "shared_block_write", "which seqs"),
        (COPY_NOT_MADE, ({}, []), "cow_copy", "the runner never copied the K/V"),
        (COPY_NOT_MADE, ({}, []), "cow_copy", "not its source's KV"),
        (ONE_BEAM_AT_A_TIME, SHORT_BUDGET, "beams_together", "were scheduled but"),
        (FORK_WITHOUT_A_HOLDER, ({}, []), "ref_counts", "but 3 sequences hold it"),
        (FORK_WITHOUT_A_HOLDER, ({}, []), "fork_shares_parent", "each fork adds one"),
        (FORK_SHORT_OF_A_BLOCK, ({}, []), "fork_shares_parent", "a fork shares every block"),
    ],
    ids=["no-copy", "copy-not-made", "copy-holds-nothing", "one-beam", "fork-refs", "fork-refs-shared", "fork-table"],
)
def test_a_planted_engine_bug_is_named(tmp_path, monkeypatch, patch, workload, named, said):
    options, ahead = workload
    assert run_until_named(tmp_path / "clean.jsonl", ahead, **options) == []  # the engine's own code: silent
    plug(monkeypatch, patch)
    found = [v for v in run_until_named(tmp_path / "broken.jsonl", ahead, **options) if v.invariant == named]
    assert any(said in v.message for v in found), found


# ---- bugs edited into a correct trace ----------------------------------------------------------------
@pytest.fixture(scope="module")
def crowd(tmp_path_factory) -> Trace:
    """A correct trace with forks, copies, pruned beams and a restart after a preemption."""
    path = tmp_path_factory.mktemp("beams") / "crowd.jsonl"
    engine = LLMEngine("tiny", **{**OPTIONS, "num_kv_blocks": 12})
    with TraceRecorder(engine, path) as recorder:
        for prompt, params in CROWD:
            engine.add_request(prompt, params)
        while engine.has_unfinished():
            engine.step()
    assert recorder.violations == []
    return load_trace(path)


def row(step: dict, seq_id: int) -> dict:
    return next(r for r in step["seqs"] if r["seq_id"] == seq_id)


def step_with(steps: list[dict], kind: EventKind, after: int = 0) -> tuple[int, dict]:
    """The first step from index after with an event of this kind, and the event."""
    for i, step in enumerate(steps[after:], after):
        for e in step["events"]:
            if e["kind"] == kind:
                return i, e
    raise AssertionError(f"no {kind} event")


def copy_into_a_held_block(steps: list[dict]) -> int:
    """A copy-on-write takes a block its sibling still holds instead of a free one."""
    i, e = step_with(steps, EventKind.COPY_ON_WRITE)
    taken = next(b for r in steps[i - 1]["seqs"] if r["seq_id"] != e["seq_id"] for b in r["block_table_after"])
    steps[i]["blocks_to_copy"] = [[s, taken if c == e["detail"]["copy"] else c] for s, c in steps[i]["blocks_to_copy"]]
    e["detail"]["copy"] = taken
    return i


def copy_the_wrong_block(steps: list[dict]) -> int:
    """The runner copies another block than the one the beam copied on write."""
    i, e = step_with(steps, EventKind.COPY_ON_WRITE)
    steps[i]["blocks_to_copy"] = [[c + 1, c] for _, c in steps[i]["blocks_to_copy"]]
    return i


def fork_a_waiting_beam(steps: list[dict]) -> int:
    i, e = step_with(steps, EventKind.FORKED, after=1)  # a step with one before it: continuity compares them
    row(steps[i], e["seq_id"])["status_before"] = "WAITING"
    return i


def fork_without_its_token(steps: list[dict]) -> int:
    i, e = step_with(steps, EventKind.FORKED)
    child = row(steps[i], e["seq_id"])
    child["num_tokens"] += 1
    child["new_token_ids"], child["new_token_texts"], child["new_token_logprobs"] = [], [], []
    return i


def restart_short_of_the_prompt(steps: list[dict]) -> int:
    """The restarted beam keeps one token past its prompt."""
    i = next(k for k, s in enumerate(steps) for e in s["events"] if restarted(s, e))
    e = next(e for e in steps[i]["events"] if restarted(steps[i], e))
    beam = row(steps[i], e["seq_id"])
    beam["num_tokens"] += 1
    beam["num_tokens_after"] += 1
    return i


def restarted(step: dict, e: dict) -> bool:
    return e["kind"] == EventKind.PREEMPTED and row(step, e["seq_id"])["status_after"] == "WAITING"


def prune_a_waiting_beam(steps: list[dict]) -> int:
    """The restarted beam, waiting to be admitted again, is pruned without a preemption."""
    i = next(k for k, s in enumerate(steps) for e in s["events"] if restarted(s, e)) + 1
    sid = next(e["seq_id"] for e in steps[i - 1]["events"] if restarted(steps[i - 1], e))
    pruned = {"kind": EventKind.FINISHED, "seq_id": sid, "detail": {"reason": FinishReason.PRUNED.value}}
    steps[i]["events"].insert(0, pruned)
    return i


def preempt_the_beams_before_the_newest(steps: list[dict]) -> int:
    """The beams go while a plain request is the newest running sequence."""
    i, e = step_with(steps, EventKind.PREEMPTED)
    running = steps[i]["queues"]["running"]
    plain = next(sid for sid in running if "beam_width" not in row(steps[i], sid))
    steps[i]["queues"]["running"] = [sid for sid in running if sid != plain] + [plain]
    return i


EDITS: dict[str, tuple[Callable[[list[dict]], int], str]] = {
    "copy into a held block": (copy_into_a_held_block, "cow_copy"),
    "copy the wrong block": (copy_the_wrong_block, "cow_copy"),
    "fork a waiting beam": (fork_a_waiting_beam, "continuity"),
    "fork without its token": (fork_without_its_token, "token_gain"),
    "restart short of the prompt": (restart_short_of_the_prompt, "token_growth"),
    "prune a waiting beam": (prune_a_waiting_beam, "status_edges"),
    "preempt the beams before the newest": (preempt_the_beams_before_the_newest, "victim_policy"),
}


@pytest.mark.parametrize("name", sorted(EDITS))
def test_a_bug_edited_into_a_beam_search_trace_is_named(crowd, name):
    edit, invariant = EDITS[name]
    header = crowd.header
    steps = copy.deepcopy(list(crowd.steps))
    i = edit(steps)
    number = steps[i]["step"]
    args = (header["config"], header["requests"], header["eos_token_ids"])
    assert not [v for v in check_steps(crowd.steps, *args) if v.invariant == invariant]
    fired = [v for v in check_steps(steps, *args) if v.invariant == invariant and v.step == number]
    assert fired and all(v.message and "\n" not in v.message and "malformed" not in v.message for v in fired)
