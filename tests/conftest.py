"""Shared fixtures: tiny-model engines and a recorded tiny trace that hits every engine path.

    make_tiny_engine(**options) -> LLMEngine        the tiny random-weight model, small defaults
    record_scenario(path) -> Path                   records SCENARIO (below) to path
    tiny_trace_path (session)                       a recorded SCENARIO trace file
    tiny_trace (session)                            the same, loaded (tracer.trace_file.Trace)
    drive(engine, requests, max_steps)              adds (prompt, max_tokens, arrival step) requests, steps to the end
    BUSY_OPTIONS, BUSY_REQUESTS                     a workload that takes every kind of scheduler decision
    record_two_chunked(path) -> Path                two 12-token prompts, an 8-token budget: chunks and a wait
    run_async(test), wait_until(pilot, app, ...)    async Textual (Pilot) tests on a live or followed trace

SCENARIO: 3 prompts sharing a prefix, a 4th added mid-run (prefix hit), one request aborted;
block_size 4, 12 KV blocks and an 8-token budget, so it shows chunked prefill, preemption,
prefix-cache hits, finished (length and abort) and a late request.
"""

from __future__ import annotations

import asyncio
import functools
import os
import resource
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from nanoengine.engine import LLMEngine
from nanoengine.sampling_params import SamplingParams

# The suite reads English whatever the machine's locale says (LANG=zh_CN.UTF-8 would pick Chinese);
# tests/i18n sets the language it tests itself. Child processes inherit this too.
os.environ["NANOENGINE_LANG"] = "en"

TINY_OPTIONS = dict(block_size=4, num_kv_blocks=12, max_num_batched_tokens=8, max_num_seqs=4)
SCENARIO_PROMPTS = ["hello world, how are you", "hello world, how is it", "abc"]
SCENARIO_LATE_PROMPT = "hello world, how are we"  # added after step 2: a prefix hit
SCENARIO_ABORT = "zz"  # added after step 2, aborted after step 4
SCENARIO_PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)
# How long a test waits for a child process or a page before calling it hung: a safety net, not a
# speed target. Under load a 5-second child has taken 145 s on the 2-core box.
HANG_S = 600
# (prompt, max_tokens, arrival step): prefix sharing, a full-prefix repeat, late arrivals, a pool too
# small for all of them (preemptions and waits), prompts longer than the budget (chunks)
BUSY_OPTIONS = dict(block_size=4, num_kv_blocks=10, max_num_batched_tokens=16, max_num_seqs=4)
BUSY_REQUESTS = (
    ("the cat sat on a mat", 6, 0),
    ("the cat sat on a hat", 6, 0),
    ("dog", 12, 0),
    ("the cat sat on a mat", 4, 3),
    ("the cat sat", 5, 9),
    ("the cat sat on a mat", 3, 12),
)


