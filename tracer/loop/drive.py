"""The one workload driver: run a schedule (tracer/loop/arrivals.py) on an LLMEngine to the end.

    ids = drive(engine, arrivals, aborts=[Abort(index=1, step=6)], recorder=recorder,
                on_step=lambda appended: print(len(appended), "tokens"), max_steps=2000)
    outputs = [engine.collect(ids[i]) for i in range(len(arrivals))]

Before each step it adds the arrivals that are due, then asks for the aborts that are due; the
engine applies an abort at the start of its next step. `nanoengine trace` and `run`, the lessons'
and demos' scenarios all run through it, so a workload means the same run everywhere. The live
engine loop (engine_loop.py) runs requests that arrive over time from other threads instead; vLLM's
recorder (tracer/vllm/record.py) drives vLLM's scheduler, not an LLMEngine, by the same `is_due`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tracer.loop.arrivals import Abort, Arrival, pop_due, sorted_arrivals

if TYPE_CHECKING:  # the command line's --help must not import torch
    from nanoengine.engine import LLMEngine
    from nanoengine.sequence import Sequence


class StepLimitError(RuntimeError):
    """The engine had not finished the workload after max_steps steps."""


def drive(
    engine: LLMEngine,
    arrivals: list[Arrival],
    *,
    aborts: list[Abort] | None = None,
    recorder: Any = None,
    on_step: Callable[[list[Sequence]], object] | None = None,
    max_steps: int | None = None,
    ids: dict[int, int] | None = None,
) -> dict[int, int]:
    """Add each arrival at its step, abort as asked, step until every request has finished.

    Returns arrival index -> seq_id. `ids`, when given, is filled as requests join, so a caller
    that catches an exception from a step knows which have. recorder: the TraceRecorder on this
    engine, told each request's requested step (`arrive`). on_step(appended) runs after each step
    with the sequences that gained a token. Raises StepLimitError after max_steps steps."""
    ids = {} if ids is None else ids
    pending = sorted_arrivals(arrivals)
    to_abort = sorted(aborts or [], key=lambda a: a.step)
    while pending or engine.has_unfinished():
        ids.update(add_due(engine, pending, recorder))
        abort_due(engine, to_abort, ids)
        if max_steps is not None and engine.num_steps >= max_steps:
            raise StepLimitError(
                f"the engine did not finish within {max_steps} steps: is a request never scheduled, or never finished?"
            )
        appended = engine.step()
        if on_step is not None:
            on_step(appended)
    return ids


def add_due(engine: LLMEngine, pending: list[Arrival], recorder: Any = None) -> dict[int, int]:
    """Add every arrival due before the engine's next step; returns index -> seq_id of those added."""
    added: dict[int, int] = {}
    for arrival in pop_due(pending, engine.num_steps, not engine.has_unfinished()):
        seq_id = engine.add_request(arrival.prompt, arrival.params)
        if recorder is not None:
            recorder.annotate(seq_id, arrive=arrival.step)
        added[arrival.index] = seq_id
    return added


def abort_due(engine: LLMEngine, to_abort: list[Abort], ids: dict[int, int]) -> None:
    """Ask for every abort due before the engine's next step whose request has joined (the others wait)."""
    for abort in [a for a in to_abort if a.step <= engine.num_steps and a.index in ids]:
        engine.abort(ids[abort.index])
        to_abort.remove(abort)
