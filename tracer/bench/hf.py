"""The Hugging Face transformers baselines, each run the way a user would run it.

- `generate` with a static, left-padded batch: every request in a batch decodes for the batch's
  largest max_tokens; each request is credited only with the tokens it asked for. A streamer
  timestamps every decoding step, which gives each request's TTFT and TPOT exactly.
- continuous batching (`generate_batch`'s paged engine), driven through its public manager API
  (`continuous_batching_context_manager` + `add_request`, which is what `generate_batch` does
  inside) so that each request gets its own max_new_tokens, with per-token timestamps. The
  manager's set-up (paged cache and static buffer allocation, the warm-up requests and, on CUDA,
  the graph-capturing warm-up that `generate_batch` runs on every call) is timed separately as
  setup_s and kept out of the throughput window, as the engine's start-up is.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from tracer.bench.metrics import RunResult, measured_run, synchronize
from tracer.bench.workload import BenchRequest

NO_EOS = -1  # an id no model produces: continuous batching then stops on max_new_tokens only
CB_ATTENTION = "sdpa"  # transformers 5.24: "paged|sdpa" is deprecated; plain sdpa is its paged path


def load_hf_model(model: str, device: torch.device, dtype: torch.dtype):
    """The same weights nanoengine loads for `model`, as a transformers model with SDPA attention."""
    from transformers import AutoModelForCausalLM

    options = dict(dtype=dtype, attn_implementation="sdpa")
    if model == "tiny":
        return tiny_hf_model(dtype).to(device)
    from nanoengine.loading.checkpoint import DEFAULT_MODEL, ensure_default_model

    if model in ("default", DEFAULT_MODEL):
        model = str(ensure_default_model())
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, **options)
    else:
        hf = AutoModelForCausalLM.from_pretrained(str(path) if path.is_dir() else model, **options)
    return hf.to(device).eval()  # type: ignore[arg-type]  # transformers' typed .to() wrapper


def tiny_hf_model(dtype: torch.dtype):
    """nanoengine's tiny random model as a transformers Llama with identical weights."""
    from transformers import AutoModelForCausalLM

    from nanoengine.loading.build import build_model
    from nanoengine.loading.tiny import tiny_config

    config = tiny_config()
    ours = build_model(config, None, config.max_position_embeddings, torch.device("cpu"), torch.float32)
    hf = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    hf.load_state_dict(hf_state_dict(ours))
    return hf.to(dtype).eval()


def hf_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """nanoengine's weights under Hugging Face's names: its stacked linears split again."""
    from nanoengine.model import STACKED

    weights = {}
    for name, tensor in model.state_dict().items():
        fused = next((f for f in STACKED if f".{f}." in name), None)
        if fused is None:
            weights[name] = tensor
            continue
        owner: Any = model.get_submodule(name.rsplit(".", 2)[0])  # the attention or the MLP
        if fused == "qkv_proj":  # q, k, v: their heads' rows
            heads = (owner.num_heads, owner.num_kv_heads, owner.num_kv_heads)
            parts = tensor.split([n * owner.head_dim for n in heads])
        else:
            parts = tensor.chunk(2)
        weights.update({name.replace(fused, hf): part for hf, part in zip(STACKED[fused], parts)})
    return weights


def pad_token_id(hf_model) -> int:
    config = hf_model.config
    for value in (config.pad_token_id, config.eos_token_id, 0):
        value = value[0] if isinstance(value, list) else value
        if value is not None:
            return value
    return 0


class StepClock:
    """A generate() streamer that only notes when each step's tokens arrive. generate() calls put()
    once with the prompt, then once per decoding step with the batch's new tokens."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def left_pad(batch: list[BenchRequest], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(r.num_prompt_tokens for r in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, r in enumerate(batch):
        ids[i, width - r.num_prompt_tokens :] = torch.tensor(r.prompt_token_ids)
        mask[i, width - r.num_prompt_tokens :] = 1
    return ids, mask


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' warnings and progress bars off while a baseline runs, restored after: the bench's
    output is its report. generate() warns at every call that eos_token_id NO_EOS never stops it and
    "may even crash" (stopping on max_new_tokens alone is what NO_EOS is for), and each model load
    draws a progress bar."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


@torch.inference_mode()
def generate_static(hf_model, batch: list[BenchRequest], pad_id: int) -> tuple[list[list[int]], list[float]]:
    """One padded generate() call; returns each request's credited ids and the step timestamps."""
    from transformers import GenerationConfig

    device = hf_model.device
    ids, mask = left_pad(batch, pad_id)
    n = max(r.max_tokens for r in batch)
    config = GenerationConfig(max_new_tokens=n, do_sample=False, eos_token_id=NO_EOS, pad_token_id=pad_id)
    clock = StepClock()
    out = hf_model.generate(
        input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=config, streamer=clock
    )
    width = ids.shape[1]
    return [out[i, width : width + r.max_tokens].tolist() for i, r in enumerate(batch)], clock.times[1:]


