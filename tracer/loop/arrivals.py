"""Requests that arrive at given engine steps, without a server: `nanoengine trace --arrive 0,0,4,9`,
`nanoengine run SCENARIO.json`, the lessons' and demos' scenarios.

    arrivals = [Arrival("Hi", params, step=0, index=0), Arrival("Hello", params, step=4, index=1)]
    pending = sorted_arrivals(arrivals)
    while pending or engine.has_unfinished():
        add_due(engine, pending)   # before each step
        engine.step()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the command line's --help must not import torch
    from nanoengine.engine import LLMEngine
    from nanoengine.sampling_params import SamplingParams


@dataclass(slots=True)
class Arrival:
    prompt: str | list[int]
    params: SamplingParams
    step: int = 0  # added before this engine step runs
    index: int = 0  # its place in the list it came from (seq_ids differ between runs, indices do not)


def sorted_arrivals(arrivals: list[Arrival]) -> list[Arrival]:
    """The arrivals in the order they join (stable: equal steps keep their given order)."""
    return sorted(arrivals, key=lambda a: a.step)


def add_due(engine: LLMEngine, pending: list[Arrival], recorder: Any = None) -> list[tuple[Arrival, int]]:
    """Add (and remove from pending) every arrival due before the engine's next step; returns each
    with its seq_id. An idle engine takes no empty steps: the next arrival joins at once, earlier than
    asked. With a recorder, each request's entry in the trace gets its requested step as `arrive`."""
    added = []
    while pending and (pending[0].step <= engine.num_steps or not engine.has_unfinished()):
        arrival = pending.pop(0)
        seq_id = engine.add_request(arrival.prompt, arrival.params)
        if recorder is not None:
            recorder.annotate(seq_id, arrive=arrival.step)
        added.append((arrival, seq_id))
    return added


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
