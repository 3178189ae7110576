"""Structured output (issue 35 item 4): response_format json_object / json_schema and vLLM's
guided_* and structured_outputs, as an xgrammar token mask before sampling.

The tiny model (a byte vocabulary, random weights) shows that the mask holds whatever the model
would rather write: a choice, a regex and a grammar at temperature 1. The default model writes
JSON that parses and validates against the schema. Bad grammars are a 400 naming the field."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import pytest
import torch
from openai import OpenAI
from pydantic import BaseModel
from serving import SERVE_OPTIONS, WAIT, running_server

from nanoengine.engine import LLMEngine
from nanoengine.loading.tiny import ByteTokenizer
from tracer.replay.model import viewer_header
from tracer.replay.narration import narrate
from tracer.serve.protocol import Grammar
from tracer.serve.structured import StructuredOutput
from tracer.trace.recorder import TraceRecorder
from tracer.trace.trace_file import load_trace

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
CHOICES = ["yes", "no", "maybe so"]
SEEDS = range(4)


@pytest.fixture(scope="module")
def server():
    with running_server() as server:
        yield server


def complete(server, **body) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/completions", json={"model": "tiny", "prompt": "Hi", **body}, timeout=WAIT)


def texts(server, **body) -> list[str]:
    """The text of each seeded sample at temperature 1 (the tiny model's own choice is random)."""
    out = []
    for seed in SEEDS:
        response = complete(server, temperature=1.0, seed=seed, **body)
        assert response.status_code == 200, response.text
        (choice,) = response.json()["choices"]
        assert choice["finish_reason"] == "stop"  # the grammar ended, and then only EOS was allowed
        out.append(choice["text"])
    return out


def test_guided_choice_gives_one_of_the_choices(server):
    assert set(texts(server, max_tokens=16, guided_choice=CHOICES)) <= set(CHOICES)
    assert set(texts(server, max_tokens=16, structured_outputs={"choice": CHOICES})) <= set(CHOICES)


def test_guided_regex_and_grammar_are_followed(server):
    for text in texts(server, max_tokens=16, guided_regex=r"[0-9]{3}-[a-z]{2}"):
        assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", text), text
    for text in texts(server, max_tokens=16, structured_outputs={"grammar": 'root ::= "a" "a"* "b"'}):
        assert re.fullmatch(r"a+b", text), text


def test_each_prompt_of_a_batch_and_each_stream_has_its_own_mask(server):
    """A mask follows one sequence: two prompts, two samples each, in one request: four whole matches
    (the samples differ, so one mask shared between them would have broken)."""
    body = dict(prompt=["Hi", "Bye"], n=2, max_tokens=8, temperature=1.0, seed=3, guided_regex=r"[0-9]{4}")
    choices = complete(server, **body).json()["choices"]
    assert len(choices) == 4 and all(re.fullmatch(r"[0-9]{4}", c["text"]) for c in choices)
    assert len({c["text"] for c in choices}) > 1
    with httpx.stream("POST", f"{server.url}/v1/completions", json={"model": "tiny", **body, "stream": True}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    streamed = ["".join(e["choices"][0]["text"] for e in events if e["choices"][0]["index"] == i) for i in range(4)]
    assert streamed == [c["text"] for c in choices]


def test_after_the_grammar_ends_only_eos_is_drawn(server):
    out = complete(server, max_tokens=6, ignore_eos=True, guided_choice=["ok"], return_token_ids=True).json()
    choice = out["choices"][0]
    assert choice["text"] == "ok" and choice["token_ids"] == [*ByteTokenizer().encode("ok"), 2, 2, 2, 2]


def test_the_mask_allows_exactly_the_grammars_next_tokens():
    """The processor itself, on a byte vocabulary: digits first, then only EOS."""
    tokenizer = ByteTokenizer()
    structured = StructuredOutput(tokenizer, tokenizer.vocab_size, {tokenizer.eos_token_id})
    mask = structured.mask(structured.compile(Grammar("regex", "[0-9]", "guided_regex")))

    def allowed(output: list[int]) -> set[int]:
        row = mask(output, torch.zeros(tokenizer.vocab_size))
        return set(torch.nonzero(row > float("-inf")).flatten().tolist())

    assert allowed([]) == set(tokenizer.encode("0123456789"))
    assert allowed([]) == set(tokenizer.encode("0123456789"))  # a thrown-away prefill row changes nothing
    assert allowed(tokenizer.encode("7")) == {2}
    assert allowed([*tokenizer.encode("7"), 2]) == {2}


@pytest.mark.parametrize(
    "extra, param, words",
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}},
            "response_format",
            "not a valid JSON schema at /type",
        ),
        ({"guided_json": '{"type": "object"'}, "guided_json", "not JSON"),
        (
            {"guided_json": {"type": "object", "properties": {"a": {"type": "strin"}}}},
            "guided_json",
            "/properties/a/type",
        ),
        ({"guided_regex": "(("}, "guided_regex", "parenthesis is not closed"),
        (
            {"structured_outputs": {"grammar": "root ::= undefined"}},
            "structured_outputs.grammar",
            '"undefined" is not defined',
        ),
        ({"guided_choice": []}, "guided_choice", "at least one choice"),
        ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice", "one structured-output constraint"),
        ({"response_format": {"type": "json_schema"}}, "response_format", '"json_schema" needs'),
        ({"response_format": {"type": "xml"}}, "response_format.type", "'json_object' or 'json_schema'"),
        ({"structured_outputs": {"whitespace_pattern": " "}}, "structured_outputs.whitespace_pattern", "unsupported"),
    ],
)
def test_a_bad_grammar_is_a_400_naming_the_field(server, extra, param, words):
    response = complete(server, **extra)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert "\n" not in error["message"] and "/project/cpp" not in error["message"]


