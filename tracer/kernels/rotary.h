/* The rotary embedding of one head of one token, as the model's RotaryEmbedding turns it, each
 * product rounded where torch rounds it, and a token's new K/V written at its slot: used by
 * fused_ops.c's rope_write_kv (a step's tokens in one pass) and paged_decode.c's place_token (each
 * attention task its own token's heads). */
#ifndef NANOENGINE_ROTARY_H
#define NANOENGINE_ROTARY_H

#include <string.h>

#include "floats.h"

/* Half a head of one token: out = x * cos + partner * sin, each product rounded, where partner is
 * the other half (first half: the second, negated in sin's table; second half: the first). */
INLINE void rotate_half(const void *x, int64_t in, int64_t partner, const void *cos,
                        const void *sin, int64_t angles, void *out, int64_t at, int64_t half,
                        const int is_bf16, const int out_bf16) {
#pragma omp simd
    for (int64_t d = 0; d < half; ++d) {
        const float c = get(cos, angles + d, is_bf16), s = get(sin, angles + d, is_bf16);
        const float a = round_to(get(x, in + d, is_bf16) * c, is_bf16);
        const float b = round_to(get(x, partner + d, is_bf16) * s, is_bf16);
        put(out, at + d, a + b, out_bf16);
    }
}

/* One head of one token: x turned by its position's angles. A half at a time: each loop reads its
 * partner at a fixed offset, with no choice per element (a quarter less time than one loop over
 * the head: docs/benchmarks.md, eighteenth round). */
INLINE void rotate(const void *x, int64_t in, const void *cos, const void *sin, int64_t angles,
                   void *out, int64_t at, int64_t dim, const int is_bf16, const int out_bf16) {
    const int64_t half = dim / 2;
    rotate_half(x, in, in + half, cos, sin, angles, out, at, half, is_bf16, out_bf16);
    rotate_half(x, in + half, in, cos, sin, angles + half, out, at + half, half, is_bf16,
                out_bf16);
}

/* rotate, with the element types fixed in each branch (so each loop vectorizes for its types):
 * x's, and out's (bfloat16 for a bfloat16 KV cache under a float32 model, else x's; a float32 out
 * under bfloat16 x is never asked for: fused_ops.py's cache_fits refuses it first) */
static inline void turn_head(const void *x, int64_t in, const void *cos, const void *sin,
                             int64_t angles, void *out, int64_t at, int64_t dim, int is_bf16,
                             int out_bf16) {
    if (is_bf16)
        rotate(x, in, cos, sin, angles, out, at, dim, 1, 1);
    else if (out_bf16)
        rotate(x, in, cos, sin, angles, out, at, dim, 0, 1);
    else
        rotate(x, in, cos, sin, angles, out, at, dim, 0, 0);
}

/* KV head h of a token whose stacked q/k/v row starts at qkv's element `in`: its key turned and
 * written at the token's slot, its value copied beside it; into a bfloat16 cache (kv_bf16) from a
 * float32 qkv, each rounded as torch's .to(torch.bfloat16) rounds it. Caches [num_blocks,
 * kv_heads, block_size, dim] (TorchAttention's layout; slot = block * block_size + row). */
static inline void write_kv_head(const void *qkv, int64_t in, int64_t heads, int64_t kv_heads,
                                 int64_t h, int64_t dim, const void *cos, const void *sin,
                                 int64_t angles, int64_t slot, int64_t block_size, void *k_cache,
                                 void *v_cache, int is_bf16, int kv_bf16) {
    const int64_t row = slot / block_size * kv_heads * block_size + slot % block_size; /* head 0 */
    const int64_t at = (row + h * block_size) * dim, size = is_bf16 ? 2 : 4;
    turn_head(qkv, in + (heads + h) * dim, cos, sin, angles, k_cache, at, dim, is_bf16, kv_bf16);
    const char *v = (const char *)qkv + (in + (heads + kv_heads + h) * dim) * size;
    if (kv_bf16 == is_bf16)
        memcpy((char *)v_cache + at * size, v, dim * size);
    else
        for (int64_t d = 0; d < dim; ++d) put(v_cache, at + d, get(v, d, 0), 1);
}

#endif
