"""`nanoengine bench --serving`: the standard workload through an OpenAI-compatible HTTP API, with
Poisson arrivals, measured as vLLM's benchmark_serving does.

Each server runs in its own process (started here, on a free localhost port, stopped at the end);
an async httpx client sends request i at the i-th arrival of a Poisson process of rate R (all at
once for R = inf), streams the answer, and times each chunk. Per request: TTFT (first text chunk),
TPOT ((last - first) / (output tokens - 1)), ITL (the gaps between chunks). Goodput: requests per
second that met the SLO (TTFT and TPOT both under their limits).

Prompts are the workload's random token ids decoded to text (both servers get the same text, as
vLLM's random dataset does); every request asks for exactly its output length (nanoengine:
ignore_eos; transformers serve: a generation_config without EOS). The anchor is transformers' own
server (`transformers serve --continuous-batching`), run offline from the cached model folder.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tracer.bench.metrics import percentiles_ms
from tracer.bench.workload import BenchRequest

START_TIMEOUT_S = 600  # a server must answer /health within this (the model loads first)
REQUEST_TIMEOUT_S = 3600
WARM_UP_TOKENS = 4


@dataclass(slots=True)
class RequestResult:
    ok: bool
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    error: str = ""

    @property
    def tpot(self) -> float | None:
        return (self.latency - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else None


@dataclass(slots=True)
class Backend:
    name: str
    url: str
    body: Callable[[str, int], dict]  # (prompt text, output tokens) -> the request body
    process: subprocess.Popen | None = None


def poisson_delays(num_requests: int, rate: float, seed: int) -> list[float]:
    """Seconds from the start at which each request is sent."""
    if rate == float("inf"):
        return [0.0] * num_requests
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(num_requests):
        out.append(t)
        t += rng.expovariate(rate)
    return out


async def send(client, url: str, body: dict) -> RequestResult:
    """One streamed request, timed chunk by chunk."""
    start = time.perf_counter()
    times: list[float] = []
    usage: dict = {}
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
            if response.status_code != 200:
                return RequestResult(False, error=f"HTTP {response.status_code}: {(await response.aread())[:200]!r}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return RequestResult(False, error=str(chunk["error"])[:200])
                if any(c.get("text") for c in chunk.get("choices", [])):
                    times.append(time.perf_counter())
                usage = chunk.get("usage") or usage
    except Exception as e:  # the server died or hung up: count it as failed, go on
        return RequestResult(False, error=f"{type(e).__name__}: {e}"[:200])
    if not times:
        return RequestResult(False, error="no text came back")
    end = time.perf_counter()
    output_tokens = int(usage.get("completion_tokens", len(times)))
    itl = [b - a for a, b in zip(times, times[1:])]
    return RequestResult(True, int(usage.get("prompt_tokens", 0)), output_tokens, times[0] - start, end - start, itl)


async def run_load(backend: Backend, prompts: list[str], requests: list[BenchRequest], rate: float, seed: int):
    """Send every request at its arrival time; returns (results, seconds from first send to last answer)."""
    import httpx

    delays = poisson_delays(len(requests), rate, seed)
    limits = httpx.Limits(max_connections=len(requests) + 4, max_keepalive_connections=len(requests) + 4)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        start = time.perf_counter()

        async def one(i: int) -> RequestResult:
            await asyncio.sleep(max(0.0, start + delays[i] - time.perf_counter()))
            return await send(client, backend.url, backend.body(prompts[i], requests[i].max_tokens))

        results = await asyncio.gather(*(one(i) for i in range(len(requests))))
        return list(results), time.perf_counter() - start


async def warm_up(backend: Backend, prompts: list[str]) -> None:
    """Every prompt at once, a few tokens each, before the timed runs: either server pays for lazy
    set-up on first use (CPU GEMM libraries build a kernel for each new batch shape)."""
    import httpx

    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as client:
        await asyncio.gather(*(send(client, backend.url, backend.body(p, WARM_UP_TOKENS)) for p in prompts))


def summarize(results: list[RequestResult], duration: float, slo_ttft_s: float, slo_tpot_s: float) -> dict:
    done = [r for r in results if r.ok]
    tpots = [t for r in done if (t := r.tpot) is not None]
    good = [r for r in done if r.ttft <= slo_ttft_s and (r.tpot is None or r.tpot <= slo_tpot_s)]
    return {
        "completed": len(done),
        "failed": len(results) - len(done),
        "errors": sorted({r.error for r in results if not r.ok})[:3],
        "duration_s": round(duration, 3),
        "request_throughput": round(len(done) / duration, 4),
        "output_tokens": sum(r.output_tokens for r in done),
        "output_tok_s": round(sum(r.output_tokens for r in done) / duration, 2),
        "ttft_ms": percentiles_ms([r.ttft for r in done]) if done else {},
        "tpot_ms": percentiles_ms(tpots) if tpots else {},
        "itl_ms": percentiles_ms([x for r in done for x in r.itl]) if any(r.itl for r in done) else {},
        "goodput": round(len(good) / duration, 4),
        "good_requests": len(good),
    }


def summary_line(summary: dict) -> str:
    """One rate's run, as the progress log shows it (the whole summary goes to the report)."""
    line = f"{summary['completed']} done in {summary['duration_s']:.2f} s, {summary['output_tok_s']:.1f} output tok/s"
    for name, key in (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms")):
        if (summary[key] or {}).get("p99") is not None:
            line += f", {name} p99 {summary[key]['p99']:.0f} ms"
    if summary["failed"]:
        line += f"; {summary['failed']} failed: {'; '.join(summary['errors'])}"
    return line


# ---- the servers ------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(backend: Backend) -> None:
    import httpx

    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if backend.process is not None and backend.process.poll() is not None:
            raise RuntimeError(f"{backend.name} exited with code {backend.process.returncode} before serving")
        try:
            if httpx.get(f"{backend.url}/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.5)
    raise RuntimeError(f"{backend.name} did not answer {backend.url}/health within {START_TIMEOUT_S} s")


def thread_env(threads: int | None) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def start_nanoengine(model: str, threads: int | None, engine_args: list[str]) -> Backend:
    port = free_port()
    argv = [sys.executable, "-m", "tracer.cli.main", "serve", "--model", model, "--port", str(port), *engine_args]
    argv += ["--threads", str(threads)] if threads else []
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=thread_env(threads))

    def body(prompt: str, max_tokens: int) -> dict:
        return {
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }

    return Backend("nanoengine serve", f"http://127.0.0.1:{port}", body, process)


def hf_model_folder(model_dir: Path, out: Path) -> Path:
    """The cached model folder as `transformers serve` can load it: the same files (linked), and a
    config.json that names the architecture (nanoengine's cached config has no `architectures`)."""
    out.mkdir(parents=True, exist_ok=True)
    for f in model_dir.iterdir():
        if f.name != "config.json" and not (out / f.name).exists():
            (out / f.name).symlink_to(f.resolve())
    config = json.loads((model_dir / "config.json").read_text())
    config.setdefault("architectures", ["LlamaForCausalLM"] if config.get("model_type") == "llama" else None)
    (out / "config.json").write_text(json.dumps(config, indent=1, allow_nan=False))
    return out


def start_transformers(model_dir: Path, threads: int | None, work: Path) -> Backend:
    folder = hf_model_folder(model_dir, work / "hf-model")
    port = free_port()
    exe = Path(sys.executable).with_name("transformers")
    argv = [str(exe), "serve", str(folder), "--continuous-batching", "--device", "cpu"]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "error"]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=thread_env(threads))

    def body(prompt: str, max_tokens: int) -> dict:
        config = {"max_new_tokens": max_tokens, "min_new_tokens": max_tokens, "do_sample": False}
        return {"model": str(folder), "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                "generation_config": json.dumps(config, allow_nan=False)}  # fmt: skip

    return Backend("transformers serve (CB)", f"http://127.0.0.1:{port}", body, process)


def stop(backend: Backend) -> None:
    if backend.process is not None and backend.process.poll() is None:
        backend.process.terminate()
        try:
            backend.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            backend.process.kill()
            backend.process.wait()


# ---- the run ----------------------------------------------------------------------------------
@dataclass(slots=True)
class ServingSettings:
    model: str
    requests: list[BenchRequest]
    prompts: list[str]
    rates: list[float]
    threads: int | None
    slo_ttft_s: float
    slo_tpot_s: float
    seed: int = 0
    model_dir: Path | None = None  # the cached folder, for the transformers anchor (None: skip it)
    engine_args: list[str] = field(default_factory=list)


def run_serving_bench(settings: ServingSettings, log: Callable[[str], None] = print) -> dict:
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="nanoengine-serving-") as tmp:
        starters = [lambda: start_nanoengine(settings.model, settings.threads, settings.engine_args)]
        if settings.model_dir is not None:
            model_dir = settings.model_dir
            starters.append(lambda: start_transformers(model_dir, settings.threads, Path(tmp)))
        for start in starters:
            backend = start()
            try:
                wait_healthy(backend)
                asyncio.run(warm_up(backend, settings.prompts))
                for rate in settings.rates:
                    log(f"{backend.name}: rate {rate} req/s, {len(settings.requests)} requests ...")
                    out, duration = asyncio.run(
                        run_load(backend, settings.prompts, settings.requests, rate, settings.seed)
                    )
                    summary = summarize(out, duration, settings.slo_ttft_s, settings.slo_tpot_s)
                    results.setdefault(backend.name, {})[str(rate)] = summary
                    log(f"  {summary_line(summary)}")
            except RuntimeError as e:
                results[backend.name] = {"error": str(e)}
                log(f"{backend.name}: {e}")
            finally:
                stop(backend)
    return {
        "model": settings.model,
        "num_requests": len(settings.requests),
        "num_prompt_tokens_asked": sum(r.num_prompt_tokens for r in settings.requests),
        "num_output_tokens": sum(r.max_tokens for r in settings.requests),
        "threads": settings.threads,
        "slo": {"ttft_ms": settings.slo_ttft_s * 1000, "tpot_ms": settings.slo_tpot_s * 1000},
        "load_before": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "results": results,
    }


