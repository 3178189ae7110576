"""The schedule of a run without a server: requests that arrive at given engine steps, and aborts
asked for at given steps (`nanoengine trace --arrive 0,0,4,9`, `nanoengine run SCENARIO.json`, the
lessons' and demos' scenarios). tracer/loop/drive.py runs a schedule on an LLMEngine.

    arrivals = [Arrival("Hi", params, step=0, index=0), Arrival("Hello", params, step=4, index=1)]
    aborts = [Abort(index=1, step=6)]              # request 1 is aborted before step 6 runs

One rule decides when an arrival joins, `is_due`: before the step it asked for, or at once when the
engine is idle (an idle engine takes no empty steps). The live feed and vLLM's recorder keep it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the command line's --help must not import torch
    from nanoengine.beam_search import BeamSearchParams
    from nanoengine.sampling_params import SamplingParams


@dataclass(slots=True)
class Arrival:
    prompt: str | list[int]
    params: SamplingParams | BeamSearchParams
    step: int = 0  # added before this engine step runs
    index: int = 0  # its place in the list it came from (seq_ids differ between runs, indices do not)


@dataclass(slots=True)
class Abort:
    index: int  # the Arrival.index of the request to abort
    step: int  # aborted before this engine step runs (once the request has joined)


def sorted_arrivals(arrivals: list[Arrival]) -> list[Arrival]:
    """The arrivals in the order they join (stable: equal steps keep their given order)."""
    return sorted(arrivals, key=lambda a: a.step)


def is_due(step: int, num_steps: int, idle: bool) -> bool:
    """Does a request asked for `step` join before engine step `num_steps`? An idle engine takes no
    empty steps: the next arrival joins at once, earlier than asked."""
    return step <= num_steps or idle


def pop_due(pending: list[Arrival], num_steps: int, idle: bool) -> list[Arrival]:
    """Remove from pending (sorted) and return the arrivals that join before engine step num_steps.
    Once one joins the engine is no longer idle: the others wait for their own step."""
    due: list[Arrival] = []
    while pending and is_due(pending[0].step, num_steps, idle and not due):
        due.append(pending.pop(0))
    return due


def parse_arrive(text: str, num_prompts: int) -> list[int]:
    """--arrive 0,0,4,9: one step per prompt, each >= 0."""
    try:
        steps = [int(s) for s in text.split(",")]
    except ValueError:
        raise ValueError(f"--arrive takes one step number per prompt, e.g. 0,0,4,9; got {text!r}") from None
    if len(steps) != num_prompts:
        raise ValueError(f"--arrive gives {len(steps)} steps for {num_prompts} prompts: give one step per prompt")
    if any(s < 0 for s in steps):
        raise ValueError(f"--arrive steps must be >= 0, got {text!r}")
    return steps
