"""A real nanoengine server in this process (uvicorn in a thread, the engine loop in another), on
a free port, for tests that also look at the engine (its block pool) through the loop; and
`nanoengine serve` as a process, its stdout read line by line."""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
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
