"""The engine's decision functions: the one table every tool that points into the engine reads.
The engine never reads it, so it lives with the tracer, not in the engine's budgeted core.

The trace records these functions' source (the replay's code panel shows them), a lesson may swap
any SWAPPABLE one for a student's own, an invariant names those it checks, and the code panel
marks the line that decided in the function that DECIDES, not in the one that CARRIES_OUT the
decision. A test keeps the table and the engine's functions in step. No torch: the replay and the
checker read it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Role(str, Enum):
    PHASE = "phase"  # runs one phase of a step and calls the decisions
    DECIDES = "decides"  # takes a decision: which, how many, whether
    CARRIES_OUT = "carries out"  # does what its caller decided (preempt the victim chosen)


@dataclass(frozen=True, slots=True)
class Decision:
    module: str
    role: Role
    swappable: bool = True  # a lesson may replace it with the student's own


ENGINE = "nanoengine.engine"
SCHEDULER = "nanoengine.scheduler"
BLOCKS = "nanoengine.block_manager"
RUNNER = "nanoengine.model_runner"
SAMPLER = "nanoengine.sampler"
DECISIONS: dict[str, Decision] = {
    "LLMEngine.schedule": Decision(ENGINE, Role.PHASE, swappable=False),
    "LLMEngine.postprocess": Decision(ENGINE, Role.PHASE, swappable=False),
    "LLMEngine.fail": Decision(ENGINE, Role.DECIDES, swappable=False),
    "LLMEngine.check_stop_strings": Decision(ENGINE, Role.DECIDES, swappable=False),
    # beam search: ranks the candidates, forks a beam chosen twice, prunes one never chosen
    "LLMEngine.advance_beams": Decision(ENGINE, Role.DECIDES, swappable=False),
    "LLMEngine.fork": Decision(ENGINE, Role.CARRIES_OUT, swappable=False),
    "Scheduler.schedule": Decision(SCHEDULER, Role.PHASE),
    "Scheduler.make_room": Decision(SCHEDULER, Role.DECIDES),
    "choose_victim": Decision(SCHEDULER, Role.DECIDES),
    "Scheduler.preempt": Decision(SCHEDULER, Role.CARRIES_OUT),
    "Scheduler.try_admit": Decision(SCHEDULER, Role.DECIDES),
    # a beam search's beams go as one unit: how many tokens each, and the copies of shared blocks
    "Scheduler.schedule_unit": Decision(SCHEDULER, Role.DECIDES),
    # what preempt does to each sequence: drop its KV, back to the waiting queue's head (a restart prunes beams)
    "Scheduler.recompute_later": Decision(SCHEDULER, Role.DECIDES),
    "Scheduler.schedule_tokens": Decision(SCHEDULER, Role.CARRIES_OUT, swappable=False),
    "Scheduler.postprocess": Decision(SCHEDULER, Role.PHASE),
    "Scheduler.check_stop": Decision(SCHEDULER, Role.DECIDES),
    "Scheduler.finish": Decision(SCHEDULER, Role.CARRIES_OUT, swappable=False),
    "BlockManager.can_allocate": Decision(BLOCKS, Role.DECIDES),
    "BlockManager.blocks_to_schedule": Decision(BLOCKS, Role.DECIDES, swappable=False),
    "BlockManager.find_cached_prefix": Decision(BLOCKS, Role.DECIDES),
    "BlockManager.use_cached_prefix": Decision(BLOCKS, Role.CARRIES_OUT, swappable=False),
    "BlockManager.allocate": Decision(BLOCKS, Role.CARRIES_OUT),
    "BlockManager.take_free_block": Decision(BLOCKS, Role.DECIDES),
    "BlockManager.free": Decision(BLOCKS, Role.CARRIES_OUT),
    "BlockManager.must_copy": Decision(BLOCKS, Role.DECIDES, swappable=False),
    "BlockManager.copy_on_write": Decision(BLOCKS, Role.CARRIES_OUT),
    "BlockManager.fork": Decision(BLOCKS, Role.CARRIES_OUT),
    "BlockManager.register_full_blocks": Decision(BLOCKS, Role.DECIDES),
    "blocks_needed": Decision(BLOCKS, Role.DECIDES),
    "compute_block_hash": Decision(BLOCKS, Role.DECIDES),
    "prepare_inputs": Decision(RUNNER, Role.PHASE),
    "compute_slot_mapping": Decision(RUNNER, Role.DECIDES),
    "sample": Decision(SAMPLER, Role.DECIDES),
    "sample_one": Decision(SAMPLER, Role.DECIDES),
}
# The running loop's call that gives a sequence its tokens (a beam search's beams together): the line a
# step without events shows.
SCHEDULES_TOKENS = "Scheduler.schedule_unit"


def decision_named(qualname: str) -> Decision:
    """The table's entry; a KeyError naming the known ones for a misspelt name."""
    if qualname not in DECISIONS:
        raise KeyError(f"{qualname!r} is not an engine decision; known: {', '.join(DECISIONS)}")
    return DECISIONS[qualname]