def run_hf_generate(
    hf_model, requests: list[BenchRequest], batch_size: int | None = None, name: str = "HF generate"
) -> RunResult:
    batch_size = batch_size or len(requests)
    pad_id = pad_token_id(hf_model)
    outputs: list[list[int]] = []
    token_times: list[list[float]] = []
    synchronize(hf_model.device)
    start, cpu_start = time.perf_counter(), time.process_time()
    for first in range(0, len(requests), batch_size):
        batch = requests[first : first + batch_size]
        ids, step_times = generate_static(hf_model, batch, pad_id)
        outputs.extend(ids)
        token_times.extend(step_times[: r.max_tokens] for r in batch)
    elapsed, cpu_time = time.perf_counter() - start, time.process_time() - cpu_start
    notes = {
        "batch_size": batch_size,
        "num_batches": -(-len(requests) // batch_size),
        "ttft_method": "streamer timestamp of each batch's first decoding step",
    }
    return measured_run(name, requests, outputs, token_times, start, elapsed, cpu_time, notes)


@contextmanager
def onednn_linears(hf_model) -> Iterator[bool]:
    """The HF model's nn.Linear layers run as nanoengine's Linear (oneDNN on x86 CPUs in float32, weights
    packed) inside the block: the same GEMM for both, so what remains of the speed-up is the engine's own.
    Yields False (and changes nothing) where nanoengine's Linear would not use oneDNN either."""
    from nanoengine.loading.build import pack_for_onednn
    from nanoengine.model import ONEDNN, Linear

    if not (ONEDNN and hf_model.device.type == "cpu" and hf_model.dtype == torch.float32):
        yield False
        return
    swapped = {m: m.weight for m in hf_model.modules() if type(m) is torch.nn.Linear}
    for m in swapped:
        m.__class__ = Linear  # a subclass with the same parameters: only forward differs
    pack_for_onednn(hf_model)  # and the same packed weights as nanoengine's
    try:
        yield True
    finally:
        for m, weight in swapped.items():
            m.__class__, m.weight = torch.nn.Linear, weight


def warm_up_generate(hf_model, requests: list[BenchRequest]) -> None:
    generate_static(hf_model, requests, pad_token_id(hf_model))


@torch.inference_mode()
def run_hf_generate_batch(
    hf_model, requests: list[BenchRequest], warmup: list[BenchRequest] | None = None, cb_options: dict | None = None
) -> RunResult:
    """cb_options: ContinuousBatchingConfig fields (e.g. num_blocks, max_batch_tokens); none: its own sizing."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    config = GenerationConfig(
        max_new_tokens=max(r.max_tokens for r in requests),
        do_sample=False,
        eos_token_id=NO_EOS,
        pad_token_id=pad_token_id(hf_model),
    )
    original_attention = hf_model.config._attn_implementation
    if original_attention != CB_ATTENTION:
        hf_model.set_attn_implementation(CB_ATTENTION)
    setup_start = time.perf_counter()
    try:
        # generate_batch's warm-up pre-captures CUDA graphs; on CPU it only runs large dummy batches
        cb_config = ContinuousBatchingConfig(**cb_options) if cb_options else None
        with hf_model.continuous_batching_context_manager(
            generation_config=config,
            block=True,
            timeout=30,
            continuous_batching_config=cb_config,
            warmup=hf_model.device.type == "cuda",
        ) as manager:
            if warmup:  # the first request also builds the paged cache and its static buffers
                collect(manager, submit(manager, warmup))
            setup = time.perf_counter() - setup_start
            start, cpu_start = time.perf_counter(), time.process_time()  # its loop thread counts too
            results = collect(manager, submit(manager, requests))
            elapsed, cpu_time = time.perf_counter() - start, time.process_time() - cpu_start
    finally:
        if hf_model.config._attn_implementation != original_attention:
            hf_model.set_attn_implementation(original_attention)
    outputs = [list(res.generated_tokens[: r.max_tokens]) for res, r in zip(results, requests)]
    token_times = [list(res.timestamps or [])[: r.max_tokens] for res, r in zip(results, requests)]
    notes = {
        "setup_s": round(setup, 3),
        "attn_implementation": CB_ATTENTION,
        "cb_options": cb_options or {},
        "ttft_method": "per-token timestamps recorded by the continuous batching manager",
    }
    return measured_run("HF generate_batch", requests, outputs, token_times, start, elapsed, cpu_time, notes)


def submit(manager, requests: list[BenchRequest]) -> list[str]:
    return [
        manager.add_request(
            list(r.prompt_token_ids), max_new_tokens=r.max_tokens, record_timestamps=True, eos_token_id=NO_EOS
        )
        for r in requests
    ]


def collect(manager, request_ids: list[str]) -> list:
    """Wait for every request; results in request order."""
    pending, done = set(request_ids), {}
    while pending:
        result = manager.get_result(timeout=1)
        if result is None:
            if not manager.is_running():
                raise RuntimeError("transformers' continuous batching loop stopped before finishing the workload")
            continue
        if result.is_finished() and result.request_id in pending:
            if result.error is not None:
                raise RuntimeError(f"transformers' continuous batching failed a request: {result.error}")
            pending.discard(result.request_id)
            done[result.request_id] = result
    return [done[i] for i in request_ids]
