"""vLLM's `use_beam_search` through the official openai client against `nanoengine serve --model
tiny`: n beams, the choices are LLM.beam_search's hypotheses, best first (through the same chat
rendering for chat); streamed, they come whole at the end; what a beam search cannot honour is a
400 that names the field. The search's first beam is often pruned while the others run on (the
prompts here are ones where it is): the server must not lose the request then."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from openai import BadRequestError, OpenAI
from serving import WAIT, pool_state, running_server, served_process  # noqa: F401 (a fixture)

from nanoengine import LLM, BeamSearchParams
from tracer.serve.chat import render_chat
from tracer.serve.protocol import Message

PROMPTS = ["abc", "The cat sat on the"]  # the second has a hypothesis that ends in EOS
BEAM = {"use_beam_search": True}


@pytest.fixture(scope="module")
def client(served_process):  # noqa: F811
    return OpenAI(base_url=f"{served_process}/v1", api_key="unused", max_retries=0, timeout=WAIT)


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny")  # the engine `serve --model tiny` runs, with its defaults


def expected(llm, prompt: str, n: int, max_tokens: int) -> list:
    params = BeamSearchParams(beam_width=n, max_tokens=max_tokens)
    return llm.beam_search([prompt], params)[0].sequences


def test_completion_choices_are_llm_beam_search_best_first(client, llm):
    out = client.completions.create(model="tiny", prompt=PROMPTS, n=3, max_tokens=6, temperature=0, extra_body=BEAM)
    want = [s for p in PROMPTS for s in expected(llm, p, 3, 6)]
    assert [c.index for c in out.choices] == list(range(6))
    assert [(c.text, c.finish_reason) for c in out.choices] == [(s.text, s.finish_reason) for s in want]
    assert "stop" in {c.finish_reason for c in out.choices}  # an EOS hypothesis is among them
    num_prompt = sum(len(llm.engine.tokenizer.encode(p)) for p in PROMPTS)
    num_output = sum(len(s.tokens) for s in want) - num_prompt * 3  # every beam's tokens, as vLLM counts
    assert out.usage.prompt_tokens == num_prompt and out.usage.completion_tokens == num_output


def test_chat_choices_are_llm_beam_search_through_the_same_rendering(client, llm):
    messages = [{"role": "user", "content": "The cat sat"}]
    out = client.chat.completions.create(
        model="tiny", messages=messages, n=2, max_tokens=5, temperature=0, extra_body=BEAM
    )
    prompt = render_chat(llm.engine.tokenizer, [Message(**m) for m in messages])
    want = expected(llm, prompt, 2, 5)
    assert [(c.index, c.message.content, c.finish_reason) for c in out.choices] == [
        (i, s.text, s.finish_reason) for i, s in enumerate(want)
    ]


def test_each_token_has_the_beams_logprob_and_the_k_likeliest(client, llm):
    out = client.completions.create(
        model="tiny", prompt=PROMPTS[0], n=2, max_tokens=4, temperature=0, logprobs=1, extra_body=BEAM
    )
    for choice, beam in zip(out.choices, expected(llm, PROMPTS[0], 2, 4)):
        assert choice.logprobs is not None
        tokens = beam.tokens[-4:]
        want = [entry[t].logprob for t, entry in zip(tokens, beam.logprobs)]
        assert choice.logprobs.token_logprobs == pytest.approx(want, abs=1e-5)
        assert sum(choice.logprobs.token_logprobs) == pytest.approx(beam.cum_logprob, abs=1e-4)
        assert all(1 <= len(top) <= 2 for top in choice.logprobs.top_logprobs)  # its token and the likeliest


def test_a_streamed_beam_search_comes_whole_at_its_end(client):
    whole = client.completions.create(
        model="tiny", prompt=PROMPTS[1], n=3, max_tokens=6, temperature=0, extra_body=BEAM
    )
    stream = client.completions.create(
        model="tiny",
        prompt=PROMPTS[1],
        n=3,
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=BEAM,
    )
    texts, reasons, usage = ["", "", ""], [None, None, None], None
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.text
            reasons[c.index] = c.finish_reason or reasons[c.index]
        usage = chunk.usage or usage
    assert texts == [c.text for c in whole.choices]
    assert reasons == [c.finish_reason for c in whole.choices]
    assert usage == whole.usage


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"n": 11}, "n"),
        ({"top_p": 0.5}, "top_p"),
        ({"stop": ["x"]}, "stop"),
        ({"logit_bias": {"5": 1.0}}, "logit_bias"),
        ({"seed": 3, "temperature": 0.7}, "seed"),
        ({"guided_regex": "[a-z]+"}, "guided_regex"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"logprobs": 5}, "logprobs"),  # n 2: each beam keeps the 4 likeliest
        ({"logprobs": 1, "echo": True}, "echo"),
        ({"max_tokens": 0, "echo": True}, "max_tokens"),
    ],
)
def test_what_a_beam_search_cannot_honour_is_refused_by_name(served_process, extra, param):  # noqa: F811
    body = {"model": "tiny", "prompt": "abc", "n": 2, "max_tokens": 3, "temperature": 0, **BEAM} | extra
    response = httpx.post(f"{served_process}/v1/completions", json=body, timeout=WAIT)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and "\n" not in error["message"], error


def test_chat_refuses_top_logprobs_beyond_the_beams(client):
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(BadRequestError) as caught:
        client.chat.completions.create(
            model="tiny", messages=messages, n=1, max_tokens=3, logprobs=True, top_logprobs=3, extra_body=BEAM
        )
    assert "top_logprobs <= 2" in str(caught.value)


def test_length_penalty_without_a_beam_search_is_refused(served_process):  # noqa: F811
    body = {"model": "tiny", "prompt": "abc", "max_tokens": 3, "length_penalty": 2.0}
    response = httpx.post(f"{served_process}/v1/completions", json=body, timeout=WAIT)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "length_penalty"


def test_length_penalty_reaches_the_search(client, llm):
    """A penalty that favours long hypotheses changes the ranking as it changes LLM.beam_search's."""
    extra = BEAM | {"length_penalty": 10.0}
    out = client.completions.create(model="tiny", prompt=PROMPTS[1], n=3, max_tokens=6, temperature=0, extra_body=extra)
    params = BeamSearchParams(beam_width=3, max_tokens=6, length_penalty=10.0)
    want = llm.beam_search([PROMPTS[1]], params)[0].sequences
    assert [c.text for c in out.choices] == [s.text for s in want]
    assert [c.text for c in out.choices] != [s.text for s in expected(llm, PROMPTS[1], 3, 6)]


def test_the_server_goes_on_after_beam_searches(served_process):  # noqa: F811
    body = {"model": "tiny", "prompt": "abc", "max_tokens": 3, "temperature": 0}
    response = httpx.post(f"{served_process}/v1/completions", json=body, timeout=WAIT)
    assert response.status_code == 200, response.text
    assert json.loads(response.text)["choices"][0]["finish_reason"] == "length"


def test_a_client_that_goes_away_has_its_beam_search_aborted_and_its_blocks_freed():
    body = {"model": "tiny", "prompt": "abc", "n": 4, "max_tokens": 500, "ignore_eos": True, "temperature": 0, **BEAM}
    with running_server() as server:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server.url}/v1/completions", json=body, timeout=0.5)
        deadline = time.monotonic() + WAIT
        while server.loop.call(lambda e: e.has_unfinished() or bool(e.requests)).result(WAIT):
            assert time.monotonic() < deadline, "the beam search was not aborted"
            time.sleep(0.05)
        assert server.loop.call(pool_state).result(WAIT)[1] == 0  # no block in use
        metrics = httpx.get(f"{server.url}/metrics", timeout=WAIT).text
        assert 'vllm:request_success_total{finished_reason="abort",model_name="tiny"} 1.0' in metrics
