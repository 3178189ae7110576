from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from nanoengine.loading.validation import is_real


@dataclass(slots=True)
class EngineConfig:
    """Engine knobs. None means: chosen from the model and the machine when the engine starts."""

    model: str = "default"
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory_gb: float = 1.0  # sizes the pool when num_kv_blocks is None
    max_num_batched_tokens: int = 512  # per-step token budget
    max_num_seqs: int = 64
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    use_chat_template: bool = True  # wrap string prompts in the tokenizer's chat template
    device: str | None = None  # "cpu" / "cuda"; None = cuda when available
    dtype: str | None = None  # None = float32 on CPU, bfloat16 on CUDA; auto: loading.choose_dtype
    kv_cache_dtype: str = "auto"  # the KV pool's numbers: auto = the model's dtype, or a dtype name
    attention_backend: Any = "auto"  # auto / torch / flash, or a backend object (attention.py)
    num_threads: int | None = None  # torch's (process-wide) thread count; None: the idle cores

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(
                f"unknown engine option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        config = cls(**kwargs)
        config.validate()
        return config

    def validate(self) -> None:
        least = dict(block_size=1, max_num_batched_tokens=1, max_num_seqs=1, num_kv_blocks=1)
        least["num_threads"] = 1  # None: the idle cores
        for name, low in {**least, "max_model_len": 2}.items():
            value = getattr(self, name)
            if value is not None and int(value) < low:  # None: chosen when the engine starts
                raise ValueError(f"{name} must be >= {low}, got {value}")
        gb = self.kv_cache_memory_gb
        if not is_real(gb) or gb <= 0:
            raise ValueError(f"kv_cache_memory_gb must be a number of GiB > 0, got {gb!r}")
        backend = self.attention_backend  # a name, or an object like those in attention.py
        if backend not in ("auto", "torch", "flash") and not hasattr(backend, "write_kv"):
            raise ValueError(
                f"attention_backend must be auto, torch, flash or a backend: {backend!r}"
            )
