"""n, logprobs, top_logprobs, echo and prompt_logprobs over HTTP (issue 33 item 10), in OpenAI's
shapes, each number equal to what LLM.generate gives for the same request; and lm-eval's
loglikelihood (a multiple-choice task: echo + logprobs) against `nanoengine serve --model tiny`."""

from __future__ import annotations

import json

import httpx
import pytest
from openai import OpenAI
from serving import SERVE_OPTIONS, WAIT, ServeProcess, evaluate, running_server, served_process  # noqa: F401  (a fixture)

from nanoengine.llm import LLM
from nanoengine.sampling_params import SamplingParams

PROMPT = "The cat sat on the"


@pytest.fixture(scope="module")
def server():
    with running_server() as server:
        yield server


@pytest.fixture(scope="module")
def reference():
    """LLM.generate on an engine like the server's, one request at a time."""
    llm = LLM("tiny", **SERVE_OPTIONS)
    return lambda prompt, **kw: llm.generate([prompt], SamplingParams(**kw))[0]


def post(server, path: str, **body) -> dict:
    response = httpx.post(f"{server.url}{path}", json={"model": "tiny", **body}, timeout=WAIT)
    assert response.status_code == 200, response.text
    return response.json()


def events(server, path: str, **body) -> list[dict]:
    with httpx.stream("POST", f"{server.url}{path}", json={"model": "tiny", **body, "stream": True}) as r:
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_n_samples_are_seeded_seed_plus_i_as_the_engines_own_n(server, reference):
    body = dict(prompt=PROMPT, max_tokens=6, temperature=1.0, seed=7, n=3, best_of=3, return_token_ids=True)
    out = post(server, "/v1/completions", **body)
    want = reference(PROMPT, max_tokens=6, temperature=1.0, seed=7, n=3)
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    assert [c["token_ids"] for c in out["choices"]] == [o.token_ids for o in want.outputs]
    assert len({tuple(c["token_ids"]) for c in out["choices"]}) > 1  # the samples differ
    prompt_tokens = len(want.prompt_token_ids)
    assert out["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": 18, "total_tokens": prompt_tokens + 18}
    streamed = events(server, "/v1/completions", **body)
    texts = ["".join(e["choices"][0]["text"] for e in streamed if e["choices"][0]["index"] == i) for i in range(3)]
    assert texts == [c["text"] for c in out["choices"]]


def test_n_with_several_prompts_indexes_prompt_i_sample_j_as_i_times_n_plus_j(server):
    out = post(server, "/v1/completions", prompt=["a", "b"], max_tokens=2, n=2, seed=1, return_token_ids=True)
    assert [c["index"] for c in out["choices"]] == [0, 1, 2, 3]
    alone = post(server, "/v1/completions", prompt="b", max_tokens=2, seed=2, return_token_ids=True)
    assert out["choices"][3]["token_ids"] == alone["choices"][0]["token_ids"]  # prompt 1, sample 1: seed 1 + 1


def test_chat_n_streams_each_choice_with_its_role(server):
    body = dict(messages=[{"role": "user", "content": "Hi"}], max_tokens=4, n=2, seed=3)
    whole = post(server, "/v1/chat/completions", **body)
    streamed = events(server, "/v1/chat/completions", **body)
    roles = [e["choices"][0]["index"] for e in streamed if e["choices"][0]["delta"].get("role")]
    assert roles == [0, 1]
    for i in (0, 1):
        text = "".join(e["choices"][0]["delta"].get("content") or "" for e in streamed if e["choices"][0]["index"] == i)
        assert text == whole["choices"][i]["message"]["content"]


