"""The "model-only" time: the engine's forward passes replayed bare.

During a benchmark run a ForwardProbe keeps every step's flat inputs (the very tensors the runner
got: same token counts per sequence, same positions, slots and block tables). Afterwards
replay_forwards() runs the same forward passes straight through the model: the decoder and the
LM head at the sampled rows, with all attention metadata built beforehand. No scheduling, input
preparation, sampling or bookkeeping is timed, so engine time / model-only time is what the
engine adds on top of the arithmetic.
"""

from __future__ import annotations

import time

import torch

from nanoengine.engine import LLMEngine
from nanoengine.model_runner import StepInputs
from tracer.bench.metrics import synchronize


class ForwardProbe:
    """Wraps the engine's runner.run (the call the engine times as a step's model_time) to keep
    each step's inputs and add up that time. Costs two clock reads and a list append per step."""

    def __init__(self, engine: LLMEngine):
        self.runner = engine.runner
        self.inputs: list[StepInputs] = []
        self.model_time = 0.0
        self.wrapped = self.runner.run
        self.runner.run = self.run  # type: ignore[method-assign]

    def run(self, seqs, inputs: StepInputs) -> list:
        start = time.perf_counter()
        token_ids = self.wrapped(seqs, inputs)  # plain Python results: the device has synchronised
        self.model_time += time.perf_counter() - start
        self.inputs.append(inputs)
        return token_ids

    def detach(self) -> None:
        if self.runner.__dict__.get("run") == self.run:
            del self.runner.run

    @property
    def num_steps(self) -> int:
        return len(self.inputs)


@torch.inference_mode()
def replay_forwards(engine: LLMEngine, recorded: list[StepInputs]) -> float:
    """Seconds to run the recorded steps' forward passes (+ LM head at the sampled rows) bare.

    Writes K/V into the engine's cache, so run it only once the engine's work is done."""
    runner, device = engine.runner, engine.device
    model = runner.model  # what the engine runs: the tools' FusedDecoder, or the model itself
    prepared = [
        (
            inputs.input_ids.to(device),
            inputs.positions.to(device),
            runner.build_metadata(inputs),
            inputs.logits_indices.to(device),
        )
        for inputs in recorded
    ]
    synchronize(device)
    start = time.perf_counter()
    for input_ids, positions, meta, logits_indices in prepared:
        hidden = model(input_ids, positions, runner.kv_caches, meta, runner.attend)
        model.compute_logits(hidden[logits_indices])
    synchronize(device)
    return time.perf_counter() - start
