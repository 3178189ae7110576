"""A real nanoengine server in this process (uvicorn in a thread, the engine loop in another), on
a free port, for tests that also look at the engine (its block pool) through the loop; and
`nanoengine serve` as a process, its stdout read line by line (the served_process fixture); lm-eval
run against a server (evaluate)."""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from conftest import HANG_S, sigint_as_in_a_terminal, torch_threads

from nanoengine.engine import LLMEngine
from tracer.serve.server import Server, bind

WAIT = HANG_S  # a bound on waits for the server, never a guess at when it is ready
CLI = [sys.executable, "-m", "tracer.cli.main", "serve", "--threads", "1"]
SERVE_OPTIONS = dict(
    block_size=4, num_kv_blocks=512, max_num_batched_tokens=64, max_num_seqs=64, use_chat_template=False
)


def wait_healthy(url: str, timeout: float = WAIT) -> None:
    """GET /health until it answers 200 (the socket listens before uvicorn starts: usually at once)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=timeout).status_code == 200:
                return
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url}/health did not answer 200 within {timeout} s")


@contextmanager
def running_server(engine: LLMEngine | None = None, recorder=None, **options) -> Iterator[Server]:
    """options: Server's own (api_key, max_body_bytes)."""
    with torch_threads(1):
        engine = engine or LLMEngine("tiny", **SERVE_OPTIONS)
        server = Server(engine, bind("127.0.0.1", 0), recorder, **options).start_in_thread()
        try:
            wait_healthy(server.url)
            yield server
        finally:
            server.stop(timeout=WAIT)


def pool_state(engine) -> tuple[int, int]:
    """(free blocks, blocks in use), read in the loop thread between two steps."""
    bm = engine.block_manager
    return bm.num_free_blocks, sum(1 for r in bm.ref_counts if r)


class ServeProcess:
    """The server process, its stdout read line by line in a thread (waits are bounded)."""

    def __init__(self, *args: str) -> None:
        pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.proc = subprocess.Popen([*CLI, *args], **pipes, preexec_fn=sigint_as_in_a_terminal)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self.read, daemon=True).start()

    def read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, text: str) -> str:
        while True:
            line = self.lines.get(timeout=WAIT)
            assert line is not None, f"the server exited: {self.proc.stderr.read() if self.proc.stderr else ''}"
            if text in line:
                return line


TASKS = Path(__file__).resolve().parents[1] / "data" / "lm_eval"  # lm-eval task files, local data


@pytest.fixture(scope="module")
def served_process() -> Iterator[str]:
    """`nanoengine serve --model tiny` as a user starts it; its URL. A fixture: import it."""
    process = ServeProcess("--model", "tiny", "--port", "0")
    try:
        yield process.wait_for(" on http://").split(" on ")[1].strip()
    finally:
        process.proc.kill()
        process.proc.wait(timeout=WAIT)


def evaluate(url: str, task: str, monkeypatch: pytest.MonkeyPatch, **model_args: str) -> dict:
    """lm_eval.simple_evaluate with local-completions and only base_url and model set (plus
    model_args), on a task of tests/data/lm_eval; its results and samples."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing from a hub: the task's data is a local jsonl
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.chdir(TASKS)  # the task's data_files are relative to its folder
    args = {"base_url": f"{url}/v1/completions", "model": "tiny", **model_args}
    return lm_eval.simple_evaluate(
        model="local-completions",
        model_args=args,
        tasks=[task],
        task_manager=TaskManager(include_path=str(TASKS), include_defaults=False),
        log_samples=True,
    )