def test_completions_logprobs_in_the_legacy_shape(server, reference):
    out = post(server, "/v1/completions", prompt=PROMPT, max_tokens=5, temperature=0, logprobs=3)
    want = reference(PROMPT, max_tokens=5, logprobs=3).outputs[0]
    lp = out["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 5
    chosen = [entry[t].logprob for t, entry in zip(want.token_ids, want.logprobs)]
    assert lp["token_logprobs"] == pytest.approx(chosen, abs=1e-5)
    for top, logprob in zip(lp["top_logprobs"], lp["token_logprobs"]):
        assert 1 <= len(top) <= 4 and max(top.values()) >= logprob  # the 3 likeliest and the chosen one, by text
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])


def test_echo_puts_the_prompt_and_its_logprobs_first(server, reference):
    out = post(server, "/v1/completions", prompt=PROMPT, max_tokens=2, temperature=0, logprobs=1, echo=True)
    want = reference(PROMPT, max_tokens=2, logprobs=1, prompt_logprobs=1)
    choice = out["choices"][0]
    assert choice["text"] == PROMPT + want.text
    lp, num_prompt = choice["logprobs"], len(want.prompt_token_ids)
    assert len(lp["tokens"]) == num_prompt + 2
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None  # nothing before the first token
    prompt = [entry[t].logprob for t, entry in zip(want.prompt_token_ids[1:], want.prompt_logprobs[1:])]
    assert lp["token_logprobs"][1:num_prompt] == pytest.approx(prompt, abs=1e-5)
    assert out["usage"]["completion_tokens"] == 2
    streamed = events(server, "/v1/completions", prompt=PROMPT, max_tokens=2, temperature=0, logprobs=1, echo=True)
    parts = [e["choices"][0]["logprobs"] for e in streamed if e["choices"][0]["logprobs"]]
    assert streamed[0]["choices"][0]["text"] == PROMPT  # the prompt comes first, with its logprobs
    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert [x for part in parts for x in part[key]] == lp[key]


