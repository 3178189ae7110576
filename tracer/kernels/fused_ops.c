/* A decoder layer's small elementwise steps, each fused into one pass: what the engine's model
 * (nanoengine/model.py) does in several torch ops, each a trip through the dispatcher and over
 * memory (vLLM has the same three as custom ops: fused_add_rms_norm, rotary_embedding with
 * reshape_and_cache, silu_and_mul).
 *
 * float32 or bfloat16 tensors, row-major and contiguous. Each step rounds where torch's does (a
 * bfloat16 product is rounded before it is added), and the sum inside a norm and the exp inside SiLU
 * are computed as torch computes them: the same bits as the torch path. Built at first use by
 * tracer/kernels/build.py. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "floats.h"
#include "rotary.h"

/* The body of each step is written once for both types; `is_bf16` is a constant in each copy, so
 * the compiler vectorizes each loop for its type. */

INLINE float add_residual(const void *x, void *residual, int64_t i, const int is_bf16) {
    float h = get(residual, i, is_bf16);
    if (x != NULL) {
        h = round_to(h + get(x, i, is_bf16), is_bf16);
        put(residual, i, h, is_bf16);
    }
    return h;
}

/* Sum of squares in the order torch's own sum takes (aten/src/ATen/native/cpu/SumKernel.cpp:
 * 8-lane vectors, 4 summed side by side, partial sums cascaded in levels of 16 rows), so that the
 * norm matches torch's to the bit: in bfloat16 one flipped rounding would change the text. */
enum { LANES = 8, ILP = 4, LEVELS = 4 };

static int64_t ceil_log2(int64_t x) {
    int64_t bits = 0;
    while (((int64_t)1 << bits) < x) ++bits;
    return bits;
}

INLINE void add_vectors(float acc[ILP][LANES], const float *x) {
    for (int k = 0; k < ILP; ++k)
#pragma omp simd
        for (int l = 0; l < LANES; ++l) acc[k][l] += x[k * LANES + l] * x[k * LANES + l];
}

static float sum_squares(const float *x, int64_t n) {
    const int64_t vectors = n / LANES, rows = vectors / ILP;
    const int64_t power = ceil_log2(rows) / LEVELS > 4 ? ceil_log2(rows) / LEVELS : 4;
    const int64_t step = (int64_t)1 << power, mask = step - 1;
    float acc[LEVELS][ILP][LANES] = {{{0}}};
    int64_t i = 0;
    while (i + step <= rows) {
        for (int64_t j = 0; j < step; ++j, ++i) add_vectors(acc[0], x + i * ILP * LANES);
        for (int j = 1; j < LEVELS; ++j) {
            for (int k = 0; k < ILP; ++k)
                for (int l = 0; l < LANES; ++l) acc[j][k][l] += acc[j - 1][k][l], acc[j - 1][k][l] = 0;
            if ((i & (mask << (j * power))) != 0) break;
        }
    }
    for (; i < rows; ++i) add_vectors(acc[0], x + i * ILP * LANES);
    for (int j = 1; j < LEVELS; ++j)
        for (int k = 0; k < ILP; ++k)
            for (int l = 0; l < LANES; ++l) acc[0][k][l] += acc[j][k][l];
    for (int64_t v = rows * ILP; v < vectors; ++v)
        for (int l = 0; l < LANES; ++l) acc[0][0][l] += x[v * LANES + l] * x[v * LANES + l];
    for (int k = 1; k < ILP; ++k)
        for (int l = 0; l < LANES; ++l) acc[0][0][l] += acc[0][k][l];
    float sum = 0.f;
    for (int64_t e = vectors * LANES; e < n; ++e) sum += x[e] * x[e];
    for (int l = 0; l < LANES; ++l) sum += acc[0][0][l];
    return sum;
}

/* One row: residual += x, then the norm. h: the row as floats (dim of scratch). */
INLINE void norm_row(const void *x, void *residual, const void *weight, void *out, int64_t row,
                     int64_t dim, float eps, float *h, const int is_bf16) {
#pragma omp simd
    for (int64_t d = 0; d < dim; ++d) {
        h[d] = get(residual, row + d, is_bf16);
        if (x != NULL) {
            h[d] = round_to(h[d] + get(x, row + d, is_bf16), is_bf16);
            put(residual, row + d, h[d], is_bf16);
        }
    }
    const float inv = 1.f / sqrtf(sum_squares(h, dim) / dim + eps);
#pragma omp simd
    for (int64_t d = 0; d < dim; ++d) {
        const float normed = round_to(h[d] * inv, is_bf16);
        put(out, row + d, get(weight, d, is_bf16) * normed, is_bf16);
    }
}

/* Rows a step needs before its norm and rotary are shared among the threads: below it, forking
 * costs what the split saves (docs/benchmarks.md, eighteenth round). Each row's arithmetic is the
 * same on any thread, so the bits are too. */
enum { SPLIT_ROWS = 8 };

