/* Paged attention for decode on the CPU: each sequence's single query token reads its keys and
 * values where its pages lie in the KV cache, once. The torch path (nanoengine/attention.py)
 * gathers the pages into a padded copy first and then reads that copy twice, in two matmuls.
 *
 * Layout, as TorchAttention owns it: k_cache and v_cache [num_blocks, kv_heads, block_size, dim];
 * q and out [num_seqs, heads, dim]; block_tables [num_seqs, max_blocks] int32; seq_lens int32.
 * Query head h reads KV head h / group (grouped-query attention). float32 or bfloat16, the cache
 * in q's type or bfloat16 under float32 q (the engine's kv_cache_dtype); the sums, the softmax and
 * the weighted values are float32 either way.
 *
 * Built at first use by tracer/kernels/build.py; threads come from torch's own OpenMP runtime. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "floats.h"
#include "rotary.h"

/* The INLINE functions below are inlined into each caller, so a head dim known there (64, 128)
 * fixes every loop's trip count: the compiler unrolls them, which took a quarter off the kernel's
 * time at head dim 64. */

static void load_floats(const void *src, int64_t offset, int64_t n, int is_bf16, float *dst) {
    if (!is_bf16) {
        memcpy(dst, (const float *)src + offset, n * sizeof(float));
        return;
    }
    const uint16_t *s = (const uint16_t *)src + offset;
    for (int64_t i = 0; i < n; ++i) dst[i] = from_bf16(s[i]);
}

/* a . b, summed in one fixed order whatever the pointers' alignment (so a request gets the same
 * numbers in any batch): 16 running sums, one per vector lane, added up last. */
INLINE float dot(const float *a, const void *b, int64_t n, int is_bf16) {
    float lanes[16] = {0}, sum = 0.f;
    int64_t d = 0;
    for (; d + 16 <= n; d += 16)
#pragma omp simd
        for (int i = 0; i < 16; ++i)
            lanes[i] = __builtin_fmaf(a[d + i], get(b, d + i, is_bf16), lanes[i]);
    for (; d < n; ++d) sum = __builtin_fmaf(a[d], get(b, d, is_bf16), sum);
    for (int i = 0; i < 16; ++i) sum += lanes[i];
    return sum;
}

/* Start reading row t of the next block while row t of this one is computed on: spread out, the
 * requests keep memory busy without filling the core's miss buffers at once (a whole block at a
 * time stalled the core at each block boundary). Into L2 (locality 2: prefetcht1), as the weights'
 * kernels ask: a request for L1 holds one of L1's few miss buffers until its line arrives, and
 * those capped the lines in flight; L2 keeps more. 32 sequences over 30 layers: 0.63-0.69x the
 * time in float32, 0.77-0.84x in bfloat16 (docs/benchmarks.md, twenty-seventh round). */
INLINE void prefetch_row(const char *block, int64_t t, int64_t row_bytes) {
    for (int64_t i = t * row_bytes; i < (t + 1) * row_bytes; i += 64)
        __builtin_prefetch(block + i, 0, 2);
}

/* The block after block j of a sequence's table (the last block is its own next). */
INLINE const char *next_block(const void *head, const int32_t *table, int64_t j, int64_t num_blocks,
                              int64_t block_bytes) {
    return (const char *)head + table[j + 1 < num_blocks ? j + 1 : j] * block_bytes;
}

/* How many of a sequence's len tokens block j holds (the last block may be part full). */
INLINE int64_t tokens_in_block(int64_t j, int64_t len, int64_t block_size) {
    return len - j * block_size < block_size ? len - j * block_size : block_size;
}

/* 2. softmax over each query head's scores, in place */
INLINE void softmax(float *scores, int64_t group, int64_t len) {
    for (int64_t g = 0; g < group; ++g) {
        float *s = scores + g * len, max = s[0], sum = 0.f;
#pragma omp simd reduction(max : max) /* the largest is the largest in any order */
        for (int64_t t = 1; t < len; ++t) max = s[t] > max ? s[t] : max;
#pragma omp simd reduction(+ : sum) /* the scores lie where only len decides: one order */
        for (int64_t t = 0; t < len; ++t) sum += (s[t] = sleef_expf(s[t] - max));
        for (int64_t t = 0; t < len; ++t) s[t] /= sum;
    }
}