MAX_WORKERS = 4  # pytest-xdist processes: each loads torch and the models it needs


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto` (pyproject.toml): one worker per core, at most MAX_WORKERS. Most of a test's time
    is a child process, a server or a browser waiting, or one thread of the tiny model, so two
    workers on a 2-core box finish in about half the time."""
    return max(1, min(os.cpu_count() or 1, MAX_WORKERS))


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """The tiny model's matmuls are too small to gain from threads, and on a busy 2-core box
    OpenMP threads that spin-wait for each other make each step 10-100x slower."""
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    with torch_threads(1):
        yield


def sigint_as_in_a_terminal() -> None:
    """A child's preexec_fn: Ctrl-C (SIGINT) reaches it as it reaches a command typed in a terminal.

    A shell starts a background job (`cmd &`, nohup, a CI runner's script) with SIGINT ignored, its
    children inherit that, and Python then installs no KeyboardInterrupt handler: a test that
    interrupts its child would wait for an exit that never comes."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextmanager
def file_size_limit(size: int) -> Iterator[None]:
    """This process may write no file beyond size bytes, as on a full disk (EFBIG instead of ENOSPC)."""
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the error, not the signal that kills
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, old_limit[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)


def one_line_error(text: str) -> str:
    """The CLI's error output, asserted to be the one line a user should see (no traceback)."""
    text = text.strip()
    assert text.startswith("nanoengine: error: ") and "\n" not in text and "Traceback" not in text, text
    return text


def make_tiny_engine(**options) -> LLMEngine:
    return LLMEngine("tiny", **{**TINY_OPTIONS, **options})


def record_scenario(path: Path, **options) -> Path:
    from tracer.trace.recorder import TraceRecorder

    engine = make_tiny_engine(**options)
    with torch_threads(1), TraceRecorder(engine, path, title="tiny scenario"):
        for prompt in SCENARIO_PROMPTS:
            engine.add_request(prompt, SCENARIO_PARAMS)
        step = 0
        while engine.has_unfinished():
            engine.step()
            step += 1
            if step == 2:
                engine.add_request(SCENARIO_LATE_PROMPT, SCENARIO_PARAMS)
                doomed = engine.add_request(SCENARIO_ABORT, SamplingParams(max_tokens=30, ignore_eos=True))
            if step == 4:
                engine.abort(doomed)
    return path


def record_requests(path: Path, requests, **options):
    """Record the tiny engine running (prompt, params) requests, all added at once, to the end;
    returns the recorder and the engine."""
    from tracer.trace.recorder import TraceRecorder

    engine = LLMEngine("tiny", **options)
    with TraceRecorder(engine, path) as recorder:
        for prompt, params in requests:
            engine.add_request(prompt, params)
        while engine.has_unfinished():
            engine.step()
    return recorder, engine


def drive(engine: LLMEngine, requests, max_steps: int) -> list[int]:
    """Step engine until every (prompt, max_tokens, arrival step) request has arrived and finished;
    returns the request ids in the order the requests arrived."""
    step, ids = 0, []
    while step == 0 or engine.has_unfinished() or any(a >= step for _, _, a in requests):
        for prompt, max_tokens, arrival in requests:
            if arrival == step:
                ids.append(engine.add_request(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True)))
        engine.step()
        step += 1
        assert step < max_steps, f"the engine did not finish {requests} in {max_steps} steps"
    return ids


def record_two_chunked(path: Path) -> Path:
    """Two 12-token prompts and an 8-token budget: chunked prefills, and an admission that waits."""
    from tracer.trace.recorder import record_run

    trace_path, _ = record_run(
        ["a" * 12, "b" * 12],
        SamplingParams(max_tokens=2, ignore_eos=True),
        path,
        model="tiny",
        block_size=4,
        max_num_batched_tokens=8,
        num_threads=1,
    )
    return trace_path


def run_async(test):
    """An async test run by asyncio (the suite has no async plugin)."""

    @functools.wraps(test)
    def wrapper(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))

    return wrapper


async def wait_until(pilot, app, condition, what: str) -> None:
    """Let a live or following app read its file and run until condition() holds (a safety net,
    never a speed target)."""
    deadline = time.monotonic() + HANG_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"waited {HANG_S} s for {what}")
        app.poll()
        await pilot.pause(0.01)


@pytest.fixture(scope="session")
def tiny_trace_path(tmp_path_factory) -> Path:
    return record_scenario(tmp_path_factory.mktemp("trace") / "tiny.jsonl")


@pytest.fixture(scope="session")
def tiny_trace(tiny_trace_path):
    from tracer.trace.trace_file import load_trace

    return load_trace(tiny_trace_path, validate="all")


@pytest.fixture(scope="session")
def lesson10(tmp_path_factory) -> Path:
    """Lesson 10's scenario run by the tiny model: the workload of a committed vLLM v1 trace."""
    from tracer.teach.scenarios import load_scenario, run_scenario

    path = tmp_path_factory.mktemp("lesson10") / "10.jsonl"
    scenario = Path(__file__).parents[1] / "lessons" / "10_sampling" / "scenario.json"
    run_scenario(load_scenario(scenario), path, model="tiny")
    return path


@pytest.fixture
def zh() -> Iterator[None]:
    """Chinese for one test (tests/i18n), English again after it."""
    from tracer.i18n import set_language

    set_language("zh")
    try:
        yield
    finally:
        set_language("en")
