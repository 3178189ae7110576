"""`nanoengine serve --tui`: the live app over a real server's engine loop. An HTTP client's request
appears in the app as it arrives; pausing the engine makes its stream wait (and the screen says so);
resuming lets it finish. Waits are for conditions, never for a fixed time."""

from __future__ import annotations

import json
import threading

import httpx
import pytest
from conftest import HANG_S, run_async, torch_threads, wait_until

from nanoengine.engine import LLMEngine
from nanoengine.sampling_params import SamplingParams
from tracer.live.session import LiveSession
from tracer.serve.server import Server, bind
from tracer.trace.invariants import check_trace
from tracer.trace.recorder import TraceRecorder
from tracer.trace.trace_file import load_trace

SIZE = (110, 34)
OPTIONS = dict(block_size=4, num_kv_blocks=256, max_num_batched_tokens=64, max_num_seqs=8, use_chat_template=False)


class StreamingClient(threading.Thread):
    """One streamed completion, its chunks collected as they come."""

    def __init__(self, url: str, prompt: str, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.url, self.prompt, self.max_tokens = url, prompt, max_tokens
        self.chunks: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        body = {"model": "tiny", "prompt": self.prompt, "max_tokens": self.max_tokens, "stream": True}
        body["ignore_eos"] = True
        with httpx.stream("POST", f"{self.url}/v1/completions", json=body, timeout=HANG_S) as response:
            for line in response.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    self.chunks.append(json.loads(line[6:])["choices"][0]["text"])
        self.done.set()


@pytest.fixture
def served(tmp_path):
    with torch_threads(1):
        engine = LLMEngine("tiny", **OPTIONS)
        recorder = TraceRecorder(engine, tmp_path / "served.jsonl", title="served")
        server = Server(engine, bind("127.0.0.1", 0), recorder)
        session = LiveSession.over_loop(server.loop, recorder, SamplingParams(max_tokens=8))
        server.start_in_thread()
        try:
            yield server, session
        finally:
            server.stop(timeout=HANG_S)
            session.close()
            recorder.close()


def loop_steps(server) -> int:
    return server.loop.call(lambda engine: engine.num_steps).result(HANG_S)


@run_async
async def test_a_clients_request_appears_and_pausing_makes_its_stream_wait(served):
    server, session = served
    app = session.app(animations=False)
    async with app.run_test(size=SIZE) as pilot:
        assert not app.steps and "idle" in session.control.state()
        first = StreamingClient(server.url, "hello from http", 4)
        first.start()
        await wait_until(pilot, app, lambda: first.done.is_set() and len(app.steps) >= 4, "the first request")
        assert any(r["prompt"] == "hello from http" for r in app.header["requests"])
        await pilot.press("space")  # pause the engine
        assert "HTTP streams wait" in session.control.state()
        await pilot.pause()
        assert "HTTP streams wait" in app.query_one("#timeline").status
        count = loop_steps(server)
        second = StreamingClient(server.url, "waits for the engine", 6)
        second.start()
        await wait_until(pilot, app, lambda: server.loop.live, "the second request to be admitted")
        assert loop_steps(server) == count  # admitted, but no step: the stream waits
        assert second.chunks == [] and not second.done.is_set()
        await pilot.press("space")  # resume
        await wait_until(pilot, app, lambda: second.done.is_set(), "the stream to finish")
        assert "".join(second.chunks)
        await wait_until(
            pilot,
            app,
            lambda: any(r["prompt"] == "waits for the engine" for r in app.header["requests"]),
            "the second request in the app",
        )
    server.stop(timeout=HANG_S)
    session.recorder.close()
    trace = load_trace(session.recorder.path, validate="all")
    assert not check_trace(trace) and len(trace.requests) == 2


def test_serve_tui_refuses_a_redirected_terminal_before_the_model_loads(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    env.pop("TEXTUAL_DRIVER", None)
    out = subprocess.run(
        [sys.executable, "-m", "tracer.cli.main", "serve", "--tui", "--model", "tiny", "--port", "0"],
        capture_output=True,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
        cwd=tmp_path,
        timeout=HANG_S,
    )
    assert out.returncode == 2 and "interactive terminal" in out.stderr and "Traceback" not in out.stderr
    assert "Loading model" not in out.stderr
