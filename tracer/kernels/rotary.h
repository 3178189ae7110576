/* The rotary embedding of one head of one token, as the model's RotaryEmbedding turns it, each
 * product rounded where torch rounds it: used by fused_ops.c's rope_write_kv (a step's tokens in
 * one pass) and paged_decode.c's place_token (each attention task its own token's heads). */
#ifndef NANOENGINE_ROTARY_H
#define NANOENGINE_ROTARY_H

#include "floats.h"

#define INLINE static inline __attribute__((always_inline))

/* Half a head of one token: out = x * cos + partner * sin, each product rounded, where partner is
 * the other half (first half: the second, negated in sin's table; second half: the first). */
INLINE void rotate_half(const void *x, int64_t in, int64_t partner, const void *cos,
                        const void *sin, int64_t angles, void *out, int64_t at, int64_t half,
                        const int is_bf16) {
#pragma omp simd
    for (int64_t d = 0; d < half; ++d) {
        const float c = get(cos, angles + d, is_bf16), s = get(sin, angles + d, is_bf16);
        const float a = round_to(get(x, in + d, is_bf16) * c, is_bf16);
        const float b = round_to(get(x, partner + d, is_bf16) * s, is_bf16);
        put(out, at + d, a + b, is_bf16);
    }
}

/* One head of one token: x turned by its position's angles. A half at a time: each loop reads its
 * partner at a fixed offset, with no choice per element (a quarter less time than one loop over
 * the head: docs/benchmarks.md, eighteenth round). */
INLINE void rotate(const void *x, int64_t in, const void *cos, const void *sin, int64_t angles,
                   void *out, int64_t at, int64_t dim, const int is_bf16) {
    const int64_t half = dim / 2;
    rotate_half(x, in, in + half, cos, sin, angles, out, at, half, is_bf16);
    rotate_half(x, in + half, in, cos, sin, angles + half, out, at + half, half, is_bf16);
}

#endif