/* residual += x (when x is given), then out = RMSNorm(residual) * weight, row by row: the
 * residual add of one sublayer and the norm in front of the next, in one pass. float32 norm as
 * Hugging Face's, then (bfloat16) rounded before the scale. Returns 1 where a thread could not
 * allocate its row of scratch (its rows are then left undone), else 0. */
int add_rms_norm(const void *x, void *residual, const void *weight, void *out, int64_t rows,
                 int64_t dim, float eps, int is_bf16, int num_threads) {
    int failed = 0;
#pragma omp parallel num_threads(num_threads) if (rows >= SPLIT_ROWS) reduction(| : failed)
    {
        float *h = malloc(dim * sizeof(float));
        failed |= h == NULL;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
            if (h == NULL) continue;
            if (is_bf16)
                norm_row(x, residual, weight, out, r * dim, dim, eps, h, 1);
            else
                norm_row(x, residual, weight, out, r * dim, dim, eps, h, 0);
        }
        free(h);
    }
    return failed;
}

/* Rotary embedding of q and k, and the new K/V written into the cache at their slots.
 * qkv [tokens, heads + 2 * kv_heads, dim], as the stacked projection made it; q_out [tokens,
 * heads, dim]; cos and sin [max_positions, dim] (sin with its first half negated, as
 * RotaryEmbedding keeps it); caches [num_blocks, kv_heads, block_size, dim] (TorchAttention's
 * layout; slot = block * block_size + row), bfloat16 where kv_bf16 says so. Each pair (x[i],
 * x[i + half]) turns by its position's angle. */
void rope_write_kv(const void *qkv, const int64_t *positions, const void *cos, const void *sin,
                   const int64_t *slot_mapping, void *k_cache, void *v_cache, void *q_out,
                   int64_t tokens, int64_t heads, int64_t kv_heads, int64_t dim, int64_t block_size,
                   int is_bf16, int kv_bf16, int num_threads) {
    const int64_t width = (heads + 2 * kv_heads) * dim;
#pragma omp parallel for num_threads(num_threads) if (tokens >= SPLIT_ROWS) schedule(static)
    for (int64_t t = 0; t < tokens; ++t) {
        const int64_t angles = positions[t] * dim;
        for (int64_t h = 0; h < heads; ++h)
            turn_head(qkv, t * width + h * dim, cos, sin, angles, q_out, (t * heads + h) * dim, dim,
                      is_bf16, is_bf16);
        for (int64_t h = 0; h < kv_heads; ++h)
            write_kv_head(qkv, t * width, heads, kv_heads, h, dim, cos, sin, angles,
                          slot_mapping[t], block_size, k_cache, v_cache, is_bf16, kv_bf16);
    }
}

/* silu(gate) * up, rounded where torch rounds; e^-gate by SLEEF's algorithm or the C library's */
INLINE float silu_times(float gate, float up, const int sleef, const int is_bf16) {
    const float e = sleef ? sleef_expf(-gate) : expf(-gate);
    return round_to(gate / (1.f + e), is_bf16) * up;
}

/* out[i] = silu(gate[i]) * up[i] for n elements, like torch's silu element by element: its vector
 * loop (SLEEF's exp) takes the first `vectorized` of them, the C library's expf the rest. Two
 * loops: a choice made inside one loop would keep it scalar. */
INLINE void silu_span(const void *gate, const void *up, void *out, int64_t n, int64_t vectorized,
                      const int is_bf16) {
    for (int64_t i = 0; i < vectorized; ++i)
        put(out, i, silu_times(get(gate, i, is_bf16), get(up, i, is_bf16), 1, is_bf16), is_bf16);
    for (int64_t i = vectorized; i < n; ++i)
        put(out, i, silu_times(get(gate, i, is_bf16), get(up, i, is_bf16), 0, is_bf16), is_bf16);
}

/* The elements of a row of `width` that torch's vector loop takes: whole runs of `run` */
static inline int64_t silu_vectorized(int64_t width, int64_t run) {
    return run > 0 ? width - width % run : 0;
}

/* Row r of silu_and_mul */
INLINE void silu_rows(const void *gate_up, void *out, int64_t r, int64_t width, int64_t run,
                      const int is_bf16) {
    const int64_t size = is_bf16 ? 2 : 4;
    const char *gate = (const char *)gate_up + r * 2 * width * size;
    silu_span(gate, gate + width * size, (char *)out + r * width * size, width,
              silu_vectorized(width, run), is_bf16);
}

/* out = silu(gate) * up, gate_up [rows, 2 * width] as the stacked projection made it; run: the
 * elements torch's silu takes at once on this CPU (0: none, all through expf). */
void silu_and_mul(const void *gate_up, void *out, int64_t rows, int64_t width, int64_t run,
                  int is_bf16, int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (rows * width >= 32768)
    for (int64_t r = 0; r < rows; ++r)
        if (is_bf16)
            silu_rows(gate_up, out, r, width, run, 1);
        else
            silu_rows(gate_up, out, r, width, run, 0);
}
