"""One client cannot hurt the others: text that is not text, a stop string the trace cannot hold,
a huge body, a prompt too long to run, JSON nested too deep, values of the wrong type. Each is a
4xx for that client alone, answered without the engine thread; the server, the other requests and
the trace go on. An --api-key guards every route but /health."""

from __future__ import annotations

import json
import threading

import httpx
import pytest
from conftest import file_size_limit
from serving import SERVE_OPTIONS, WAIT, running_server
from test_serve_bad_input import OK_BODY, assert_error, post

from nanoengine.engine import LLMEngine
from tracer.trace.invariants import check_trace
from tracer.trace.recorder import TraceRecorder
from tracer.trace.trace_file import load_trace

BODY_LIMIT = 256 * 1024  # above the deepest JSON test body (200 kB)
KEY = "sk-test-key"


@pytest.fixture(scope="module")
def server():
    with running_server(max_body_bytes=BODY_LIMIT) as server:
        yield server


def test_a_lone_surrogate_in_a_prompt_or_a_message_is_a_400(server):
    prompt = b'{"model": "tiny", "prompt": "a\\ud800", "max_tokens": 4}'
    assert_error(post(server, "/v1/completions", prompt), 400, "lone surrogate", param="prompt")
    chat = b'{"model": "tiny", "messages": [{"role": "user", "content": "a\\ud800"}], "max_tokens": 4}'
    assert_error(post(server, "/v1/chat/completions", chat), 400, "lone surrogate", param="messages")
    assert post(server, "/v1/completions", OK_BODY).status_code == 200
    assert httpx.get(f"{server.url}/health", timeout=WAIT).status_code == 200


def test_a_bad_stop_string_as_the_first_request_leaves_a_trace_that_checks(tmp_path):
    path = tmp_path / "served.jsonl"
    engine = LLMEngine("tiny", **SERVE_OPTIONS)
    recorder = TraceRecorder(engine, path, title="served")
    with running_server(engine, recorder) as server:
        bad = b'{"model": "tiny", "prompt": "hello", "max_tokens": 4, "stop": "\\udfff"}'
        assert_error(post(server, "/v1/completions", bad), 400, "lone surrogate", param="stop")
        stream = OK_BODY | {"stream": True}
        with httpx.Client(base_url=server.url, timeout=WAIT) as client:
            with client.stream("POST", "/v1/completions", json=stream) as response:
                assert [line for line in response.iter_lines() if line][-1] == "data: [DONE]"
    recorder.close()
    trace = load_trace(path)
    assert check_trace(trace) == [] and len(trace.requests) == 1


def test_a_body_over_the_limit_is_a_413(server):
    big = json.dumps({**OK_BODY, "prompt": "x" * BODY_LIMIT}).encode()
    response = post(server, "/v1/completions", big)
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and f"{BODY_LIMIT:,} bytes" in error["message"]
    chunked = httpx.post(  # no Content-Length: the limit holds while the body is read
        f"{server.url}/v1/completions", content=iter([big[:BODY_LIMIT], big[BODY_LIMIT:]]), timeout=WAIT
    )
    assert chunked.status_code == 413
    assert post(server, "/v1/completions", OK_BODY).status_code == 200


@pytest.mark.parametrize(
    "prompt",
    ["x" * (BODY_LIMIT - 100), " ".join(["hello"] * 5000), list(range(5000))],
    ids=["chars", "words", "token ids"],
)
def test_a_prompt_too_long_is_refused_while_the_engine_thread_is_busy(server, prompt):
    """The loop thread is held in a call; the 400 comes anyway: nothing of it ran there."""
    held, release = threading.Event(), threading.Event()
    done = server.loop.call(lambda engine: (held.set(), release.wait(WAIT)))
    try:
        assert held.wait(WAIT)
        response = post(server, "/v1/completions", {**OK_BODY, "prompt": prompt})
    finally:
        release.set()
        done.result(WAIT)
    assert_error(response, 400, "max_model_len", param="prompt")


