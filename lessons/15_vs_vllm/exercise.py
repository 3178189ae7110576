"""Lesson 15: nanoengine vs vLLM v1. Write choose_victim as vLLM v1 does.

Check it:  nanoengine lesson check 15
Compare:   nanoengine lesson trace 15 --compare-vllm    (your run beside vLLM's)
           nanoengine diff A.jsonl vllm:15_vs_vllm
"""

from __future__ import annotations

from nanoengine.sequence import Sequence


def choose_victim(running: list[Sequence]) -> Sequence:
    """The running sequence vLLM v1's FCFS scheduler preempts when a request
    needs a block and none is free (running is oldest first)."""
    # TODO
    raise NotImplementedError("choose_victim is not written yet")