def test_the_openai_client_sends_response_format_on_both_endpoints(server):
    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    fmt = {
        "type": "json_schema",
        "json_schema": {
            "name": "flag",
            "schema": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
            "strict": True,
        },
    }
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "ok?"}], response_format=fmt, max_tokens=32, seed=0
    )
    assert json.loads(chat.choices[0].message.content) in ({"ok": True}, {"ok": False})
    out = client.completions.create(
        model="tiny", prompt="ok?", max_tokens=32, seed=0, extra_body={"response_format": fmt}
    )
    assert json.loads(out.choices[0].text) in ({"ok": True}, {"ok": False})
    parsed = client.chat.completions.parse(  # the client's own schema from a pydantic model
        model="tiny", messages=[{"role": "user", "content": "ok?"}], response_format=Flag, max_tokens=32, seed=0
    )
    assert isinstance(parsed.choices[0].message.parsed, Flag)


class Flag(BaseModel):
    ok: bool


def test_the_trace_says_which_steps_drew_through_a_grammar_mask(tmp_path):
    path = tmp_path / "structured.jsonl"
    engine = LLMEngine("tiny", **SERVE_OPTIONS)
    recorder = TraceRecorder(engine, path, title="structured")
    with running_server(engine, recorder) as server:
        assert complete(server, max_tokens=8, guided_choice=["yes"]).status_code == 200
        assert complete(server, prompt="plain", max_tokens=3).status_code == 200
    recorder.close()
    trace = load_trace(path)
    header = viewer_header(trace)
    masked, plain = (
        [r["seq_id"] for r in header["requests"] if r["params"].get("logits_processors") == 1],
        [r["seq_id"] for r in header["requests"] if "logits_processors" not in r["params"]],
    )
    assert len(masked) == 1 and len(plain) == 1
    lines = [narrate(step, header) for step in trace.steps]
    marked = [line for line in lines if "grammar's token mask" in line]
    assert len(marked) == 4  # 'y', 'e', 's', EOS: one line per token drawn
    assert all(f"seq {masked[0]} " in line and "scheduler output" in line for line in marked)


@pytest.fixture(scope="module")
def default_client():
    with running_server(LLMEngine("default", num_threads=1)) as server:
        yield OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0), server.model_name


@pytest.mark.real_model
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_default_model_writes_json_that_validates_against_the_schema(default_client, temperature):
    client, model = default_client
    out = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Describe a person called Ada who is 36, as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
        temperature=temperature,
        seed=1,
        max_tokens=200,
    )
    choice = out.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), PERSON)


@pytest.mark.real_model
def test_the_default_model_answers_json_object_and_guided_json(default_client):
    client, model = default_client
    out = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is the capital of France? Answer in JSON."}],
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=200,
    )
    answer = json.loads(out.choices[0].message.content)
    assert isinstance(answer, dict) and "Paris" in json.dumps(answer)
    prompt = "Ada is 36 years old. As JSON with her name and age:"
    # greedy: sampled at the default temperature 1 the model may ramble inside a string past max_tokens
    guided = {"guided_json": PERSON}
    done = client.completions.create(model=model, prompt=prompt, max_tokens=200, temperature=0, extra_body=guided)
    jsonschema.validate(json.loads(done.choices[0].text), PERSON)