@pytest.mark.parametrize(
    "content, words",
    [
        (b'{"model": "tiny", "prompt": ' + b"[" * 1000 + b"]" * 1000 + b"}", ["nested"]),
        (b'{"model": "tiny", "prompt": ' + b"[" * 100000 + b"]" * 100000 + b"}", ["nested"]),
        (b'{"model": "tiny", "prompt": [' + b"9" * 5000 + b"]}", ["digits"]),
        (b'{"model": "tiny", "prompt": "a", "presence_penalty": NaN}', ["NaN", "not a JSON number"]),
        (b'{"model": "tiny", "prompt": "a", "best_of": -Infinity}', ["-Infinity", "not a JSON number"]),
    ],
    ids=["depth 1,000", "depth 100,000", "5,000 digits", "NaN", "-Infinity"],
)
def test_json_nested_too_deep_or_a_huge_integer_is_a_400(server, content, words):
    assert_error(post(server, "/v1/completions", content), 400, *words)
    assert post(server, "/v1/completions", OK_BODY).status_code == 200


@pytest.mark.parametrize(
    "field, value",
    [("max_tokens", True), ("prompt", [True, False]), ("temperature", "0.5"), ("seed", 1.5), ("top_k", False)],
)
def test_values_of_the_wrong_type_are_a_400_not_converted(server, field, value):
    assert_error(post(server, "/v1/completions", {**OK_BODY, field: value}), 400, field, param=field)


def test_top_k_minus_one_means_off_as_in_vllm(server):
    off = post(server, "/v1/completions", {**OK_BODY, "top_k": -1}).json()
    assert off["choices"][0]["text"] == post(server, "/v1/completions", OK_BODY).json()["choices"][0]["text"]
    assert_error(post(server, "/v1/completions", {**OK_BODY, "top_k": -2}), 400, "top_k", param="top_k")


def test_an_api_key_guards_every_route_but_health():
    with running_server(api_key=KEY) as server:
        with httpx.Client(base_url=server.url, timeout=WAIT) as client:
            assert client.get("/health").status_code == 200
            for method, route in [("GET", "/v1/models"), ("POST", "/v1/completions"), ("GET", "/v1/nowhere")]:
                for headers in [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}]:
                    response = client.request(method, route, json=OK_BODY, headers=headers)
                    assert response.status_code == 401, (route, headers)
                    assert response.json()["error"]["code"] == "invalid_api_key"
            good = {"Authorization": f"Bearer {KEY}"}
            assert client.get("/v1/models", headers=good).status_code == 200
            assert client.post("/v1/completions", json=OK_BODY, headers=good).status_code == 200


def test_a_trace_that_cannot_be_written_leaves_the_server_serving_and_health_says_so(tmp_path):
    """A full disk (RLIMIT_FSIZE: EFBIG, as ENOSPC) stops the recording, never the requests."""
    path = tmp_path / "served.jsonl"
    engine = LLMEngine("tiny", **SERVE_OPTIONS)
    recorder = TraceRecorder(engine, path, title="served")
    with running_server(engine, recorder) as server:
        assert post(server, "/v1/completions", OK_BODY).status_code == 200
        assert httpx.get(f"{server.url}/health", timeout=WAIT).json() == {"status": "ok"}
        with file_size_limit(path.stat().st_size + 100):
            for _ in range(3):
                assert post(server, "/v1/completions", OK_BODY).status_code == 200
        health = httpx.get(f"{server.url}/health", timeout=WAIT)
        assert health.status_code == 200 and health.json()["status"] == "ok"
        assert health.json()["trace"].startswith("recording stopped: ") and "File too large" in health.json()["trace"]
        assert post(server, "/v1/completions", OK_BODY).status_code == 200
    recorder.close()
    trace = load_trace(path, validate="all")
    assert trace.num_steps >= 1 and check_trace(trace) == []
