"""Property test: random workloads on the tiny model keep every invariant at every step.

Hypothesis draws workloads: prompts sharing prefixes, random lengths and max_tokens, requests
arriving mid-run and aborted, block sizes 1..32, tiny KV pools (preemption), tiny token budgets
(chunked prefill), prefix caching on and off, greedy and seeded sampling, stop strings and
max_model_len just above the longest prompt. Each runs under the
recorder, whose live checker must find nothing; the written trace must load and re-check clean.
Across the examples, preemption, chunked prefill and prefix hits must all have happened.

NANOENGINE_PROPERTY_EXAMPLES sets the number of workloads (default 200, about 20 s on one core).
The draws are derandomized, so a run is reproducible; set NANOENGINE_PROPERTY_RANDOM=1 to explore.
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings, target
from hypothesis import strategies as st

from nanoengine.block_manager import blocks_needed
from nanoengine.engine import LLMEngine
from nanoengine.loading.tiny import ByteTokenizer
from nanoengine.sampling_params import SamplingParams
from tracer.trace.invariants import check_trace
from tracer.trace.recorder import TraceRecorder
from tracer.trace.trace_file import load_trace

NUM_EXAMPLES = int(os.environ.get("NANOENGINE_PROPERTY_EXAMPLES", "200"))
MAX_STEPS = 3000


@dataclass(frozen=True, slots=True)
class Request:
    prompt: str
    params: SamplingParams
    arrival: int  # added before this step (0: before the run starts)
    abort_after: int | None  # aborted this many steps after arriving


@dataclass(frozen=True, slots=True)
class Workload:
    options: dict
    requests: tuple[Request, ...]


@st.composite
def requests(draw, base: str) -> Request:
    cut = draw(st.one_of(st.just(len(base)), st.integers(0, len(base))))
    prompt = base[:cut] + draw(st.text(alphabet="abcxyz", min_size=1, max_size=10))
    greedy = draw(st.booleans())
    params = SamplingParams(
        max_tokens=draw(st.integers(1, 10)),
        ignore_eos=draw(st.booleans()),
        temperature=0.0 if greedy else 1.0,
        seed=None if greedy else draw(st.integers(0, 9)),
        stop=draw(st.sampled_from([[], [], list("aeiou()5=M_ "), ["xy", "\u00e9"]])),
    )
    arrival = draw(st.one_of(st.just(0), st.integers(1, 8)))
    abort_after = draw(st.one_of(st.none(), st.none(), st.integers(0, 6)))
    return Request(prompt, params, arrival, abort_after)


@st.composite
def workloads(draw) -> Workload:
    block_size = draw(st.one_of(st.integers(1, 8), st.integers(1, 32)))
    base = draw(st.text(alphabet="ab ", min_size=0, max_size=40))  # the shared prefix
    reqs = tuple(draw(requests(base)) for _ in range(draw(st.integers(1, 6))))
    need = max(blocks_needed(len(r.prompt) + r.params.max_tokens, block_size) for r in reqs)
    longest = max(len(r.prompt) for r in reqs)
    options = dict(
        block_size=block_size,
        num_kv_blocks=need + draw(st.one_of(st.integers(0, 2), st.integers(0, 4 * need))),
        max_num_batched_tokens=draw(st.one_of(st.integers(1, 8), st.integers(1, 96))),
        max_num_seqs=draw(st.integers(1, 6)),
        enable_prefix_caching=draw(st.booleans()),
        max_model_len=draw(st.one_of(st.none(), st.integers(2, 12).map(lambda extra: longest + extra))),
    )
    return Workload(options, reqs)


SEEN: Counter = Counter()


def run_workload(w: Workload, path: Path) -> TraceRecorder:
    engine = LLMEngine("tiny", **w.options)
    ids: dict[int, int] = {}
    with TraceRecorder(engine, path) as recorder:
        step = 0
        while step == 0 or engine.has_unfinished() or any(r.arrival >= step for r in w.requests):
            for i, r in enumerate(w.requests):
                if r.arrival == step:
                    ids[i] = engine.add_request(r.prompt, r.params)
                if r.abort_after is not None and r.arrival + r.abort_after == step and i in ids:
                    engine.abort(ids[i])
            engine.step()
            step += 1
            assert step < MAX_STEPS, f"the engine did not finish {w} in {MAX_STEPS} steps"
    return recorder


def stopped(trace) -> int:
    """Sequences that finished at one of their stop strings."""
    ids: dict[int, list[int]] = {}
    for step in trace.steps:
        for q in step["seqs"]:
            ids.setdefault(q["seq_id"], []).extend(q["new_token_ids"])
    texts = {sid: ByteTokenizer().decode(tokens) for sid, tokens in ids.items()}
    return sum(
        q["finish_reason"] == "stop"
        and any(stop in texts[q["seq_id"]] for stop in trace.requests[q["seq_id"]]["params"]["stop"])
        for q in trace.steps[-1]["seqs"]
    )


def tally(trace) -> None:
    events = [e for s in trace.steps for e in s["events"]]
    kinds = Counter(e["kind"] for e in events)
    chunked = sum(e["detail"]["chunks"] > 1 for e in events if e["kind"] == "prefill_done")
    aborted = sum(e["detail"]["reason"] == "abort" for e in events if e["kind"] == "finished")
    late = sum(len(s.get("new_requests", ())) for s in trace.steps)
    found = {
        "workloads": 1,
        "steps": trace.num_steps,
        "preemptions": kinds["preempted"],
        "prefix hits": kinds["prefix_hit"],
        "chunked prefills": chunked,
        "aborts": aborted,
        "late requests": late,
        "stop strings": stopped(trace),
    }
    SEEN.update(found)
    for name, n in found.items():
        if n and name not in ("workloads", "steps"):
            event(f"has {name}")
    target(float(kinds["preempted"]), label="preemptions")
    target(float(chunked), label="chunked prefills")


@settings(
    max_examples=NUM_EXAMPLES,
    deadline=None,
    derandomize=not os.environ.get("NANOENGINE_PROPERTY_RANDOM"),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(workloads())
def check_random_workload(w: Workload) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "w.jsonl"
        recorder = run_workload(w, path)
        live = [v.to_dict() for v in recorder.violations]
        assert live == [], f"{w}: {live[:3]}"
        trace = load_trace(path, validate="all" if SEEN["workloads"] % 25 == 0 else "sample")
        assert check_trace(trace) == [], w
        assert all(q["status_after"] == "FINISHED" for q in trace.steps[-1]["seqs"])
        tally(trace)


def test_random_workloads_keep_every_invariant(one_torch_thread, capsys, record_property):
    SEEN.clear()
    check_random_workload()
    with capsys.disabled():
        print(
            f"\n[invariant properties] {SEEN['workloads']} random workloads, {SEEN['steps']} steps checked: "
            + ", ".join(
                f"{SEEN[k]} {k}"
                for k in ("preemptions", "chunked prefills", "prefix hits", "aborts", "late requests", "stop strings")
            )
        )
    record_property("workloads", SEEN["workloads"])
    for feature in ("preemptions", "chunked prefills", "prefix hits", "aborts", "late requests", "stop strings"):
        assert SEEN[feature] > 0, f"no workload had {feature}: the strategy no longer reaches them"
