"""32 streaming clients at once all finish with the tokens LLM.generate gives; a client that drops
mid-stream has its request aborted and its blocks freed, and the others' outputs do not change."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
from serving import SERVE_OPTIONS, WAIT, pool_state, running_server

from nanoengine.llm import LLM
from nanoengine.sampling_params import SamplingParams
from nanoengine.sequence import EventKind
from tracer.trace.invariants import check_trace
from tracer.trace.recorder import TraceRecorder
from tracer.trace.trace_file import load_trace

NUM_CLIENTS = 32
MAX_TOKENS = 16
PROMPTS = [f"client {i} says hello number {i * 7}" for i in range(NUM_CLIENTS)]


async def stream_tokens(client: httpx.AsyncClient, prompt: str, max_tokens: int, drop_after: int | None = None):
    """The streamed token ids (return_token_ids) of one request; with drop_after, hang up after that many."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    body |= {"ignore_eos": True, "return_token_ids": True}
    tokens: list[int] = []
    async with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            tokens += choice.get("token_ids", [])
            if drop_after is not None and len(tokens) >= drop_after:
                return tokens  # leaving the block closes the connection mid-stream
    return tokens


async def run_clients(url: str, drop: int | None = None) -> list[list[int]]:
    limits = httpx.Limits(max_connections=NUM_CLIENTS + 1)
    async with httpx.AsyncClient(base_url=url, timeout=WAIT, limits=limits) as client:
        jobs = [
            stream_tokens(client, p, 400 if i == drop else MAX_TOKENS, 2 if i == drop else None)
            for i, p in enumerate(PROMPTS)
        ]
        return await asyncio.gather(*jobs)


def expected() -> list[list[int]]:
    llm = LLM("tiny", **SERVE_OPTIONS)
    return [o.token_ids for o in llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))]


def wait_until_idle(server) -> tuple[int, int]:
    """The block pool once the engine has no request left (bounded)."""
    deadline = time.monotonic() + WAIT
    while server.loop.call(lambda e: e.has_unfinished()).result(WAIT) or server.loop.live:
        assert time.monotonic() < deadline, "requests still running"
        server.loop.call(lambda e: None).result(WAIT)  # one pass of the loop: no sleep at a guessed moment
    return server.loop.call(pool_state).result(WAIT)


def test_32_concurrent_streams_all_finish_with_generates_tokens():
    with running_server() as server:
        outputs = asyncio.run(run_clients(server.url))
        assert outputs == expected()
        assert wait_until_idle(server)[1] == 0


def test_a_client_dropped_mid_stream_is_aborted_and_frees_its_blocks(tmp_path):
    drop = 5
    engine_options = {**SERVE_OPTIONS}
    from nanoengine.engine import LLMEngine

    engine = LLMEngine("tiny", **engine_options)
    path = tmp_path / "served.jsonl"
    recorder = TraceRecorder(engine, path)
    with running_server(engine, recorder) as server:
        outputs = asyncio.run(run_clients(server.url, drop=drop))
        num_free, num_used = wait_until_idle(server)
        assert num_used == 0 and num_free == SERVE_OPTIONS["num_kv_blocks"]
    recorder.close()
    want = expected()
    assert len(outputs[drop]) == 2
    assert [o for i, o in enumerate(outputs) if i != drop] == [w for i, w in enumerate(want) if i != drop]
    trace = load_trace(path, "all")
    assert check_trace(trace) == []
    dropped = next(r["seq_id"] for r in trace.requests.values() if r["prompt"] == PROMPTS[drop])
    finished = [
        e for s in trace.steps for e in s["events"] if e["kind"] == EventKind.FINISHED and e["seq_id"] == dropped
    ]
    assert [e["detail"]["reason"] for e in finished] == ["abort"]
    assert all(r["http_request_id"].startswith("cmpl-") for r in trace.requests.values())
