"""Compiled CPU kernels the tools plug into the engine: C sources built at first use with the
machine's compiler (build.py), each wrapped as the engine object it speeds up. The engine itself
stays pure Python and torch; every kernel here has a test holding it equal to the engine's path."""

KERNEL = "cpu-kernel"  # the compiled paged-decode kernel, by name, for --attention-backend
ATTENTION_BACKENDS = ("auto", "torch", "flash", KERNEL)  # the tools' choices (auto: the kernel on CPU)
KV_CACHE_DTYPES = ("auto", "bfloat16")  # the tools' --kv-cache-dtype: what the kernels take (fused_ops.cache_fits)


def kv_cache_words(kv: str | None) -> str:
    """', KV cache in bfloat16' for a report's header where the KV cache's numbers are not the
    model's; nothing for None or auto."""
    return "" if kv in (None, "auto") else f", KV cache in {kv}"
