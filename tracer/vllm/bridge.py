"""The only module that imports vLLM: builds vllm 0.33.0's own v1 Scheduler as that version's
tests/v1/core/utils.py::create_scheduler does, with no model weights, no tokenizer and no GPU
(recipe: docs/vllm.md). Run it with the vLLM venv's python; nanoengine never imports it."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
sys.modules.setdefault("triton", None)  # type: ignore[arg-type]  # not needed to schedule; a run is the same

import torch  # noqa: E402
import vllm  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

VLLM_VERSION = "0.33.0"
# A Llama-shaped config (SmolLM2-135M's sizes): the scheduler reads only lengths from it.
MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "max_position_embeddings": 65536,
    "torch_dtype": "float32",
}

__all__ = ["ModelRunnerOutput", "Request", "RequestStatus", "Scheduler", "build_scheduler", "make_request"]


def check_version() -> None:
    if vllm.__version__ != VLLM_VERSION:
        raise SystemExit(
            f"error: this recorder drives vllm=={VLLM_VERSION}, found {vllm.__version__}: "
            f"pip install vllm=={VLLM_VERSION} --no-deps into the recorder's venv (docs/vllm.md)"
        )


def model_folder() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="nanoengine-vllm-config-"))
    (folder / "config.json").write_text(json.dumps(MODEL_CONFIG, allow_nan=False), encoding="utf-8")
    return folder


def vllm_max_num_seqs(config: dict[str, Any]) -> int:
    """vLLM refuses max_num_batched_tokens < max_num_seqs; nanoengine allows it. A step never schedules
    more sequences than tokens, so the cap only matters once more than that many run at once."""
    return min(int(config["max_num_seqs"]), int(config["max_num_batched_tokens"]))


def build_scheduler(config: dict[str, Any]) -> Scheduler:
    """vLLM's scheduler for a nanoengine engine config. The pool gets num_kv_blocks + 1 blocks:
    vLLM keeps block 0 as its null block, so as many blocks are usable as in nanoengine."""
    check_version()
    block_size, num_blocks = int(config["block_size"]), int(config["num_kv_blocks"]) + 1
    model_config = ModelConfig(
        model=str(model_folder()),
        tokenizer=None,
        skip_tokenizer_init=True,
        dtype="float32",
        seed=0,
        max_model_len=int(config["max_model_len"]),
    )
    scheduler_config = SchedulerConfig(
        max_num_seqs=vllm_max_num_seqs(config),
        max_num_batched_tokens=int(config["max_num_batched_tokens"]),
        max_model_len=int(config["max_model_len"]),
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
        watermark=0.0,
    )
    cache_config = CacheConfig(
        block_size=block_size,
        gpu_memory_utilization=0.9,
        cache_dtype="auto",
        enable_prefix_caching=bool(config["enable_prefix_caching"]),
    )
    vllm_config = VllmConfig(
        scheduler_config=scheduler_config,
        model_config=model_config,
        cache_config=cache_config,
        parallel_config=ParallelConfig(),
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size, num_kv_heads=1, head_size=1, dtype=torch.float32))
        ],
    )
    cache_config.num_gpu_blocks = num_blocks
    register_all_kvcache_specs(vllm_config)
    return Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        block_size=block_size,
        log_stats=True,
        structured_output_manager=StructuredOutputManager(vllm_config),
    )


def make_request(
    request_id: str,
    prompt_token_ids: list[int],
    params: dict[str, Any],
    eos_token_ids: list[int],
    block_size: int,
    arrival_time: float,
) -> Request:
    init_none_hash(sha256)
    sp = SamplingParams(
        max_tokens=int(params.get("max_tokens", 64)),
        ignore_eos=bool(params.get("ignore_eos", False)),
        temperature=float(params.get("temperature", 0.0)),
        seed=params.get("seed"),
    )
    primary = eos_token_ids[0] if eos_token_ids else None
    sp.update_from_generation_config({"eos_token_id": eos_token_ids} if eos_token_ids else {}, primary)
    return Request(
        request_id,
        prompt_token_ids,
        sp,
        pooling_params=None,
        arrival_time=arrival_time,
        block_hasher=get_request_block_hasher(block_size, sha256),
    )