/* One sequence's query heads that share one KV head: q [group, dim] floats (already scaled) ->
 * out [group, dim] floats; scores: group * len floats. k_head and v_head: that KV head's rows in
 * block 0; stride: the bytes from one block to the next. The cache is read where it lies, bfloat16
 * widened number by number (a block converted to a copy first took 13 % longer). While the scores
 * pass reads a block's keys it asks for the block's values too, which pass 3 then finds in the
 * cache (docs/benchmarks.md, fifteenth round). */
INLINE void attend(const float *q, const char *k_head, const char *v_head, const int32_t *table,
                   int64_t len, int64_t group, int64_t dim, int64_t block_size, int64_t stride,
                   int is_bf16, float *scores, float *out) {
    const int64_t num_blocks = (len + block_size - 1) / block_size;
    const int elem_size = is_bf16 ? 2 : 4;
    for (int64_t j = 0; j < num_blocks; ++j) { /* 1. scores: q . k for every cached token */
        const char *k = k_head + table[j] * stride;
        const char *next = next_block(k_head, table, j, num_blocks, stride);
        const int64_t first = j * block_size;
        const int64_t n = tokens_in_block(j, len, block_size);
        const char *v = v_head + table[j] * stride; /* for pass 3 */
        for (int64_t t = 0; t < n; ++t) {
            prefetch_row(next, t, dim * elem_size);
            prefetch_row(v, t, dim * elem_size);
            for (int64_t g = 0; g < group; ++g)
                scores[g * len + first + t] =
                    dot(q + g * dim, k + t * dim * elem_size, dim, is_bf16);
        }
    }
    softmax(scores, group, len); /* 2. */
    memset(out, 0, group * dim * sizeof(float));
    for (int64_t j = 0; j < num_blocks; ++j) { /* 3. out = sum of probability x value */
        const char *v = v_head + table[j] * stride;
        const char *next = next_block(v_head, table, j, num_blocks, stride);
        const int64_t first = j * block_size;
        const int64_t n = tokens_in_block(j, len, block_size);
        for (int64_t t = 0; t < n; ++t) {
            prefetch_row(next, t, dim * elem_size);
            for (int64_t g = 0; g < group; ++g) {
                const float p = scores[g * len + first + t];
                const char *row = v + t * dim * elem_size;
#pragma omp simd
                for (int64_t d = 0; d < dim; ++d)
                    out[g * dim + d] =
                        __builtin_fmaf(p, get(row, d, is_bf16), out[g * dim + d]);
            }
        }
    }
}

#if defined(__AVX512F__)
#include <immintrin.h>

/* 16 numbers of a cache row from its d-th on, as floats (bfloat16 widened: exact) */
INLINE __m512 load16(const char *row, int64_t d, int is_bf16) {
    if (!is_bf16) return _mm512_loadu_ps((const float *)row + d);
    const __m256i half = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + d));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

/* 32 numbers of a cache row from its d-th on, for pass 3: float32 as two vectors of 16 in order;
 * bfloat16 as one 64-byte load, the numbers at even places widened into v[0] (a shift) and those at
 * odd places into v[1] (a mask): three instructions for 32 numbers instead of six. Each output
 * number still sums its own products in token order, wherever its lane is: the same bits, once
 * store32 has put them back in order. */
INLINE void load32(const char *row, int64_t d, int is_bf16, __m512 v[2]) {
    if (!is_bf16) {
        v[0] = _mm512_loadu_ps((const float *)row + d);
        v[1] = _mm512_loadu_ps((const float *)row + d + 16);
        return;
    }
    const __m512i x = _mm512_loadu_si512((const uint16_t *)row + d);
    v[0] = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
    v[1] = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32((int)0xFFFF0000)));
}

/* 32 floats to dst as load32 laid them out: bfloat16's even and odd places put back in order */
INLINE void store32(float *dst, const __m512 v[2], int is_bf16) {
    if (!is_bf16) {
        _mm512_storeu_ps(dst, v[0]);
        _mm512_storeu_ps(dst + 16, v[1]);
        return;
    }
    const __m512i low = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i high = _mm512_add_epi32(low, _mm512_set1_epi32(8));
    _mm512_storeu_ps(dst, _mm512_permutex2var_ps(v[0], low, v[1]));
    _mm512_storeu_ps(dst + 16, _mm512_permutex2var_ps(v[0], high, v[1]));
}

