"""vLLM's utility endpoints: /tokenize and /detokenize in vLLM's shapes, /version, and /metrics in
Prometheus' text format (parsed by prometheus_client's own parser) with vLLM's metric names, its
counts equal to what the requests and the engine's trace say."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serving import SERVE_OPTIONS, WAIT, running_server

from nanoengine.engine import LLMEngine
from nanoengine.sequence import EventKind
from tracer.trace.recorder import TraceRecorder
from tracer.trace.trace_file import load_trace


@pytest.fixture(scope="module")
def server():
    with running_server() as server:
        yield server


def test_tokenize_and_detokenize_round_trip(server):
    tokenizer = server.loop.engine.tokenizer
    out = httpx.post(f"{server.url}/tokenize", json={"model": "tiny", "prompt": "Hello world"}, timeout=WAIT).json()
    ids = tokenizer.encode("Hello world", add_special_tokens=False)
    assert out == {"count": len(ids), "max_model_len": 2048, "tokens": ids, "token_strs": None}
    back = httpx.post(f"{server.url}/detokenize", json={"tokens": ids}, timeout=WAIT).json()
    assert back == {"prompt": "Hello world"}


def test_tokenize_counts_what_the_completion_endpoint_feeds_the_model(server):
    messages = [{"role": "user", "content": "Hi"}]
    tokens = httpx.post(f"{server.url}/tokenize", json={"messages": messages}, timeout=WAIT).json()["tokens"]
    body = {"model": "tiny", "messages": messages, "max_tokens": 2, "return_token_ids": True}
    served = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=WAIT).json()
    assert served["choices"][0]["prompt_token_ids"] == tokens


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, None),
        ("/tokenize", {"prompt": 5}, "prompt"),
        ("/detokenize", {"tokens": [1, 10**6]}, "tokens"),
        ("/detokenize", {"tokens": "abc"}, "tokens"),
        ("/detokenize", {"model": "gpt-4", "tokens": [1]}, "model"),
    ],
)
def test_bad_tool_requests_are_openai_errors(server, path, body, param):
    response = httpx.post(f"{server.url}{path}", json=body, timeout=WAIT)
    assert response.status_code in (400, 404)
    assert response.json()["error"]["param"] == param


def test_version(server):
    assert httpx.get(f"{server.url}/version", timeout=WAIT).json()["version"]


def scrape(server) -> dict[str, float]:
    """Every sample of /metrics by name (with its finished_reason label, if any), as Prometheus parses it."""
    response = httpx.get(f"{server.url}/metrics", timeout=WAIT)
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            assert s.labels["model_name"] == "tiny"
            reason = s.labels.get("finished_reason")
            samples[
                s.name + (f"[{reason}]" if reason else "") + (f"[{s.labels['le']}]" if "le" in s.labels else "")
            ] = s.value
    return samples


def test_metrics_count_the_requests_served(tmp_path):
    """A small pool: 4 long requests preempt each other; one prompt twice: a prefix-cache hit.
    Each count equals what the responses and the trace of the same run say."""
    options = SERVE_OPTIONS | {"num_kv_blocks": 24, "max_num_batched_tokens": 32}
    engine = LLMEngine("tiny", **options)
    recorder = TraceRecorder(engine, tmp_path / "served.jsonl")
    prompts = ["a prompt that fills two blocks", "b", "c", "a prompt that fills two blocks"]
    with running_server(engine, recorder) as server:
        before = scrape(server)
        assert before["vllm:num_requests_running"] == 0 and before["vllm:generation_tokens_total"] == 0
        body = {"model": "tiny", "prompt": prompts, "max_tokens": 40, "ignore_eos": True, "temperature": 0}
        out = httpx.post(f"{server.url}/v1/completions", json=body, timeout=WAIT).json()
        after = scrape(server)
    recorder.close()
    events = [e for s in load_trace(tmp_path / "served.jsonl", "all").steps for e in s["events"]]
    hits = sum(e["detail"]["tokens_saved"] for e in events if e["kind"] == EventKind.PREFIX_HIT)
    preemptions = sum(1 for e in events if e["kind"] == EventKind.PREEMPTED)
    assert preemptions > 0 and hits > 0
    assert after["vllm:num_preemptions_total"] == preemptions
    assert after["vllm:prefix_cache_hits_total"] == hits
    assert after["vllm:prefix_cache_queries_total"] >= out["usage"]["prompt_tokens"]
    assert after["vllm:prompt_tokens_total"] == out["usage"]["prompt_tokens"]
    assert after["vllm:generation_tokens_total"] == out["usage"]["completion_tokens"] == 160
    assert after["vllm:request_success_total[length]"] == 4
    assert after["vllm:time_to_first_token_seconds_count"] == 4
    assert after["vllm:e2e_request_latency_seconds_count"] == 4
    assert after["vllm:time_per_output_token_seconds_count"] == 4 * 39
    assert after["vllm:num_requests_running"] == after["vllm:num_requests_waiting"] == 0
    assert after["vllm:kv_cache_usage_perc"] == 0


def test_tokenizer_info_names_the_special_tokens_as_vllm_does(server):
    info = httpx.get(f"{server.url}/tokenizer_info", timeout=WAIT).json()
    assert info == {
        "tokenizer_class": "ByteTokenizer",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "unk_token": None,
        "chat_template": None,
        "model_max_length": 2048,
    }
