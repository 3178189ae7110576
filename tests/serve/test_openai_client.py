"""The server through the official openai client: completions and chat, streaming and not, usage,
stop strings; greedy output equals LLM.generate's, token for token."""

from __future__ import annotations

import pytest
from openai import OpenAI
from serving import SERVE_OPTIONS, running_server

from nanoengine.llm import LLM
from nanoengine.sampling_params import SamplingParams

PROMPT = "The cat sat on the"


@pytest.fixture(scope="module")
def server():
    with running_server() as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def reference():
    """What LLM.generate gives for the same requests (the server's engine runs without a template)."""
    llm = LLM("tiny", **SERVE_OPTIONS)
    return lambda prompt, **kw: llm.generate([prompt], SamplingParams(**kw))[0]


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == ["tiny"]


def test_completion_equals_generate_token_for_token(client, reference):
    out = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=12, temperature=0, extra_body={"return_token_ids": True}
    )
    want = reference(PROMPT, max_tokens=12)
    choice = out.choices[0]
    assert choice.text == want.text and choice.model_extra["token_ids"] == want.token_ids
    assert choice.model_extra["prompt_token_ids"] == want.prompt_token_ids
    assert choice.finish_reason == "length"
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(want.prompt_token_ids), 12)
    assert out.usage.total_tokens == len(want.prompt_token_ids) + 12


def test_streamed_completion_adds_up_to_the_same_text(client, reference):
    stream = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=12, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == reference(PROMPT, max_tokens=12).text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12


def test_token_id_prompts_and_seeded_sampling(client, reference):
    ids = [40, 41, 42, 43, 44]
    kw = dict(max_tokens=8, temperature=0.9, top_p=0.9, seed=7)
    out = client.completions.create(model="tiny", prompt=ids, extra_body={"top_k": 20, "return_token_ids": True}, **kw)
    assert out.choices[0].model_extra["token_ids"] == reference(ids, top_k=20, **kw).token_ids


def test_chat_streaming_and_not(client, reference):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]
    prompt = "system: Be brief.\nuser: Hello!\nassistant:"  # the tiny model has no template: role lines
    want = reference(prompt, max_tokens=10)
    out = client.chat.completions.create(model="tiny", messages=messages, max_completion_tokens=10, temperature=0)
    assert out.choices[0].message.role == "assistant" and out.choices[0].message.content == want.text
    assert out.object == "chat.completion" and out.usage.completion_tokens == 10
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want.text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_a_stop_string_never_reaches_the_client(client, reference):
    full = reference(PROMPT, max_tokens=20, ignore_eos=True).text
    stop = full[6:8]  # two characters the greedy completion is known to produce
    want = reference(PROMPT, max_tokens=20, ignore_eos=True, stop=[stop])
    assert want.finish_reason == "stop" and stop not in want.text
    kw = dict(model="tiny", prompt=PROMPT, max_tokens=20, temperature=0, stop=stop, extra_body={"ignore_eos": True})
    assert client.completions.create(**kw).choices[0].text == want.text
    chunks = [c for c in client.completions.create(stream=True, **kw) if c.choices]
    assert "".join(c.choices[0].text for c in chunks) == want.text
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_vllms_sampler_parameters_reach_the_engine(client, reference):
    """OpenAI's penalties and logit_bias (token ids as strings) and vLLM's extras give the tokens
    LLM.generate gives with the same SamplingParams, and differ from the plain greedy run."""
    plain = reference(PROMPT, max_tokens=12, ignore_eos=True)
    banned = plain.token_ids[0]
    extra = {"repetition_penalty": 1.3, "min_p": 0.05, "min_tokens": 3, "stop_token_ids": [7], "ignore_eos": True}
    out = client.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=12,
        temperature=0,
        presence_penalty=0.5,
        frequency_penalty=0.3,
        logit_bias={str(banned): -100},
        extra_body=extra | {"return_token_ids": True},
    )
    want = reference(
        PROMPT,
        max_tokens=12,
        presence_penalty=0.5,
        frequency_penalty=0.3,
        logit_bias={banned: -100},
        **extra,
    )
    assert out.choices[0].model_extra["token_ids"] == want.token_ids
    assert want.token_ids[0] != banned and want.token_ids != plain.token_ids