/* r[t][i] -> r[i][t] for a 16 x 16 tile of floats, in registers */
INLINE void transpose16(__m512 r[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        u[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int b = 0; b < 4; ++b) { /* u[4a + b]: rows 4a..4a+3, their elements b, b+4, b+8, b+12 */
        const __m512 v0 = _mm512_shuffle_f32x4(u[b], u[4 + b], 0x88);
        const __m512 v1 = _mm512_shuffle_f32x4(u[b], u[4 + b], 0xDD);
        const __m512 v2 = _mm512_shuffle_f32x4(u[8 + b], u[12 + b], 0x88);
        const __m512 v3 = _mm512_shuffle_f32x4(u[8 + b], u[12 + b], 0xDD);
        r[b] = _mm512_shuffle_f32x4(v0, v2, 0x88);
        r[b + 8] = _mm512_shuffle_f32x4(v0, v2, 0xDD);
        r[b + 4] = _mm512_shuffle_f32x4(v1, v3, 0x88);
        r[b + 12] = _mm512_shuffle_f32x4(v1, v3, 0xDD);
    }
}

/* Pass 1 for m <= 16 tokens whose keys start at k: each query head's m scores at once. dot() adds
 * a score's 16 lanes one after the other; here the tokens' lanes are turned so that lane i of all
 * 16 tokens lies in one vector, and the 16 vectors are added in that same order: the same sums, one
 * vector addition for 16 tokens instead of one addition each. Each key is widened once for up to 8
 * query heads; while it is read, the same rows of the next block's keys and of this block's values
 * are asked for. */
enum { SCORE_TOKENS = 16 }; /* tokens score_tokens takes at once */
INLINE void score_tokens(const float *q, const char *k, int64_t m, int64_t group, int64_t dim,
                         int is_bf16, const char *next, const char *v, int64_t len,
                         float *scores) {
    const int64_t row_bytes = dim * (is_bf16 ? 2 : 4);
    for (int64_t g0 = 0; g0 < group; g0 += 8) { /* up to 8 query heads a sweep */
        const int64_t heads = group - g0 < 8 ? group - g0 : 8;
        __m512 lanes[8][16];
        for (int64_t t = 0; t < 16; ++t) {
            __m512 key[8]; /* a token's key, widened once for all the heads */
            if (t < m) {
                if (g0 == 0) {
                    prefetch_row(next, t, row_bytes);
                    prefetch_row(v, t, row_bytes);
                }
                for (int64_t c = 0; c < dim / 16; ++c)
                    key[c] = load16(k + t * row_bytes, c * 16, is_bf16);
            }
            for (int64_t h = 0; h < heads; ++h) {
                __m512 sum = _mm512_setzero_ps();
                if (t < m)
                    for (int64_t c = 0; c < dim / 16; ++c)
                        sum = _mm512_fmadd_ps(_mm512_loadu_ps(q + (g0 + h) * dim + c * 16), key[c],
                                              sum);
                lanes[h][t] = sum;
            }
        }
        for (int64_t h = 0; h < heads; ++h) {
            transpose16(lanes[h]);
            __m512 sum = _mm512_setzero_ps();
            for (int i = 0; i < 16; ++i) sum = _mm512_add_ps(sum, lanes[h][i]);
            _mm512_mask_storeu_ps(scores + (g0 + h) * len, (__mmask16)((1u << m) - 1), sum);
        }
    }
}

/* Pass 3 (out = sum of probability x value) in AVX-512 vectors, up to 16 vectors of outputs in
 * registers: as many query heads at a time as fit. Its values were asked for in pass 1, so it reads
 * the cache, not memory: meanwhile it asks for the keys of the task this thread runs next, k_after
 * (NULL: none known), whose pass 1 then finds them there (0.91x the time, twenty-third round). With
 * score_tokens, attend_wide's 0.7x the plain loops' time for bfloat16 and 0.87x for float32
 * (docs/benchmarks.md, sixteenth round). */
INLINE void values_pass(const float *scores, const char *v_head, const int32_t *table, int64_t len,
                        int64_t group, int64_t dim, int64_t block_size, int64_t stride,
                        int is_bf16, float *out, const char *k_after) {
    const int64_t num_blocks = (len + block_size - 1) / block_size;
    const int64_t row_bytes = dim * (is_bf16 ? 2 : 4);
    const int64_t chunks = dim / 16, heads = 16 / chunks; /* query heads a sweep over V holds */
    for (int64_t g0 = 0; g0 < group; g0 += heads) {
        __m512 acc[16];
        for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
        for (int64_t j = 0; j < num_blocks; ++j) {
            const char *v = v_head + table[j] * stride;
            const char *next = next_block(v_head, table, j, num_blocks, stride);
            const int64_t first = j * block_size;
            const int64_t n = tokens_in_block(j, len, block_size);
            const char *k_next_task = k_after && g0 == 0 ? k_after + table[j] * stride : NULL;
            for (int64_t t = 0; t < n; ++t) {
                prefetch_row(next, t, row_bytes);
                if (k_next_task) prefetch_row(k_next_task, t, row_bytes);
                for (int64_t c = 0; c < chunks; c += 2) {
                    __m512 value[2];
                    load32(v + t * row_bytes, c * 16, is_bf16, value);
                    for (int64_t u = 0; u < 2; ++u)
                        for (int64_t h = 0; h < heads && g0 + h < group; ++h)
                            acc[h * chunks + c + u] = _mm512_fmadd_ps(
                                _mm512_set1_ps(scores[(g0 + h) * len + first + t]), value[u],
                                acc[h * chunks + c + u]);
                }
            }
        }
        for (int64_t h = 0; h < heads && g0 + h < group; ++h)
            for (int64_t c = 0; c < chunks; c += 2)
                store32(out + (g0 + h) * dim + c * 16, acc + h * chunks + c, is_bf16);
    }
}
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

/* 8 numbers of a cache row from its d-th on, as floats (bfloat16 widened: exact) */
INLINE __m256 load8(const char *row, int64_t d, int is_bf16) {
    if (!is_bf16) return _mm256_loadu_ps((const float *)row + d);
    const __m128i half = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + d));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
}

