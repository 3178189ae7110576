"""The soak (slow: `python -m pytest -m slow tests/engine/test_soak.py -s`): 2,000 tiny-model
requests arriving at random steps, with random lengths, seeds and stop strings; some aborted, some
hit by a fault injected into their forward pass. Nothing may be lost (every request finishes and
is collected once, with the reason it should have), every request neither aborted nor faulted
gets exactly the tokens of a fault-free run of the same requests, the pool is all free at the
end, and the process's RSS growth is reported."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field

import pytest
from conftest import torch_threads

from nanoengine import LLMEngine, SamplingParams

pytestmark = pytest.mark.slow
NUM_REQUESTS = 2000
ABORT_RATE, FAULT_RATE = 0.05, 0.05
OPTIONS = dict(block_size=4, num_kv_blocks=96, max_num_batched_tokens=48, max_num_seqs=16)
STOPS = ["e", "th", "\n", "ab", "zz"]


@dataclass(slots=True)
class Request:
    prompt: str
    params: SamplingParams
    arrival: int  # the step after which it is added
    abort_at: int | None = None  # the step after which it is aborted
    fault_on: int | None = None  # its forward fails the n-th time it is scheduled


@dataclass(slots=True)
class Run:
    outputs: dict[int, tuple[str | None, list[int]]] = field(default_factory=dict)  # request -> (reason, tokens)
    rss_mb: list[float] = field(default_factory=list)
    num_steps: int = 0


def workload(seed: int = 23) -> list[Request]:
    rng = random.Random(seed)
    requests, step = [], 0
    for _ in range(NUM_REQUESTS):
        step += rng.choice([0, 0, 0, 1, 1, 2])  # bursts and gaps
        sampled = rng.random() < 0.5
        params = SamplingParams(
            max_tokens=rng.randint(1, 24),
            temperature=0.9 if sampled else 0.0,
            seed=rng.randrange(2**31) if sampled else None,
            ignore_eos=rng.random() < 0.7,
            stop=rng.sample(STOPS, rng.randint(1, 2)) if rng.random() < 0.3 else None,
        )
        prompt = rng.choice("abcdefgh") + "".join(
            rng.choice("abcdefghij klmnopqrstuvwxyz") for _ in range(rng.randint(0, 39))
        )
        request = Request(prompt, params, step)
        if rng.random() < ABORT_RATE:
            request.abort_at = step + rng.randint(0, 12)
        elif rng.random() < FAULT_RATE:
            request.fault_on = rng.randint(1, 6)
        requests.append(request)
    return requests


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class FaultInjector:
    """The model runner, failing any batch that holds a doomed sequence on its doomed call (the
    engine then runs each sequence alone, and only the doomed one fails)."""

    def __init__(self, run, doomed: dict[int, int]):
        self.real_run, self.doomed, self.calls = run, doomed, dict.fromkeys(doomed, 0)

    def __call__(self, seqs, inputs):
        alone = len(seqs) == 1
        for seq in seqs:
            if seq.seq_id in self.doomed:
                if not alone:
                    self.calls[seq.seq_id] += 1
                if self.calls[seq.seq_id] >= self.doomed[seq.seq_id]:
                    raise RuntimeError(f"injected forward fault in seq {seq.seq_id}")
        return self.real_run(seqs, inputs)


def run(requests: list[Request], faults: bool) -> Run:
    engine = LLMEngine("tiny", **OPTIONS)
    result, ids, live, by_step = Run(), {}, {}, {}
    for index, request in enumerate(requests):
        by_step.setdefault(request.arrival, []).append(index)
    aborts = {}
    if faults:
        for index, request in enumerate(requests):
            if request.abort_at is not None:
                aborts.setdefault(request.abort_at, []).append(index)
    doomed: dict[int, int] = {}
    if faults:
        engine.runner.run = FaultInjector(engine.runner.run, doomed)  # type: ignore[method-assign]
    step = 0
    while step <= max(by_step) or engine.has_unfinished():
        for index in by_step.get(step, ()):
            ids[index] = live[index] = engine.add_request(requests[index].prompt, requests[index].params)
            if faults and requests[index].fault_on is not None:
                doomed[ids[index]] = requests[index].fault_on
        for index in aborts.get(step, ()):
            if ids[index] in engine.sequences:
                engine.abort(ids[index])
        engine.step()
        step += 1
        if step % 500 == 0:
            result.rss_mb.append(rss_mb())
        for index, seq_id in list(live.items()):  # collect each request once it has finished
            if engine.sequences[seq_id].is_finished:
                out = engine.collect(live.pop(index))
                result.outputs[index] = (out.finish_reason, out.token_ids)
    result.num_steps = step
    result.rss_mb.append(rss_mb())
    assert not engine.sequences and not engine.has_unfinished(), "requests left in the engine"
    assert engine.block_manager.num_free_blocks == OPTIONS["num_kv_blocks"], "blocks still held"
    assert not any(engine.block_manager.ref_counts)
    return result


def test_soak_2000_requests_with_aborts_stop_strings_and_faults():
    requests = workload()
    with torch_threads(1):
        faulty = run(requests, faults=True)
        clean = run(requests, faults=False)
    assert sorted(faulty.outputs) == sorted(clean.outputs) == list(range(NUM_REQUESTS)), "a request was lost"
    reasons = {reason for reason, _ in faulty.outputs.values()}
    assert reasons <= {"length", "stop", "abort", "error"}
    unaffected = [i for i, r in enumerate(requests) if r.abort_at is None and r.fault_on is None]
    changed = [i for i in unaffected if faulty.outputs[i] != clean.outputs[i]]
    assert changed == [], f"{len(changed)} unaffected requests changed, e.g. {changed[:5]}"
    for i, request in enumerate(requests):
        reason = faulty.outputs[i][0]
        if request.fault_on is not None:
            assert reason in ("error", "length", "stop"), (i, reason)  # it may finish before its fault
        elif request.abort_at is not None:
            assert reason in ("abort", "length", "stop"), (i, reason)
        else:
            assert reason in ("length", "stop"), (i, reason)
    counts = {r: sum(1 for reason, _ in faulty.outputs.values() if reason == r) for r in sorted(reasons)}
    growth = faulty.rss_mb[-1] - faulty.rss_mb[0]
    print(
        f"\n[soak] {NUM_REQUESTS} requests, {faulty.num_steps} steps (clean run {clean.num_steps}): {counts}; "
        f"{len(unaffected)} unaffected outputs identical to the fault-free run; RSS "
        f"{faulty.rss_mb[0]:.0f} MB at step 500 -> {faulty.rss_mb[-1]:.0f} MB at the end ({growth:+.1f} MB)"
    )
