"""Real third-party clients against nanoengine serve, each with its defaults (issue 35 item 6): the
answer each one gets is the answer the server gives a plain request for the same thing.

- lm-evaluation-harness `local-completions` on a local generate_until task (tests/data/lm_eval),
  against `nanoengine serve --model tiny` as a process. With its default tokenizer_backend ("auto")
  it finds /tokenizer_info and /tokenize and uses the server's own tokenizer.
- LangChain's `OpenAI` and `ChatOpenAI`: invoke, stream and batch; `with_structured_output` on the
  default model.
- LiteLLM's `completion` (its OpenAI-compatible provider), plain and streamed.
"""

from __future__ import annotations

import httpx
import pytest
from pydantic import BaseModel
from serving import WAIT, evaluate, running_server, served_process  # noqa: F401  (a fixture)

from nanoengine.engine import LLMEngine

PROMPTS = ["The cat sat on the", "Once upon a time"]


@pytest.fixture(scope="module")
def server():
    with running_server() as server:
        yield server


def served_text(url: str, prompt: str, **body) -> str:
    """What the server answers a plain greedy completion request: the reference for every client."""
    body = {"model": "tiny", "prompt": prompt, "temperature": 0, **body}
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=WAIT)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def served_chat(url: str, content: str, **body) -> str:
    body = {"model": "tiny", "messages": [{"role": "user", "content": content}], "temperature": 0, **body}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=WAIT)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def test_lm_eval_local_completions_generate_until_with_its_defaults(served_process, monkeypatch):  # noqa: F811
    out = evaluate(served_process, "nanoengine_tiny_gen", monkeypatch)
    samples = out["samples"]["nanoengine_tiny_gen"]
    assert len(samples) == 3 and "exact_match,none" in out["results"]["nanoengine_tiny_gen"]
    for sample in samples:
        (prompt, kwargs), answer = sample["arguments"][0], sample["resps"][0][0]
        assert kwargs["until"] == ["\n"]
        assert answer == served_text(served_process, prompt, max_tokens=8, stop=["\n"])


def test_langchain_openai_llm_invoke_stream_and_batch(server):
    from langchain_openai import OpenAI

    llm = OpenAI(base_url=f"{server.url}/v1", api_key="unused", model="tiny", temperature=0, max_tokens=8)
    want = [served_text(server.url, p, max_tokens=8) for p in PROMPTS]
    assert llm.invoke(PROMPTS[0]) == want[0]
    assert "".join(llm.stream(PROMPTS[0])) == want[0]
    assert llm.batch(PROMPTS) == want


def test_langchain_chat_openai_invoke_stream_and_batch(server):
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(base_url=f"{server.url}/v1", api_key="unused", model="tiny", temperature=0, max_tokens=8)
    want = [served_chat(server.url, p, max_tokens=8) for p in PROMPTS]
    assert chat.invoke(PROMPTS[0]).content == want[0]
    assert "".join(chunk.content for chunk in chat.stream(PROMPTS[0])) == want[0]
    assert [m.content for m in chat.batch(PROMPTS)] == want


def test_litellm_completion_plain_and_streamed(server, monkeypatch):
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # its price list from the package, not the web
    import litellm

    kw = dict(model="openai/tiny", api_base=f"{server.url}/v1", api_key="unused", temperature=0, max_tokens=8)
    messages = [{"role": "user", "content": PROMPTS[0]}]
    want = served_chat(server.url, PROMPTS[0], max_tokens=8)
    assert litellm.completion(messages=messages, **kw).choices[0].message.content == want
    chunks = litellm.completion(messages=messages, stream=True, **kw)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want


class Person(BaseModel):
    name: str
    age: int


@pytest.mark.real_model
def test_langchain_with_structured_output_on_the_default_model():
    from langchain_openai import ChatOpenAI

    with running_server(LLMEngine("default", num_threads=1)) as server:
        chat = ChatOpenAI(base_url=f"{server.url}/v1", api_key="unused", model=server.model_name, temperature=0)
        structured = chat.with_structured_output(Person, method="json_schema")
        person = structured.invoke("Describe a person called Ada who is 36 years old.")
    assert isinstance(person, Person) and person.name and person.age >= 0
