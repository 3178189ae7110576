"""Build the model from a loaded checkpoint: the module tree, its weights (stacked as vLLM stacks
q/k/v and gate/up), on the device in the dtype asked for, packed for the CPU's matmul library."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from nanoengine.loading.tiny import init_tiny_weights
from nanoengine.model import ONEDNN, STACKED, CausalLM, Linear, ModelConfig


def build_model(
    hf_config: ModelConfig,
    state_dict: dict[str, torch.Tensor] | None,
    max_positions: int,
    device: torch.device,
    dtype: torch.dtype,
) -> CausalLM:
    with skip_random_init():
        model = CausalLM(hf_config, max_positions)
    if state_dict is None:
        init_tiny_weights(model)
    else:
        load_weights(model, state_dict)
    return model.to(device=device, dtype=dtype).eval()


def pack_for_onednn(model: nn.Module) -> None:
    """Linear weights in oneDNN's blocked layout, once after loading rather than at every call
    (as vLLM's CPU backend does): float32 always, bfloat16 where oneDNN has bf16 kernels."""
    bf16 = ONEDNN and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    dtypes = (torch.float32, torch.bfloat16) if bf16 else (torch.float32,)

    def pack(m: Linear) -> None:  # laid out for batches of about 32 rows: a decode step's size
        if ONEDNN and m.weight.is_cpu and m.weight.dtype in dtypes:
            packed = torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), 32)
            m.weight = nn.Parameter(packed, requires_grad=False)

    with ThreadPoolExecutor(2) as pool:  # two at a time: 3x faster (docs/benchmarks.md)
        list(pool.map(pack, [m for m in model.modules() if isinstance(m, Linear)]))


def load_weights(model: CausalLM, state_dict: dict[str, torch.Tensor]) -> None:
    try:
        missing, _ = model.load_state_dict(stack_weights(state_dict), strict=False, assign=True)
    except KeyError as e:  # one part of a stacked weight (stack_weights)
        raise ValueError(f"checkpoint lacks weights: {e}; re-download the model") from None
    except RuntimeError as e:  # a weight whose shape config.json does not describe
        lines = [line.strip() for line in str(e).splitlines() if "size mismatch" in line]
        mismatch = lines[0] if lines else str(e)
        raise ValueError(
            f"the weights do not fit config.json: {mismatch[:200]}; re-download the model"
        ) from None
    if model.config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
        missing = [k for k in missing if k != "lm_head.weight"]
    if missing:
        raise ValueError(f"checkpoint lacks weights: {', '.join(missing[:3])} ...")


def stack_weights(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A checkpoint's separate q, k, v_proj (gate, up_proj) weights and biases, concatenated."""
    out = dict(state_dict)
    for fused, parts in STACKED.items():
        for name in [n for n in state_dict if f".{parts[0]}." in n]:
            names = [name.replace(parts[0], part) for part in parts]
            out[name.replace(parts[0], fused)] = torch.cat([out.pop(n) for n in names])
    return out


@contextmanager
def skip_random_init() -> Iterator[None]:
    """Leave the weights uninitialised: a checkpoint or init_tiny_weights fills them.

    Not the meta device: its first use is slow to import (docs/benchmarks.md)."""
    saved = {cls: cls.reset_parameters for cls in (nn.Linear, nn.Embedding)}
    for cls in saved:
        cls.reset_parameters = lambda self: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        for cls, init in saved.items():
            cls.reset_parameters = init  # type: ignore[method-assign]


def eos_ids(hf_config: ModelConfig, tokenizer: Any) -> frozenset[int]:
    """The config's EOS id or ids, and the tokenizer's."""
    configured = hf_config.eos_token_id
    ids = list(configured) if isinstance(configured, list) else [configured]
    ids.append(getattr(tokenizer, "eos_token_id", None))
    return frozenset(i for i in ids if i is not None)
