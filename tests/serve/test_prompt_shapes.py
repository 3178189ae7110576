"""Prompts in every shape, through the official openai client: completions' prompt as a string, a
list of strings, token ids or token-id lists (one choice per prompt, indexed in prompt order, each
equal to LLM.generate's, streamed or not); chat content as a string, text parts, or null on an
assistant message. A wrong shape is a 400 that names the shapes allowed."""

from __future__ import annotations

import time
from collections import defaultdict

import httpx
import openai
import pytest
from openai import OpenAI
from serving import SERVE_OPTIONS, WAIT, pool_state, running_server

from nanoengine.llm import LLM
from nanoengine.sampling_params import SamplingParams

PROMPTS = ["The cat sat on the", "Once upon a time", "hello"]
IDS = [[40, 41, 42, 43, 44], [50, 51, 52]]


@pytest.fixture(scope="module")
def server():
    with running_server() as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def generate():
    llm = LLM("tiny", **SERVE_OPTIONS)
    return lambda prompts: [o.text for o in llm.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))]


def complete(client, prompt, **kw):
    return client.completions.create(
        model="tiny", prompt=prompt, max_tokens=8, temperature=0, extra_body={"ignore_eos": True}, **kw
    )


@pytest.mark.parametrize("prompts", [PROMPTS[:1], PROMPTS, IDS[:1], IDS], ids=["1 str", "3 str", "1 ids", "2 ids"])
def test_each_prompt_is_a_choice_in_prompt_order(client, generate, prompts):
    out = complete(client, prompts)
    assert [c.index for c in out.choices] == list(range(len(prompts)))
    assert [c.text for c in out.choices] == generate(prompts)
    assert out.usage.completion_tokens == 8 * len(prompts)


def test_a_flat_list_of_ids_is_one_prompt(client, generate):
    out = complete(client, IDS[0])
    assert [c.text for c in out.choices] == generate(IDS[:1])


def test_streamed_choices_add_up_per_index(client, generate):
    texts: dict[int, str] = defaultdict(str)
    finish: dict[int, str] = {}
    chunks = list(complete(client, PROMPTS, stream=True, stream_options={"include_usage": True}))
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            if choice.finish_reason:
                finish[choice.index] = choice.finish_reason
    assert [texts[i] for i in range(3)] == generate(PROMPTS)
    assert finish == {0: "length", 1: "length", 2: "length"}
    assert chunks[-1].usage.completion_tokens == 24


def test_hanging_up_a_stream_of_several_choices_aborts_them_all(server):
    body = {"model": "tiny", "prompt": PROMPTS, "max_tokens": 300, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=WAIT) as response:
        next(line for line in response.iter_lines() if line.startswith("data: "))  # then hang up
    deadline = time.monotonic() + WAIT
    while server.loop.call(lambda e: e.has_unfinished()).result(WAIT):
        assert time.monotonic() < deadline, "the choices were not aborted"
    assert server.loop.call(pool_state).result(WAIT)[1] == 0


@pytest.mark.parametrize("prompt", [[], [1, "a"], [[1], "a"], {"text": "hi"}, [[1.5]]])
def test_a_wrong_prompt_shape_names_the_shapes(client, prompt):
    with pytest.raises(openai.BadRequestError) as e:
        complete(client, prompt)
    error = e.value.body
    assert error["param"] == "prompt"
    assert "empty prompt" in error["message"] or "a list of token-id lists" in error["message"]


def test_one_bad_prompt_of_several_is_named(client):
    with pytest.raises(openai.BadRequestError) as e:
        complete(client, [[1, 2], [99999]])
    assert e.value.body["message"].startswith("prompt 1: ")


def chat(client, messages):
    return client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0)


def test_chat_content_as_a_string_or_text_parts_is_the_same_prompt(client):
    as_string = chat(client, [{"role": "user", "content": "Hello there"}])
    parts = [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]
    as_parts = chat(client, [{"role": "user", "content": parts}])
    assert as_string.choices[0].message.content == as_parts.choices[0].message.content
    assert as_string.usage.prompt_tokens == as_parts.usage.prompt_tokens


def test_chat_history_with_a_null_assistant_message_and_a_tool_reply(client):
    messages = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
    ]
    assert chat(client, messages).choices[0].message.role == "assistant"


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": None},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
        {"role": "user", "content": 5},
    ],
)
def test_a_wrong_content_shape_names_the_shapes(client, message):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, [message])
    assert "null on an assistant message" in e.value.body["message"]
    assert e.value.body["param"].startswith("messages.0")