/* 16 numbers of a cache row from its d-th on, for pass 3, as a pair of vectors (as AVX-512's
 * load32 takes 32): float32 in order; bfloat16 by one 32-byte load, the numbers at even places
 * widened into v[0] (a shift) and those at odd places into v[1] (a mask). Widening 8 at a time
 * (load8) took a vpmovzxwd each, and on a Zen 3 those, not the multiply-adds, set pass 3's pace:
 * attention with a bfloat16 cache 0.90-0.93x the time (docs/benchmarks.md, thirty-eighth round).
 * put_back16 puts each output back in place: each sums its own products in token order, the
 * same bits. */
INLINE void load16_pair(const char *row, int64_t d, int is_bf16, __m256 v[2]) {
    if (!is_bf16) {
        v[0] = _mm256_loadu_ps((const float *)row + d);
        v[1] = _mm256_loadu_ps((const float *)row + d + 8);
        return;
    }
    const __m256i x = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + d));
    v[0] = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
    v[1] = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32((int)0xFFFF0000)));
}

/* 16 floats at p, laid out as load16_pair widens a bfloat16 row (its even places, then its odd
 * ones), put back in order, in place */
INLINE void put_back16(float *p) {
    const __m256 even = _mm256_loadu_ps(p), odd = _mm256_loadu_ps(p + 8);
    const __m256 lo = _mm256_unpacklo_ps(even, odd), hi = _mm256_unpackhi_ps(even, odd);
    _mm256_storeu_ps(p, _mm256_permute2f128_ps(lo, hi, 0x20));
    _mm256_storeu_ps(p + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
}

/* r[t][i] -> r[i][t] for an 8 x 8 tile of floats, in registers */
INLINE void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; ++i) { /* u[i]: rows 0-3 and 4-7 of columns i (low) and i + 4 (high) */
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

/* Pass 1 for m <= 8 tokens whose keys start at k, as AVX-512's copy does 16: dot()'s 16
 * lanes of a score are two vectors, lanes 0-7 and 8-15; turned, lane i of 8 tokens lies in one
 * vector, and the 16 are added in dot()'s order. Each key is widened once for up to 4 query heads;
 * the same rows of the next block's keys and of this block's values are asked for meanwhile. */
enum { SCORE_TOKENS = 8 };
INLINE void score_tokens(const float *q, const char *k, int64_t m, int64_t group, int64_t dim,
                         int is_bf16, const char *next, const char *v, int64_t len,
                         float *scores) {
    const int64_t row_bytes = dim * (is_bf16 ? 2 : 4);
    for (int64_t g0 = 0; g0 < group; g0 += 4) { /* up to 4 query heads a sweep */
        const int64_t heads = group - g0 < 4 ? group - g0 : 4;
        __m256 low[4][8], high[4][8];
        for (int64_t t = 0; t < 8; ++t) {
            __m256 key[16]; /* a token's key, widened once for all the heads */
            if (t < m) {
                if (g0 == 0) {
                    prefetch_row(next, t, row_bytes);
                    prefetch_row(v, t, row_bytes);
                }
                for (int64_t c = 0; c < dim / 8; ++c)
                    key[c] = load8(k + t * row_bytes, c * 8, is_bf16);
            }
            for (int64_t h = 0; h < heads; ++h) {
                const float *qh = q + (g0 + h) * dim;
                __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
                if (t < m)
                    for (int64_t c = 0; c < dim / 16; ++c) {
                        lo = _mm256_fmadd_ps(_mm256_loadu_ps(qh + c * 16), key[2 * c], lo);
                        hi = _mm256_fmadd_ps(_mm256_loadu_ps(qh + c * 16 + 8), key[2 * c + 1], hi);
                    }
                low[h][t] = lo;
                high[h][t] = hi;
            }
        }
        for (int64_t h = 0; h < heads; ++h) {
            transpose8(low[h]);
            transpose8(high[h]);
            __m256 sum = _mm256_setzero_ps();
            for (int i = 0; i < 8; ++i) sum = _mm256_add_ps(sum, low[h][i]);
            for (int i = 0; i < 8; ++i) sum = _mm256_add_ps(sum, high[h][i]);
            /* a memcpy whose length is known only here is a `rep movs`, and with the stall of
             * reading back the vector just stored it took 4-9 % of attention's arithmetic */
            if (m == 8) {
                _mm256_storeu_ps(scores + (g0 + h) * len, sum);
            } else {
                float eight[8];
                _mm256_storeu_ps(eight, sum);
                memcpy(scores + (g0 + h) * len, eight, m * sizeof(float));
            }
        }
    }
}

/* Pass 3 in AVX2 vectors, block by block: for each query head, 64 outputs at a time in 8
 * vectors, carried from block to block in out (the values were asked for in pass 1; the block's
 * first sweep asks for the next block's, and for the keys of the task this thread runs next,
 * k_after). A sequence's values (~50 kB) outgrow L1, so sweeping them whole for each head read
 * every row from L2 once a head; a block's (4 kB) stay in L1 for the heads after the first: 0.96x
 * attention's time with either cache (docs/benchmarks.md, thirty-ninth round). Each output still
 * adds its products in token order: the same bits. With score_tokens, on a Zen 3 a decode step's
 * attention at >= 16 rows took 12.1 ms against the plain loops' 13.2 (thirty-fourth round). */
INLINE void values_pass(const float *scores, const char *v_head, const int32_t *table, int64_t len,
                        int64_t group, int64_t dim, int64_t block_size, int64_t stride,
                        int is_bf16, float *out, const char *k_after) {
    const int64_t num_blocks = (len + block_size - 1) / block_size;
    const int64_t row_bytes = dim * (is_bf16 ? 2 : 4);
    memset(out, 0, group * dim * sizeof(float));
    for (int64_t j = 0; j < num_blocks; ++j) {
        const char *v = v_head + table[j] * stride;
        const char *next = next_block(v_head, table, j, num_blocks, stride);
        const int64_t first = j * block_size;
        const int64_t n = tokens_in_block(j, len, block_size);
        const char *k_next_task = k_after ? k_after + table[j] * stride : NULL;
        for (int64_t g = 0; g < group; ++g)
            for (int64_t d0 = 0; d0 < dim; d0 += 64) {
                const int ask = g == 0 && d0 == 0; /* the block's first sweep asks ahead */
                __m256 acc[8];
                for (int u = 0; u < 8; ++u) acc[u] = _mm256_loadu_ps(out + g * dim + d0 + u * 8);
                for (int64_t t = 0; t < n; ++t) {
                    if (ask) {
                        prefetch_row(next, t, row_bytes);
                        if (k_next_task) prefetch_row(k_next_task, t, row_bytes);
                    }
                    const __m256 p = _mm256_set1_ps(scores[g * len + first + t]);
                    for (int u = 0; u < 8; u += 2) {
                        __m256 value[2];
                        load16_pair(v + t * row_bytes, d0 + u * 8, is_bf16, value);
                        acc[u] = _mm256_fmadd_ps(p, value[0], acc[u]);
                        acc[u + 1] = _mm256_fmadd_ps(p, value[1], acc[u + 1]);
                    }
                }
                for (int u = 0; u < 8; ++u) _mm256_storeu_ps(out + g * dim + d0 + u * 8, acc[u]);
            }
    }
    if (is_bf16)
        for (int64_t i = 0; i < group * dim; i += 16) put_back16(out + i);
}
#endif

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
/* attend() in vectors (AVX-512 or AVX2) for head dims 64 and 128 (attend_either): the same sums in
 * the same order, so the same bits (tests/kernels/test_paged_decode.py holds the two equal): the
 * scores SCORE_TOKENS tokens at a time, then the softmax, then the values (values_pass). */
INLINE void attend_wide(const float *q, const char *k_head, const char *v_head,
                        const int32_t *table, int64_t len, int64_t group, int64_t dim,
                        int64_t block_size, int64_t stride, int is_bf16, float *scores,
                        float *out, const char *k_after) {
    const int64_t num_blocks = (len + block_size - 1) / block_size;
    const int64_t row_bytes = dim * (is_bf16 ? 2 : 4);
    for (int64_t j = 0; j < num_blocks; ++j) { /* 1. scores */
        const char *k = k_head + table[j] * stride, *v = v_head + table[j] * stride;
        const char *next = next_block(k_head, table, j, num_blocks, stride);
        const int64_t first = j * block_size;
        const int64_t n = tokens_in_block(j, len, block_size);
        for (int64_t t = 0; t < n; t += SCORE_TOKENS)
            score_tokens(q, k + t * row_bytes, n - t < SCORE_TOKENS ? n - t : SCORE_TOKENS, group,
                         dim, is_bf16, next + t * row_bytes, v + t * row_bytes, len,
                         scores + first + t);
    }
    softmax(scores, group, len); /* 2. */
    values_pass(scores, v_head, table, len, group, dim, block_size, stride, is_bf16, out,
                k_after); /* 3. out = sum of probability x value */
}
#endif

/* Whether a sequence's table covers its length and points inside the pool: a bad table (a bug in
 * a student's block manager, say) is refused instead of read out of bounds. */
static int table_fits(const int32_t *table, int64_t len, int64_t block_size, int64_t max_blocks,
                      int64_t num_blocks) {
    const int64_t used = (len + block_size - 1) / block_size;
    if (len < 1 || used > max_blocks) return 0;
    for (int64_t j = 0; j < used; ++j)
        if (table[j] < 0 || table[j] >= num_blocks) return 0;
    return 1;
}

/* attend, or attend_wide where the CPU has AVX-512 or AVX2 and wide asks for it (head dims 64 and
 * 128, the ones the tests hold the two equal at). */
INLINE void attend_either(const float *q, const char *k_head, const char *v_head,
                          const int32_t *table, int64_t len, int64_t group, int64_t dim,
                          int64_t block_size, int64_t stride, int is_bf16, float *scores,
                          float *out, int wide, const char *k_after) {
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
    if (wide && (dim == 64 || dim == 128)) {
        attend_wide(q, k_head, v_head, table, len, group, dim, block_size, stride, is_bf16, scores,
                    out, k_after);
        return;
    }
#endif
    (void)wide;
    (void)k_after;
    attend(q, k_head, v_head, table, len, group, dim, block_size, stride, is_bf16, scores, out);
}

/* One task's three passes, through a copy made for its head dim (64: SmolLM2's and Qwen's; 128:
 * Llama's and most Qwen's) where it has one, so that every loop's length is known. */
static void attend_task(const float *q, const char *k_head, const char *v_head,
                        const int32_t *table, int64_t len, int64_t group, int64_t dim,
                        int64_t block_size, int64_t stride, int is_bf16, float *scores, float *out,
                        int wide, const char *k_after) {
    if (dim == 64 && is_bf16)
        attend_either(q, k_head, v_head, table, len, group, 64, block_size, stride, 1, scores, out,
                      wide, k_after);
    else if (dim == 64)
        attend_either(q, k_head, v_head, table, len, group, 64, block_size, stride, 0, scores, out,
                      wide, k_after);
    else if (dim == 128 && is_bf16)
        attend_either(q, k_head, v_head, table, len, group, 128, block_size, stride, 1, scores, out,
                      wide, k_after);
    else if (dim == 128)
        attend_either(q, k_head, v_head, table, len, group, 128, block_size, stride, 0, scores, out,
                      wide, k_after);
    else
        attend_either(q, k_head, v_head, table, len, group, dim, block_size, stride, is_bf16,
                      scores, out, wide, k_after);
}

/* A decode step's new tokens as the stacked q/k/v projection made them, for the attention tasks to
 * place themselves (decode_layers.c): qkv [num_seqs, heads + 2 * kv_heads, dim], cos and sin
 * [max_positions, dim] (sin's first half negated), each sequence's position and slot. */
typedef struct {
    const void *qkv, *cos, *sin;
    const int64_t *positions, *slot_mapping;
} fresh_t;

/* What rope_write_kv does for one task's share of its sequence's token: the group's query heads
 * turned into q [group, dim] (the tensor's type, as rope_write_kv's q_out holds them), the KV
 * head's key turned and written at the token's slot, its value copied beside it. The task's own
 * attention then reads that key from the cache like every other (no other task reads this
 * sequence's KV head). */
static void place_token(const fresh_t *f, int64_t b, int64_t h, int64_t heads, int64_t kv_heads,
                        int64_t dim, int64_t block_size, void *k_cache, void *v_cache, void *q,
                        int is_bf16, int kv_bf16) {
    const int64_t group = heads / kv_heads, in = b * (heads + 2 * kv_heads) * dim;
    const int64_t angles = f->positions[b] * dim;
    for (int64_t g = 0; g < group; ++g)
        turn_head(f->qkv, in + (h * group + g) * dim, f->cos, f->sin, angles, q, g * dim, dim,
                  is_bf16, is_bf16);
    write_kv_head(f->qkv, in, heads, kv_heads, h, dim, f->cos, f->sin, angles, f->slot_mapping[b],
                  block_size, k_cache, v_cache, is_bf16, kv_bf16);
}

/* How many tasks (a sequence's KV head each) a thread takes at a time. A sequence's KV heads one
 * after the other on one thread: they share each block's pages, so the hardware's prefetch of one
 * head's rows brings in the next head's (docs/benchmarks.md, twenty-second round). With fewer
 * sequences than threads (one on two: the single stream) the heads are shared out instead, or one
 * thread would read them all while the others wait: 0.975-0.994x a single stream's step (fortieth
 * round). */
INLINE int64_t tasks_a_turn(int64_t num_seqs, int64_t num_kv_heads, int num_threads) {
    return num_seqs < num_threads ? 1 : num_kv_heads;
}

/* paged_decode; with fresh (not NULL), each task first places its token (place_token) and q is not
 * read: the rotary and the K/V write done where attention reads them, not in a pass of their own
 * over the step (docs/benchmarks.md, twenty-ninth round). */
static int decode_attention(const void *q, void *k_cache, void *v_cache, void *out,
                            const int32_t *block_tables, const int32_t *seq_lens, int64_t num_seqs,
                            int64_t num_heads, int64_t num_kv_heads, int64_t dim,
                            int64_t num_blocks, int64_t block_size, int64_t max_blocks, float scale,
                            int is_bf16, int kv_bf16, int num_threads, int wide,
                            const fresh_t *fresh) {
    const int64_t group = num_heads / num_kv_heads, elem_size = kv_bf16 ? 2 : 4;
    const int64_t head_bytes = block_size * dim * elem_size, stride = num_kv_heads * head_bytes;
    int failed = 0;
    const int64_t heads_a_turn = tasks_a_turn(num_seqs, num_kv_heads, num_threads);
#pragma omp parallel for schedule(dynamic, heads_a_turn) num_threads(num_threads) \
    reduction(| : failed)
    for (int64_t task = 0; task < num_seqs * num_kv_heads; ++task) {
        const int64_t b = task / num_kv_heads, h = task % num_kv_heads, len = seq_lens[b];
        const int64_t first_head = b * num_heads + h * group; /* this group's first row of q */
        if (!table_fits(block_tables + b * max_blocks, len, block_size, max_blocks, num_blocks)) {
            failed |= 2;
            continue;
        }
        /* q and out, then the scores at a 64-byte boundary */
        const int64_t scores_at = (2 * group * dim + 15) / 16 * 16;
        const int64_t floats = (scores_at + group * len + 15) / 16 * 16;
        float *buffer = aligned_alloc(64, floats * sizeof(float));
        if (buffer == NULL) {
            failed |= 1;
            continue;
        }
        float *qf = buffer, *of = qf + group * dim, *scores = buffer + scores_at;
        if (fresh) /* q into of, which attend() then writes over */
            place_token(fresh, b, h, num_heads, num_kv_heads, dim, block_size, k_cache, v_cache,
                        of, is_bf16, kv_bf16);
        load_floats(fresh ? of : q, fresh ? 0 : first_head * dim, group * dim, is_bf16, qf);
        for (int64_t i = 0; i < group * dim; ++i) qf[i] *= scale;
        const char *k_head = (const char *)k_cache + h * head_bytes;
        const char *v_head = (const char *)v_cache + h * head_bytes;
        const int32_t *table = block_tables + b * max_blocks;
        const char *k_after = /* the task this thread runs next */
            heads_a_turn > 1 && h + 1 < num_kv_heads ? k_head + head_bytes : NULL;
        attend_task(qf, k_head, v_head, table, len, group, dim, block_size, stride, kv_bf16, scores,
                    of, wide, k_after);
        if (is_bf16)
            for (int64_t i = 0; i < group * dim; ++i)
                ((uint16_t *)out)[first_head * dim + i] = to_bf16(of[i]);
        else
            memcpy((float *)out + first_head * dim, of, group * dim * sizeof(float));
        free(buffer);
    }
    return failed;
}

/* is_bf16: q and out bfloat16; kv_bf16: the cache (bfloat16 under a float32 model where the engine
 * was asked for kv_cache_dtype="bfloat16"). wide: attend_wide where it applies (0: the plain loops,
 * which the tests hold it to). Returns 0; or 1 where a buffer could not be allocated, 2 where a
 * block table does not fit (out is then incomplete). */
int paged_decode(const void *q, void *k_cache, void *v_cache, void *out,
                 const int32_t *block_tables, const int32_t *seq_lens, int64_t num_seqs,
                 int64_t num_heads, int64_t num_kv_heads, int64_t dim, int64_t num_blocks,
                 int64_t block_size, int64_t max_blocks, float scale, int is_bf16, int kv_bf16,
                 int num_threads, int wide) {
    return decode_attention(q, k_cache, v_cache, out, block_tables, seq_lens, num_seqs, num_heads,
                            num_kv_heads, dim, num_blocks, block_size, max_blocks, scale, is_bf16,
                            kv_bf16, num_threads, wide, NULL);
}

/* One KV head's rows of a sequence, in the order attend reads them: its keys block by block, asking
 * for the next block's rows and this block's values as it goes (pass 1), then its values, asking
 * for the next block's (pass 3). Each row is folded into `seen` instead of attended to. */
INLINE uint64_t read_task(const char *k_head, const char *v_head, const int32_t *table,
                          int64_t len, int64_t block_size, int64_t stride, int64_t row_bytes) {
    const int64_t num_blocks = (len + block_size - 1) / block_size, words = row_bytes / 8;
    uint64_t seen = 0;
    for (int pass = 0; pass < 2; ++pass) {
        const char *head = pass ? v_head : k_head;
        for (int64_t j = 0; j < num_blocks; ++j) {
            const char *rows = head + table[j] * stride, *values = v_head + table[j] * stride;
            const char *next = next_block(head, table, j, num_blocks, stride);
            const int64_t n = tokens_in_block(j, len, block_size);
            for (int64_t t = 0; t < n; ++t) {
                prefetch_row(next, t, row_bytes);
                if (!pass) prefetch_row(values, t, row_bytes);
                const uint64_t *row = (const uint64_t *)(rows + t * row_bytes);
#pragma omp simd reduction(^ : seen)
                for (int64_t i = 0; i < words; ++i) seen ^= row[i];
            }
        }
    }
    return seen;
}

/* Attention's reads alone, for the bench's bound on a decode step (tracer/bench/kv_reads.py): every
 * task of decode_attention (a sequence's KV head) reads its K and V rows as attend does, in the
 * same tasks handed out the same way, with nothing computed. Returns the XOR of every 8 bytes read
 * (so that no read can be left out, and a test can check which were). Tables are not checked. */
uint64_t read_pages(const void *k_cache, const void *v_cache, const int32_t *block_tables,
                    const int32_t *seq_lens, int64_t num_seqs, int64_t num_kv_heads, int64_t dim,
                    int64_t block_size, int64_t max_blocks, int kv_bf16, int num_threads) {
    const int64_t row_bytes = dim * (kv_bf16 ? 2 : 4), head_bytes = block_size * row_bytes;
    const int64_t stride = num_kv_heads * head_bytes;
    const int64_t heads_a_turn = tasks_a_turn(num_seqs, num_kv_heads, num_threads);
    uint64_t seen = 0;
#pragma omp parallel for schedule(dynamic, heads_a_turn) num_threads(num_threads) \
    reduction(^ : seen)
    for (int64_t task = 0; task < num_seqs * num_kv_heads; ++task) {
        const int64_t b = task / num_kv_heads, h = task % num_kv_heads;
        seen ^= read_task((const char *)k_cache + h * head_bytes,
                          (const char *)v_cache + h * head_bytes, block_tables + b * max_blocks,
                          seq_lens[b], block_size, stride, row_bytes);
    }
    return seen;
}