def test_echo_with_max_tokens_0_is_the_prompt_alone(server):
    """What lm-eval's loglikelihood may send: the prompt's logprobs, nothing generated."""
    ids = [40, 41, 42, 43]
    out = post(server, "/v1/completions", prompt=[ids], max_tokens=0, logprobs=1, echo=True)
    choice = out["choices"][0]
    assert len(choice["logprobs"]["tokens"]) == 4 and choice["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 0
    streamed = events(server, "/v1/completions", prompt=[ids], max_tokens=0, echo=True)
    assert "".join(e["choices"][0]["text"] for e in streamed) == choice["text"]
    refused = httpx.post(f"{server.url}/v1/completions", json={"model": "tiny", "prompt": "a", "max_tokens": 0})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "max_tokens"


def test_chat_logprobs_and_top_logprobs_in_chats_shape(server, reference):
    messages = [{"role": "user", "content": "Hi"}]
    out = post(
        server, "/v1/chat/completions", messages=messages, max_tokens=4, temperature=0, logprobs=True, top_logprobs=2
    )
    want = reference("user: Hi\nassistant:", max_tokens=4, logprobs=2).outputs[0]
    content = out["choices"][0]["logprobs"]["content"]
    assert len(content) == 4
    for item, token_id, entry in zip(content, want.token_ids, want.logprobs):
        assert item["logprob"] == pytest.approx(entry[token_id].logprob, abs=1e-5)
        assert (
            len(item["top_logprobs"]) == 2 and item["top_logprobs"][0]["logprob"] >= item["top_logprobs"][1]["logprob"]
        )
        assert item["bytes"] == list(item["token"].encode())
    streamed = events(server, "/v1/chat/completions", messages=messages, max_tokens=4, temperature=0, logprobs=True)
    chunks = [e["choices"][0]["logprobs"] for e in streamed if e["choices"][0].get("logprobs")]
    # The second request may find the first one's prompt blocks in the prefix cache and recompute only
    # the rest, in a matmul of another shape: the same logprobs to float32 rounding, not to the bit.
    streamed_logprobs = [c["logprob"] for chunk in chunks for c in chunk["content"]]
    assert streamed_logprobs == pytest.approx([c["logprob"] for c in content], abs=1e-5)
    refused = httpx.post(
        f"{server.url}/v1/chat/completions", json={"model": "tiny", "messages": messages, "top_logprobs": 2}
    )
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "top_logprobs"


def test_the_openai_client_reads_every_logprobs_shape(server):
    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    out = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, logprobs=2, echo=True, n=2, seed=0)
    assert len(out.choices) == 2 and out.choices[1].index == 1
    assert out.choices[0].text.startswith(PROMPT) and out.choices[0].logprobs.token_logprobs[0] is None
    chat = client.chat.completions.create(  # greedy: sampled, an EOS ended 11 of 1,500 tries early
        model="tiny",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=3,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    assert [len(c.top_logprobs) for c in chat.choices[0].logprobs.content] == [3, 3, 3]


def test_prompt_logprobs_vllms_field(server, reference):
    out = post(server, "/v1/completions", prompt=PROMPT, max_tokens=1, prompt_logprobs=2)
    entries = out["choices"][0]["prompt_logprobs"]
    want = reference(PROMPT, max_tokens=1, prompt_logprobs=2)
    assert entries[0] is None and len(entries) == len(want.prompt_token_ids)
    for entry, token_id, expected in zip(entries[1:], want.prompt_token_ids[1:], want.prompt_logprobs[1:]):
        assert entry[str(token_id)]["logprob"] == pytest.approx(expected[token_id].logprob, abs=1e-5)


def test_lm_eval_loglikelihood_on_a_multiple_choice_task(served_process, monkeypatch):  # noqa: F811
    """lm-eval sends each (context, continuation) as token ids with echo, logprobs 1 and max_tokens
    1, and sums the continuation's logprobs: the same sum the engine gives for the same ids."""
    out = evaluate(served_process, "nanoengine_tiny_mc", monkeypatch)
    samples = out["samples"]["nanoengine_tiny_mc"]
    assert "acc,none" in out["results"]["nanoengine_tiny_mc"] and len(samples) == 2
    llm = LLM("tiny")
    for sample in samples:
        for (context, continuation), (loglikelihood, _) in zip(
            (a for a in sample["arguments"]), (r[0] for r in sample["resps"])
        ):
            context_ids = llm.engine.tokenizer.encode(context)
            ids = context_ids + llm.engine.tokenizer.encode(continuation)
            got = llm.generate([ids], SamplingParams(max_tokens=1, prompt_logprobs=0))[0]
            expected = sum(
                e[t].logprob for t, e in zip(ids[len(context_ids) :], got.prompt_logprobs[len(context_ids) :])
            )
            assert loglikelihood == pytest.approx(expected, abs=1e-4)


@pytest.mark.real_model
def test_lm_eval_with_its_huggingface_tokenizer_on_the_default_model(monkeypatch):
    """lm-eval's documented setup: tokenizer_backend=huggingface with the model's folder, so it
    sends the token ids of its own tokenizer; both task kinds, against `serve --model default`."""
    from nanoengine.loading.checkpoint import DEFAULT_MODEL, ensure_default_model

    args = dict(model=DEFAULT_MODEL, tokenizer_backend="huggingface", tokenizer=str(ensure_default_model()))
    process = ServeProcess("--model", "default", "--port", "0")
    try:
        url = process.wait_for(" on http://").split(" on ")[1].strip()
        choice = evaluate(url, "nanoengine_tiny_mc", monkeypatch, **args)
        generated = evaluate(url, "nanoengine_tiny_gen", monkeypatch, **args)
    finally:
        process.proc.kill()
        process.proc.wait(timeout=WAIT)
    france = choice["samples"]["nanoengine_tiny_mc"][0]
    assert france["doc"]["answer"] == 0 and france["acc"] == 1.0  # ' Paris' the likeliest of the three
    assert "Paris" in generated["samples"]["nanoengine_tiny_gen"][0]["resps"][0][0]