def print_serving_report(report: dict) -> None:
    from rich.table import Table

    from tracer.bench.report import report_console

    slo = report["slo"]
    table = Table(
        title=f"Serving: {report['num_requests']} requests, {report['num_output_tokens']} output tokens, "
        f"SLO TTFT <= {slo['ttft_ms']:.0f} ms and TPOT <= {slo['tpot_ms']:.0f} ms",
        title_justify="left",
    )
    for column in ("server", "rate req/s", "done", "req/s", "out tok/s", "TTFT p50/p90/p99 ms", "TPOT p50/p90/p99 ms",
                   "ITL p50/p90/p99 ms", "goodput req/s"):  # fmt: skip
        table.add_column(column, justify="left" if column == "server" else "right")
    for server, runs in report["results"].items():
        if "error" in runs:
            table.add_row(server, "-", "-", "-", "-", runs["error"], "", "", "")
            continue
        for rate, r in runs.items():
            table.add_row(
                server,
                rate,
                f"{r['completed']}/{r['completed'] + r['failed']}",
                f"{r['request_throughput']:.2f}",
                f"{r['output_tok_s']:.1f}",
                triple(r["ttft_ms"]),
                triple(r["tpot_ms"]),
                triple(r["itl_ms"]),
                f"{r['goodput']:.2f}",
            )
    report_console().print(table)


def triple(p: dict) -> str:
    return "/".join(f"{p.get(k) or 0:.0f}" for k in ("p50", "p90", "p99")) if p else "-"
