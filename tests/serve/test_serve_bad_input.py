"""Bad requests get an OpenAI error body with 400/404 (never a 500 or a traceback) and the server
goes on serving; one request's failure inside a step is an error for that client only."""

from __future__ import annotations

import json

import httpx
import pytest
from serving import WAIT, running_server

OK_BODY = {"model": "tiny", "prompt": "hello", "max_tokens": 3, "temperature": 0}


@pytest.fixture(scope="module")
def server():
    with running_server() as server:
        yield server


def post(server, path: str, content: bytes | dict) -> httpx.Response:
    data = json.dumps(content).encode() if isinstance(content, dict) else content
    return httpx.post(f"{server.url}{path}", content=data, headers={"Content-Type": "application/json"}, timeout=WAIT)


def assert_error(response: httpx.Response, status: int, *words: str, param: str | None = None) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert all(w in error["message"] for w in words), error["message"]
    assert "Traceback" not in response.text


@pytest.mark.parametrize(
    "content, words, param",
    [
        (b'{"model": "tiny", "prompt": ', ["not valid JSON", "line 1"], None),
        (b'{"model": "tiny", "prompt": "caf\xe9"}', ["not UTF-8"], None),
        (b'["a list"]', ["must be a JSON object"], None),
        ({**OK_BODY, "n": 65}, ["n must be an integer in [1, 64]"], "n"),
        ({**OK_BODY, "n": 0}, ["n must be an integer in [1, 64]"], "n"),
        ({**OK_BODY, "max_tokens": 0}, ["max_tokens 0 returns nothing", "echo: true"], "max_tokens"),
        ({**OK_BODY, "max_tokens": -5}, ["max_tokens"], "max_tokens"),
        ({**OK_BODY, "max_tokens": 5000}, ["max_tokens is 5000", "max_model_len"], "max_tokens"),
        ({**OK_BODY, "prompt": "x" * 3000}, ["max_model_len is 2048"], "prompt"),
        ({**OK_BODY, "prompt": ""}, ["empty prompt"], "prompt"),
        ({**OK_BODY, "prompt": [1, 99999]}, ["token ids are integers"], "prompt"),
        ({**OK_BODY, "prompt": []}, ["empty prompt"], "prompt"),
        ({**OK_BODY, "prompt": ["a", [1]]}, ["a list of token-id lists"], "prompt"),
        ({**OK_BODY, "prompt": [[1], [99999]]}, ["prompt 1: ", "token ids are integers"], "prompt"),
        ({**OK_BODY, "logprobs": 21}, ["invalid 'logprobs'", "less than or equal to 20"], "logprobs"),
        ({**OK_BODY, "logprobs": True}, ["invalid 'logprobs'", "valid integer"], "logprobs"),
        ({**OK_BODY, "frobnicate": 1}, ["unsupported parameter 'frobnicate'"], "frobnicate"),
        ({**OK_BODY, "presence_penalty": 3}, ["presence_penalty must be in [-2.0, 2.0]"], "presence_penalty"),
        ({**OK_BODY, "repetition_penalty": 0}, ["repetition_penalty"], "repetition_penalty"),
        ({**OK_BODY, "logit_bias": {"x": 1}}, ["logit_bias keys are token ids"], "logit_bias"),
        ({**OK_BODY, "logit_bias": {"1": 500}}, ["logit_bias"], "logit_bias"),
        ({**OK_BODY, "stop_token_ids": [99999]}, ["stop_token_ids"], "stop_token_ids"),
        ({**OK_BODY, "temperature": -1}, ["temperature"], "temperature"),
        ({**OK_BODY, "top_p": 0}, ["top_p"], "top_p"),
        ({**OK_BODY, "seed": 2**40}, ["seed"], "seed"),
        ({**OK_BODY, "stop": [""]}, ["stop must be a list of non-empty strings"], "stop"),
        ({k: v for k, v in OK_BODY.items() if k != "prompt"}, ["missing required parameter 'prompt'"], "prompt"),
        (
            {**OK_BODY, "stream_options": {"include_usage": "maybe"}},
            ["stream_options.include_usage"],
            "stream_options.include_usage",
        ),
    ],
)
def test_a_bad_completion_request_is_a_400_and_the_server_goes_on(server, content, words, param):
    assert_error(post(server, "/v1/completions", content), 400, *words, param=param)
    assert post(server, "/v1/completions", OK_BODY).status_code == 200


@pytest.mark.parametrize(
    "body, words, param",
    [
        ({"model": "tiny", "messages": []}, ["messages"], "messages"),
        ({"model": "tiny", "messages": [{"role": "wizard", "content": "hi"}]}, ["messages.0.role"], "messages.0.role"),
        ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "tools": []}, ["'tools'"], "tools"),
        ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "n": 99}, ["n must be an integer"], "n"),
    ],
)
def test_a_bad_chat_request_is_a_400(server, body, words, param):
    assert_error(post(server, "/v1/chat/completions", body), 400, *words, param=param)


def test_an_unknown_model_is_a_404(server):
    response = post(server, "/v1/completions", {**OK_BODY, "model": "gpt-4"})
    assert_error(response, 404, "'gpt-4' is not served here", param="model")
    assert response.json()["error"]["code"] == "model_not_found"


def test_an_unknown_route_is_an_openai_404(server):
    response = httpx.get(f"{server.url}/v1/engines", timeout=WAIT)
    assert_error(response, 404, "/v1/engines")


def fail_after_first_token(server, prompt: str) -> None:
    """From the loop thread, right after the step that gives the request its first token: plant a bad
    token id (past add_request's check), so its next forward fails in the embedding lookup."""

    def on_step(appended):
        for seq in appended:
            if seq.prompt == prompt and seq.num_completion_tokens == 1:
                seq.token_ids[-1] = 10**6

    server.loop.call(lambda engine: server.loop.step_callbacks.append(on_step)).result(WAIT)


def test_a_step_failure_is_an_error_for_that_client_only(server):
    fail_after_first_token(server, "doomed")
    doomed = {"model": "tiny", "prompt": "doomed", "max_tokens": 50, "temperature": 0, "stream": True}
    with httpx.Client(base_url=server.url, timeout=WAIT) as client:
        with client.stream("POST", "/v1/completions", json=doomed | {"ignore_eos": True}) as response:
            events = [line for line in response.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        assert json.loads(events[0][6:])["choices"][0]["finish_reason"] is None  # its first token came
        error = json.loads(events[-2][6:])["error"]
        assert error["type"] == "server_error" and "IndexError" in error["message"]
        assert error["code"] == "engine_error"
        assert (
            client.post("/v1/completions", json=OK_BODY | {"max_tokens": 20}).json()["usage"]["completion_tokens"] == 20
        )


def test_a_non_streaming_step_failure_is_a_500_error_body(server):
    fail_after_first_token(server, "doomed too")
    response = post(server, "/v1/completions", {**OK_BODY, "prompt": "doomed too", "max_tokens": 10})
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["type"] == "server_error" and "IndexError" in error["message"] and "Traceback" not in response.text
    assert post(server, "/v1/completions", OK_BODY).status_code == 200
