"""The server's Prometheus metrics (GET /metrics), with vLLM's names, so its dashboards and
`vllm bench` read them as they read vLLM's.

Two sources, both in the engine loop's thread: the engine's step records (a step hook: the queues,
the KV pool, preemptions, prefix-cache lookups) and each request's updates as the loop delivers
them (time to first token, time per output token, end-to-end latency, token counts). Each server
has its own registry, so two servers in one process (the tests) never share a count.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from nanoengine.sequence import EventKind

if TYPE_CHECKING:
    from nanoengine.engine import LLMEngine
    from nanoengine.step_record import StepRecord
    from tracer.loop.engine_loop import RequestUpdate

# vLLM's buckets (vllm/v1/metrics/loggers.py), in seconds
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LABEL = ["model_name"]
M = TypeVar("M", Counter, Gauge, Histogram)


class ServerMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = registry = CollectorRegistry()
        self.model_name = model_name

        def make(kind: type[M], name: str, doc: str, **kw: Any) -> M:
            return kind(f"vllm:{name}", doc, LABEL, registry=registry, **kw).labels(model_name)

        self.running = make(Gauge, "num_requests_running", "Requests in the running queue (the batch).")
        self.waiting = make(Gauge, "num_requests_waiting", "Requests waiting to be admitted.")
        self.kv_usage = make(Gauge, "kv_cache_usage_perc", "Fraction of the KV blocks in use (1 = all).")
        self.prompt_tokens = make(Counter, "prompt_tokens", "Prompt tokens of the requests that started.")
        self.generation_tokens = make(Counter, "generation_tokens", "Tokens generated.")
        self.preemptions = make(Counter, "num_preemptions", "Preemptions (by recompute).")
        self.prefix_queries = make(Counter, "prefix_cache_queries", "Tokens looked up in the prefix cache.")
        self.prefix_hits = make(Counter, "prefix_cache_hits", "Tokens found in the prefix cache.")
        self.ttft = make(Histogram, "time_to_first_token_seconds", "Arrival to first token.", buckets=TTFT_BUCKETS)
        self.tpot = make(
            Histogram, "time_per_output_token_seconds", "Time between two tokens of a request.", buckets=TPOT_BUCKETS
        )
        self.e2e = make(Histogram, "e2e_request_latency_seconds", "Arrival to finish.", buckets=E2E_BUCKETS)
        self.success = Counter(
            "vllm:request_success",
            "Finished requests, by finish reason.",
            [*LABEL, "finished_reason"],
            registry=registry,
        )
        self.last_token_at: dict[int, float] = {}  # id(request) -> when its last token came

    def watch(self, engine: LLMEngine) -> None:
        """Hear every step of this engine (call before its loop starts, or in the loop's thread)."""
        engine.add_step_hook(lambda record: self.on_step(engine, record))

    def on_step(self, engine: LLMEngine, record: StepRecord) -> None:
        scheduler, pool = engine.scheduler, engine.block_manager
        self.running.set(len(scheduler.running))
        self.waiting.set(len(scheduler.waiting))
        self.kv_usage.set(1 - pool.num_free_blocks / pool.num_kv_blocks)
        num_tokens = {s.seq_id: s.num_tokens for s in record.seqs}
        for event in record.events:
            if event.kind == EventKind.PREEMPTED:
                self.preemptions.inc()
            elif event.kind == EventKind.ADMITTED:
                self.prefix_queries.inc(num_tokens.get(event.seq_id, 0))
            elif event.kind == EventKind.PREFIX_HIT:
                self.prefix_hits.inc(event.detail["tokens_saved"])

    def on_update(self, update: RequestUpdate) -> None:
        """One request's update, as the loop delivers it."""
        request, now = update.request, time.time()
        key = id(request)
        if update.new_token_ids:
            last = self.last_token_at.get(key)
            if last is None:
                self.ttft.observe(now - request.arrival_time)
                self.prompt_tokens.inc(request.num_prompt_tokens)
            else:
                self.tpot.observe(now - last)
            self.last_token_at[key] = now
            self.generation_tokens.inc(len(update.new_token_ids))
        if update.finished:
            self.last_token_at.pop(key, None)
            if request.seq_id is not None:  # added to the engine (not rejected)
                self.e2e.observe(now - request.arrival_time)
                self.success.labels(self.model_name, update.finish_reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
