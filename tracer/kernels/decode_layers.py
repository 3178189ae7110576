"""All of the decoder's layers for a decode step of a few sequences in one call of decode_layers.c:
what FusedDecoder.forward's loop does, with the same functions in the same order, without ~270
calls from Python a step. FusedDecoder takes it when every row is a decode, there are no more of
them than the linears' kernel takes (float32: 64, 8 without AVX2; bfloat16: 32 on AMX, 64 with
AVX512_BF16 alone), and every linear agrees with oneDNN at that many rows (checked before the first
such step); the layer loop otherwise."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
from torch import Tensor

from nanoengine.attention import AttentionMetadata, KVCache
from tracer.kernels.build import FLAGS, load
from tracer.kernels.fused_ops import cache_fits, silu_vector_run
from tracer.kernels.packed_linear import FewRowsLinear, amx_ready

if TYPE_CHECKING:
    from tracer.kernels.fused_decoder import LayerParts

SOURCE = Path(__file__).with_name("decode_layers.c")
I64, PTR, FLOAT = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float


class LinearArgs(ctypes.Structure):  # decode_layers.c: linear_t
    _fields_ = [
        ("weight", PTR),
        ("bias", PTR),
        ("in_features", I64),
        ("in_padded", I64),
        ("out_features", I64),
        ("chunk", I64),
    ]


class LayerArgs(ctypes.Structure):  # layer_t
    _fields_ = [
        ("input_norm", PTR),
        ("post_attention_norm", PTR),
        ("input_eps", FLOAT),
        ("post_attention_eps", FLOAT),
        ("qkv", LinearArgs),
        ("o", LinearArgs),
        ("gate_up", LinearArgs),
        ("down", LinearArgs),
        ("k_cache", PTR),
        ("v_cache", PTR),
    ]


class StepArgs(ctypes.Structure):  # step_t
    _fields_ = [
        ("rows", I64),
        ("hidden", I64),
        ("heads", I64),
        ("kv_heads", I64),
        ("dim", I64),
        ("intermediate", I64),
        ("scale", FLOAT),
        ("cos", PTR),
        ("sin", PTR),
        ("positions", PTR),
        ("slot_mapping", PTR),
        ("block_tables", PTR),
        ("seq_lens", PTR),
        ("num_blocks", I64),
        ("block_size", I64),
        ("max_blocks", I64),
        ("silu_run", I64),
        ("threads", ctypes.c_int),
        ("is_bf16", ctypes.c_int),
        ("kv_bf16", ctypes.c_int),
        ("amx", ctypes.c_int),
    ]


@functools.cache
def decode_layers_library(source: Path = SOURCE, flags: tuple[str, ...] = FLAGS) -> ctypes.CDLL:
    library = load(source, flags)
    library.decode_layers.argtypes = [ctypes.POINTER(LayerArgs), I64, ctypes.POINTER(StepArgs), PTR]
    library.decode_layers.restype = ctypes.c_int
    return library


def linear_args(linear: FewRowsLinear, rows: int) -> LinearArgs:
    shape, chunk = linear.shape, linear.agreement.rows[rows]
    bias = None if linear.bias is None else linear.bias.data_ptr()
    return LinearArgs(linear.address, bias, shape.in_features, shape.in_padded, shape.out_features, chunk)


class DecodeLayers:
    """The layers' arguments, gathered once per row count (and again if the KV caches move)."""

    def __init__(self, layers: Sequence[LayerParts], intermediate: int):
        self.layers = layers
        self.intermediate = intermediate
        linears = [linear for p in layers for linear in p.linears()]
        # what must have agreed with oneDNN at a step's row count; none where a linear has no kernel
        self.agreeing: list[FewRowsLinear] = []  # one linear of each shape
        self.max_rows, self.dtype = 0, torch.float32
        kernels = [x for x in linears if isinstance(x, FewRowsLinear)]
        if kernels and len(kernels) == len(linears) and len({x.shape.dtype for x in kernels}) == 1:
            self.agreeing = list({id(x.agreement): x for x in kernels}.values())
            self.max_rows, self.dtype = kernels[0].max_rows, kernels[0].shape.dtype
        self.args: dict[int, ctypes.Array[LayerArgs]] = {}  # by row count
        self.caches_at = 0  # the first KV cache's address when args were gathered

    def fits(self, rows: int, residual: Tensor, meta: AttentionMetadata) -> bool:
        """Every row a decode, few enough rows in the linears' dtype, and every linear agreed at
        that many (asked now where this is the first step of that many rows)."""
        return (
            0 < rows <= self.max_rows
            and meta.max_query_len == 1
            and residual.dtype == self.dtype
            and all(linear.agree(rows) for linear in self.agreeing)
        )

    def layer_args(self, kv_caches: list[KVCache], rows: int) -> ctypes.Array[LayerArgs]:
        """Each layer's arguments at this many rows (whose chunks the linears' agreements hold)."""
        if self.caches_at != kv_caches[0].data_ptr():
            self.args.clear()
            self.caches_at = kv_caches[0].data_ptr()
        if rows not in self.args:
            args = []
            for p, kv in zip(self.layers, kv_caches):
                if not kv.is_contiguous() or not cache_fits(self.dtype, kv.dtype):
                    raise ValueError(f"decode_layers needs contiguous KV caches that fit {self.dtype}")
                k_cache = kv.data_ptr()
                v_cache = k_cache + kv.stride(0) * kv.element_size()
                norm, post = p.input_norm, p.post_attention_norm
                linears = (linear_args(cast(FewRowsLinear, x), rows) for x in p.linears())  # as fits() saw
                args.append(
                    LayerArgs(
                        norm.weight.data_ptr(), post.weight.data_ptr(), norm.eps, post.eps, *linears, k_cache, v_cache
                    )
                )
            self.args[rows] = (LayerArgs * len(args))(*args)
        return self.args[rows]

    def run(
        self,
        residual: Tensor,
        positions: Tensor,
        rope: tuple[Tensor, Tensor],
        kv_caches: list[KVCache],
        meta: AttentionMetadata,
    ) -> None:
        """residual [rows, hidden]: the embedded tokens in, the last layer's residual stream out."""
        rows, hidden = residual.shape
        first, kv = self.layers[0], kv_caches[0]
        _, num_blocks, kv_heads, block_size, dim = kv.shape
        tables, lens = meta.block_tables.to(torch.int32).contiguous(), meta.seq_lens.to(torch.int32).contiguous()
        cos, sin = rope
        step = StepArgs(
            rows,
            hidden,
            first.num_heads,
            kv_heads,
            dim,
            self.intermediate,
            first.scale,
            cos.data_ptr(),
            sin.data_ptr(),
            positions.data_ptr(),
            meta.slot_mapping.data_ptr(),
            tables.data_ptr(),
            lens.data_ptr(),
            num_blocks,
            block_size,
            tables.shape[1],
            silu_vector_run(),
            torch.get_num_threads(),
            int(self.dtype == torch.bfloat16),
            int(kv.dtype == torch.bfloat16),
            int(amx_ready()),
        )
        args = self.layer_args(kv_caches, rows)
        status = decode_layers_library().decode_layers(args, len(args), ctypes.byref(step), residual.data_ptr())
        if status & 2:
            raise IndexError("decode_layers: a block table points outside the KV pool or is shorter than its sequence")
        if status & 1:
            raise MemoryError("decode_layers could not allocate its buffers")
