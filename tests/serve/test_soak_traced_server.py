"""The traced server's soak (slow: `python -m pytest -m slow tests/serve/test_soak_traced_server.py -s
-n 0`): 2,000 mixed requests against `serve --trace` in this process, 16 at a time on loopback —
completions and chat, streaming or not, clients that hang up mid-stream (aborts), bodies the server
refuses. The trace's step lines stay the same size as requests pile up (schema version 4 writes
the live sequences and the changed blocks, not every request ever seen) and the trace checks."""

from __future__ import annotations

import asyncio
import json
import random
import statistics

import httpx
import pytest
from serving import SERVE_OPTIONS, WAIT, running_server

from nanoengine.engine import LLMEngine
from tracer.trace.invariants import check_trace
from tracer.trace.recorder import TraceRecorder
from tracer.trace.trace_file import load_trace

pytestmark = pytest.mark.slow
NUM_REQUESTS = 2000
AT_ONCE = 16
BAD_BODIES = (b"{", b'{"model": "tiny"}', b'{"model": "tiny", "prompt": "a", "max_tokens": true}')


async def one_request(client: httpx.AsyncClient, i: int, rng: random.Random) -> str:
    kind = rng.choice(["completion", "chat", "stream", "hang_up", "bad"])
    prompt = f"request {i}: " + "word " * rng.randint(1, 12)
    body = {"model": "tiny", "max_tokens": rng.randint(1, 24), "ignore_eos": True}
    if kind == "bad":
        response = await client.post("/v1/completions", content=rng.choice(BAD_BODIES))
        assert response.status_code == 400, response.text
        return kind
    if kind == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        return kind
    body["prompt"] = prompt
    if kind == "completion":
        response = await client.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        return kind
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True, "max_tokens": 24}) as r:
        async for line in r.aiter_lines():
            if kind == "hang_up" and line.startswith("data: {"):
                break  # the client hangs up mid-stream: its request is aborted
    return kind


async def soak(url: str) -> dict[str, int]:
    rng = random.Random(0)
    counts: dict[str, int] = {}
    limit = asyncio.Semaphore(AT_ONCE)

    async def limited(client: httpx.AsyncClient, i: int) -> None:
        async with limit:
            kind = await one_request(client, i, rng)
            counts[kind] = counts.get(kind, 0) + 1

    async with httpx.AsyncClient(base_url=url, timeout=WAIT) as client:
        await asyncio.gather(*(limited(client, i) for i in range(NUM_REQUESTS)))
    return counts


def test_a_traced_server_under_2000_mixed_requests_keeps_its_step_lines_flat_and_checks(tmp_path):
    path = tmp_path / "soak.jsonl"
    engine = LLMEngine("tiny", **SERVE_OPTIONS)
    recorder = TraceRecorder(engine, path, title="soak")
    with running_server(engine, recorder) as server:
        counts = asyncio.run(soak(server.url))
    recorder.close()
    assert recorder.failed is None
    sizes = [len(line) for line in path.read_bytes().splitlines()[1:]]
    quarter = len(sizes) // 4
    first, last = statistics.median(sizes[:quarter]), statistics.median(sizes[-quarter:])
    trace = load_trace(path, validate="all")
    violations = check_trace(trace)
    print(
        json.dumps(
            {
                "requests": counts,
                "steps": len(sizes),
                "bytes": path.stat().st_size,
                "median_line_first_quarter": first,
                "median_line_last_quarter": last,
                "violations": len(violations),
            }
        )
    )
    assert sum(counts.values()) == NUM_REQUESTS and len(trace.requests) >= NUM_REQUESTS * 0.7
    assert last <= 2 * first, (first, last)  # flat: v3 lines grew with every request ever seen
    assert violations == []
