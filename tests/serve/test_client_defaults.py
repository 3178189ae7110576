"""Real clients' default request bodies, byte for byte as they send them (issue 35): each was
refused before (400) and is served now. A value that would change the output and is not
implemented is still refused, by name."""

from __future__ import annotations

import json

import httpx
import pytest
from serving import WAIT, running_server

IDS = [40, 41, 42, 43, 44]
CLIENT_BODIES = {
    # vllm bench serve --backend vllm / openai (completions, streaming)
    "vllm bench serve": {
        "model": "tiny",
        "prompt": "The cat sat on the",
        "temperature": 0.0,
        "repetition_penalty": 1.0,
        "max_tokens": 8,
        "logprobs": None,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    },
    # langchain_openai.OpenAI(): its _default_params and a batch of one prompt
    "langchain OpenAI": {
        "model": "tiny",
        "prompt": ["The cat sat on the"],
        "temperature": 0.7,
        "top_p": 1,
        "frequency_penalty": 0,
        "presence_penalty": 0,
        "n": 1,
        "logprobs": None,
        "seed": None,
        "max_tokens": 8,
    },
    # lm-evaluation-harness local-completions, generate_until: a batch of token-id lists
    "lm-eval local-completions": {
        "model": "tiny",
        "prompt": [IDS],
        "max_tokens": 8,
        "temperature": 0,
        "stop": ["\n\n"],
        "seed": 1234,
    },
    "neutral OpenAI fields": {
        "model": "tiny",
        "prompt": "hello",
        "max_tokens": 4,
        "logprobs": False,
        "best_of": 1,
        "echo": False,
        "suffix": None,
        "n": None,  # null means "left out", as in OpenAI's API
        "temperature": None,
        "user": "someone",
        "store": False,
        "metadata": {"run": "7"},
        "service_tier": "auto",
        "response_format": {"type": "text"},
        "stream_options": {"include_usage": False, "include_obfuscation": False, "continuous_usage_stats": False},
    },
    "neutral vLLM fields": {
        "model": "tiny",
        "prompt": "hello",
        "max_tokens": 4,
        "use_beam_search": False,
        "length_penalty": 1.0,
        "include_stop_str_in_output": False,
        "skip_special_tokens": True,
        "prompt_logprobs": None,
        "min_p": 0.0,
        "min_tokens": 0,
        "stop_token_ids": [],
        "logit_bias": {},
        "priority": 0,
    },
}
CHAT_BODIES = {
    "a tool-call history (assistant content null, a tool message)": {
        "model": "tiny",
        "max_tokens": 4,
        "messages": [
            {"role": "user", "content": "What is the weather?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}],
            },
            {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
        ],
    },
    "neutral chat fields": {
        "model": "tiny",
        "max_completion_tokens": 4,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "logprobs": False,
        "top_logprobs": 0,
        "tools": None,
        "tool_choice": "none",
        "parallel_tool_calls": True,
        "response_format": {"type": "text"},
        "modalities": ["text"],
        "user": "u",
        "store": False,
        "metadata": {},
        "service_tier": "default",
        "presence_penalty": 0,
        "frequency_penalty": 0,
    },
}


@pytest.fixture(scope="module")
def server():
    with running_server() as server:
        yield server


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=WAIT)


def stream_events(server, body: dict) -> list[dict]:
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=WAIT) as response:
        assert response.status_code == 200, response.read()
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize("client", CLIENT_BODIES)
def test_a_clients_default_completion_body_is_served(server, client):
    body = CLIENT_BODIES[client]
    if body.get("stream"):
        events = stream_events(server, body)
        assert events[-1]["usage"]["completion_tokens"] == body["max_tokens"]
        assert "".join(e["choices"][0]["text"] for e in events if e["choices"])
        return
    response = post(server, "/v1/completions", body)
    assert response.status_code == 200, response.text
    (choice,) = response.json()["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize("history", CHAT_BODIES)
def test_a_chat_body_with_neutral_fields_or_tool_history_is_served(server, history):
    response = post(server, "/v1/chat/completions", CHAT_BODIES[history])
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["role"] == "assistant"


def test_the_tool_history_reaches_the_model(server):
    """The tiny model has no chat template: the prompt shows every turn, the tool's too."""
    body = CHAT_BODIES["a tool-call history (assistant content null, a tool message)"] | {"return_token_ids": True}
    ids = post(server, "/v1/chat/completions", body).json()["choices"][0]["prompt_token_ids"]
    text = server.loop.engine.tokenizer.decode(ids)
    assert text == "user: What is the weather?\nassistant: \ntool: sunny\nassistant:"


OK = {"model": "tiny", "prompt": "hello", "max_tokens": 3}


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"top_logprobs": 2}, "top_logprobs"),  # completions' k is logprobs
        ({"best_of": 3}, "best_of"),
        ({"suffix": "the end"}, "suffix"),
        ({"include_stop_str_in_output": True}, "include_stop_str_in_output"),  # use_beam_search is served now
        ({"stream_options": {"continuous_usage_stats": True}}, "stream_options.continuous_usage_stats"),
    ],
)
def test_a_value_that_would_change_the_output_is_refused_by_name(server, extra, param):
    response = post(server, "/v1/completions", OK | extra)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert error["message"].startswith("unsupported value ") and f"for {param!r}" in error["message"]
    assert "neutral value" in error["message"] and "\n" not in error["message"]


def test_chat_refuses_a_completions_only_field_and_real_tools(server):
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    assert post(server, "/v1/chat/completions", chat | {"best_of": 1}).json()["error"]["param"] == "best_of"
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    error = post(server, "/v1/chat/completions", chat | {"tools": tools}).json()["error"]
    assert error["param"] == "tools" and "neutral value (null)" in error["message"]
