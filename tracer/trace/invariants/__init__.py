"""The invariant checker: what must hold at every engine step, checked on a step dict.

A step dict is one step line of a trace (docs/trace-format.md). The same checker runs live
inside the recorder (on the dict it is about to write) and offline on a loaded trace:

    checker = InvariantChecker(config=header["config"], requests=header["requests"])
    for step in steps:
        violations = checker.check(step)          # list[Violation]

    check_trace(trace) -> list[Violation]         # a loaded trace (tracer.trace.trace_file.Trace)
    check_trace(trace, profile="correctness")     # a chosen profile (profiles.py); default: the
                                                  # profile of the engine that wrote the trace
    check_record(record, block_size=16)           # a bare nanoengine StepRecord, no history

Each Violation names the step, the sequence (or None), the invariant (a key of INVARIANTS)
and says what is wrong in one plain-English sentence. The checker keeps a little history
between steps (the previous step's sequences and every sequence's tokens) so it can also
check what must carry over from one step to the next; without config or requests, the
rules that need them are skipped.

One file per concern: rule.py (how a rule is written and registered), counters.py,
flat_batch.py, kv_slots.py, blocks.py, tokens.py, lifecycle.py (correctness), beams.py (a beam
search's forks and copies), samples.py (the n samples of one request), policy.py (nanoengine's choices), decisions.py (the numbers its decisions record), vllm.py (vLLM's
variants and rules), profiles.py (which rules run, in order), checker.py (the driver).
"""

from tracer.trace.invariants.checker import InvariantChecker, check_record, check_steps, check_trace
from tracer.trace.invariants.profiles import (
    CORRECTNESS,
    DECISIONS,
    DEFAULT_PROFILE,
    INVARIANTS,
    POLICY,
    PROFILES,
    profile_for,
)
from tracer.trace.invariants.rule import Violation

__all__ = [
    "CORRECTNESS",
    "DECISIONS",
    "DEFAULT_PROFILE",
    "INVARIANTS",
    "POLICY",
    "PROFILES",
    "InvariantChecker",
    "Violation",
    "check_record",
    "check_steps",
    "check_trace",
    "profile_for",
]
