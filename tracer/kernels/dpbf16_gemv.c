/* A bfloat16 linear layer for a few rows on CPUs with AVX512_BF16 but no AMX (AMD's Zen 4 and 5,
 * Intel's Cooper Lake), reading the weight oneDNN has packed (nanoengine/loading/build.py:
 * pack_for_onednn) in place: amx_gemv.c's counterpart there, packed_gemv.c's tiling.
 *
 * The packed layout oneDNN picks on these CPUs: blocks of 64 outputs, one after the other; inside a
 * block, inputs in pairs, each pair's 64 outputs side by side, the pair's two weights together:
 * w[o, i] at (o / 64) * in * 64 + (i / 2) * 128 + (o % 64) * 2 + i % 2. One 64-byte vector holds a
 * pair of inputs for 16 outputs: what VDPBF16PS multiplies by a row's pair of inputs and adds to 16
 * float32 sums.
 *
 * Each output is summed as oneDNN sums it there: pair by pair in order, one VDPBF16PS per pair,
 * in chunks of `chunk` inputs whose sums start from zero and are added in order; then the bias,
 * then one rounding to bfloat16. The caller (packed_linear.py) checks that for each shape and row
 * count at its first use (and finds the chunk: 512 inputs at 576, 1024 at 1536, on a Zen 5), and
 * keeps oneDNN where the bits differ. Built at first use by tracer/kernels/build.py; where the
 * compiler or the CPU lacks AVX512_BF16, dpbf16_gemv_ready says no and the engine keeps oneDNN. */
#include <stdint.h>

#include "floats.h"

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>

#include "constant_vecs.h"
#include "shares.h"

enum { DP_BLOCK = 64, DP_FLOATS = 16, DP_PARTS = DP_BLOCK / DP_FLOATS, DP_TILE_ROWS = 7 };
enum {
    DP_SLAB = 64,              /* rows a block's partial sums are kept for at a time */
    DP_STRETCH = 32,           /* pairs a tile goes through before the next tile's rows take over */
    DP_AHEAD = 4 * DP_STRETCH, /* how far ahead (in pairs) the weights are fetched */
};

int dpbf16_gemv_ready(void) { return 1; }

/* packed_gemv.c's ahead_t, in pairs of inputs. Kept typed in each kernel: one byte-addressed
 * struct shared by both measured 1.8-2.3 % slower decode steps at >= 16 rows (docs/benchmarks.md,
 * twenty-eighth round). */
typedef struct {
    const uint16_t *near, *far; /* pair p's line is near + p * 2 * DP_BLOCK, or far + ... */
    int64_t edge;
} dp_ahead_t;

INLINE dp_ahead_t dp_ahead_of(const uint16_t *block, const uint16_t *next, int64_t in,
                              int64_t first) {
    next = next ? next : block + in * DP_BLOCK;
    return (dp_ahead_t){block + 2 * first + DP_AHEAD * 2 * DP_BLOCK,
                        next + 2 * first + (DP_AHEAD - in / 2) * 2 * DP_BLOCK, in / 2 - DP_AHEAD};
}

INLINE const uint16_t *dp_line_ahead(dp_ahead_t a, int64_t p) {
    return (p < a.edge ? a.near : a.far) + p * 2 * DP_BLOCK;
}

/* part[r][o] (+)= the sums of pairs [start, end) for `rows` rows and `vecs` vectors of a block's
 * outputs (constants in each inlined copy; w and part start at the first of them). */
INLINE void dp_tile(const uint16_t *x, int64_t in, const uint16_t *w, dp_ahead_t ahead,
                    float (*part)[DP_BLOCK], int64_t start, int64_t end, int first, int tile,
                    int tiles, const int rows, const int vecs) {
    __m512 sum[DP_TILE_ROWS][DP_PARTS];
    for (int r = 0; r < rows; ++r)
        for (int v = 0; v < vecs; ++v)
            sum[r][v] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(&part[r][v * DP_FLOATS]);
    for (int64_t p = start; p < end; ++p) {
        for (int line = tile; line < vecs; line += tiles) /* into L2 */
            __builtin_prefetch(dp_line_ahead(ahead, p) + line * 2 * DP_FLOATS, 0, 2);
        __m512bh wp[DP_PARTS];
        for (int v = 0; v < vecs; ++v)
            wp[v] = (__m512bh)_mm512_loadu_si512(w + p * 2 * DP_BLOCK + v * 2 * DP_FLOATS);
        for (int r = 0; r < rows; ++r) { /* the row's pair of inputs, in every lane */
            int32_t pair;
            __builtin_memcpy(&pair, x + r * in + 2 * p, sizeof pair);
            const __m512bh xp = (__m512bh)_mm512_set1_epi32(pair);
            for (int v = 0; v < vecs; ++v) sum[r][v] = _mm512_dpbf16_ps(sum[r][v], xp, wp[v]);
        }
    }
    for (int r = 0; r < rows; ++r)
        for (int v = 0; v < vecs; ++v) _mm512_storeu_ps(&part[r][v * DP_FLOATS], sum[r][v]);
}

#define DP_TILE(rows) \
    WITH_CONSTANT_VECS(vecs, dp_tile, x, in, w, ahead, part, start, end, first, tile, tiles, rows)

static void dp_tile_rows(const uint16_t *x, int64_t in, const uint16_t *w, dp_ahead_t ahead,
                         float (*part)[DP_BLOCK], int64_t start, int64_t end, int first, int tile,
                         int tiles, int64_t rows, int64_t vecs) {
    switch (rows) {
    case 1: DP_TILE(1); break;
    case 2: DP_TILE(2); break;
    case 3: DP_TILE(3); break;
    case 4: DP_TILE(4); break;
    case 5: DP_TILE(5); break;
    case 6: DP_TILE(6); break;
    case 7: DP_TILE(7); break;
    }
}
#undef DP_TILE

/* A few rows through `streams` blocks side by side, each block's outputs [first, last) straight
 * through the pairs, as packed_gemv.c's few_rows: the same sums as the tiles', so the same bits. */
typedef struct {
    const uint16_t *w, *bias; /* from the block's first output on; bias NULL for none */
    dp_ahead_t ahead;
    uint16_t *y; /* row r's outputs at y + r * the row stride */
} dp_stream_t;

INLINE void dp_few_rows(const uint16_t *x, const dp_stream_t *s, int64_t in, int64_t chunk,
                        int64_t stride, int64_t width, const int rows, const int streams,
                        const int vecs) {
    __m512 sum[STREAMS][FEW_ROWS][DP_PARTS], part[STREAMS][FEW_ROWS][DP_PARTS];
    const int64_t pairs = in / 2, chunk_pairs = chunk / 2;
    for (int64_t start = 0; start < pairs; start += chunk_pairs) {
        const int64_t end = start + chunk_pairs < pairs ? start + chunk_pairs : pairs;
        for (int k = 0; k < streams; ++k)
            for (int r = 0; r < rows; ++r)
                for (int v = 0; v < vecs; ++v) part[k][r][v] = _mm512_setzero_ps();
        for (int64_t p = start; p < end; ++p) {
            for (int k = 0; k < streams; ++k)
                for (int v = 0; v < vecs; ++v) /* into L2 */
                    __builtin_prefetch(dp_line_ahead(s[k].ahead, p) + v * 2 * DP_FLOATS, 0, 2);
            for (int k = 0; k < streams; ++k) {
                __m512bh wp[DP_PARTS];
                for (int v = 0; v < vecs; ++v)
                    wp[v] = (__m512bh)_mm512_loadu_si512(s[k].w + p * 2 * DP_BLOCK +
                                                         v * 2 * DP_FLOATS);
                for (int r = 0; r < rows; ++r) { /* the row's pair of inputs, in every lane */
                    int32_t pair;
                    __builtin_memcpy(&pair, x + r * in + 2 * p, sizeof pair);
                    const __m512bh xp = (__m512bh)_mm512_set1_epi32(pair);
                    for (int v = 0; v < vecs; ++v)
                        part[k][r][v] = _mm512_dpbf16_ps(part[k][r][v], xp, wp[v]);
                }
            }
        }
        for (int k = 0; k < streams; ++k)
            for (int r = 0; r < rows; ++r)
                for (int v = 0; v < vecs; ++v)
                    sum[k][r][v] = start ? _mm512_add_ps(sum[k][r][v], part[k][r][v])
                                         : part[k][r][v];
    }
    for (int k = 0; k < streams; ++k)
        for (int r = 0; r < rows; ++r) {
            float sums[DP_BLOCK];
            for (int v = 0; v < vecs; ++v) _mm512_storeu_ps(sums + v * DP_FLOATS, sum[k][r][v]);
            uint16_t *y = s[k].y + r * stride;
            for (int64_t o = 0; o < width; ++o)
                y[o] = to_bf16(s[k].bias ? sums[o] + from_bf16(s[k].bias[o]) : sums[o]);
        }
}

/* A few rows through n whole blocks side by side, as packed_gemv.c's few_rows_blocks. */
static void dp_few_rows_blocks(const uint16_t *x, const uint16_t *weight, const uint16_t *bias,
                               const int64_t *blocks, uint16_t *const *y, int n, int64_t rows,
                               int64_t in, int64_t chunk, int64_t stride) {
    dp_stream_t s[STREAMS];
    for (int k = 0; k < n; ++k) {
        const uint16_t *w = weight + blocks[k] * in * DP_BLOCK;
        s[k] = (dp_stream_t){w, bias ? bias + blocks[k] * DP_BLOCK : 0, dp_ahead_of(w, 0, in, 0),
                             y[k]};
    }
    WITH_CONSTANT_ROWS_AND_STREAMS(rows, n, DP_PARTS, dp_few_rows, x, s, in, chunk, stride,
                                   DP_BLOCK);
}

/* A few rows through whole blocks [b0, b1) in runs side by side, as packed_gemv.c's
 * few_rows_runs; y [rows, out]. */
static void dp_few_rows_runs(const uint16_t *x, const uint16_t *weight, const uint16_t *bias,
                             uint16_t *y, int64_t rows, int64_t b0, int64_t b1, int64_t in,
                             int64_t out, int64_t chunk) {
    const int64_t runs = STREAMS_FOR(rows), per = (b1 - b0 + runs - 1) / runs;
    for (int64_t j = 0; j < per; ++j) {
        int64_t blocks[STREAMS];
        uint16_t *ys[STREAMS];
        const int n = side_by_side(b0, b1, per, j, blocks);
        for (int k = 0; k < n; ++k) ys[k] = y + blocks[k] * DP_BLOCK;
        dp_few_rows_blocks(x, weight, bias, blocks, ys, n, rows, in, chunk, out);
    }
}

/* Outputs [first, last) of one block for up to DP_SLAB rows, as packed_gemv.c's block_outputs:
 * each chunk a stretch at a time, each stretch through all the rows' tiles; one row straight
 * through (dp_few_rows). */
static void dp_block_outputs(const uint16_t *x, const uint16_t *block, const uint16_t *next,
                             const uint16_t *bias, uint16_t *y, int64_t rows, int64_t in,
                             int64_t chunk, int64_t out, int64_t first, int64_t last) {
    const int64_t vecs = (last - first + DP_FLOATS - 1) / DP_FLOATS;
    const dp_ahead_t ahead = dp_ahead_of(block, next, in, first);
    if (rows == 1) {
        const dp_stream_t s = {block + 2 * first, bias ? bias + first : 0, ahead, y + first};
        WITH_CONSTANT_VECS(vecs, dp_few_rows, x, &s, in, chunk, out, last - first, 1, 1);
        return;
    }
    float sum[DP_SLAB][DP_BLOCK], part[DP_SLAB][DP_BLOCK];
    const int64_t tiles = (rows + DP_TILE_ROWS - 1) / DP_TILE_ROWS;
    const int64_t pairs = in / 2, chunk_pairs = chunk / 2;
    for (int64_t start = 0; start < pairs; start += chunk_pairs) {
        const int64_t end = start + chunk_pairs < pairs ? start + chunk_pairs : pairs;
        for (int64_t s = start; s < end; s += DP_STRETCH) {
            const int64_t e = s + DP_STRETCH < end ? s + DP_STRETCH : end;
            for (int64_t t = 0; t < tiles; ++t) { /* the rows shared out evenly among the tiles */
                const int64_t r0 = t * rows / tiles, r1 = (t + 1) * rows / tiles;
                dp_tile_rows(x + r0 * in, in, block + 2 * first, ahead,
                             (float(*)[DP_BLOCK])(part[r0] + first), s, e, s == start, (int)t,
                             (int)tiles, r1 - r0, vecs);
            }
        }
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t o = first; o < last; ++o)
                sum[r][o] = start ? sum[r][o] + part[r][o] : part[r][o];
    }
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = first; o < last; ++o)
            y[r * out + o] = to_bf16(bias ? sum[r][o] + from_bf16(bias[o]) : sum[r][o]);
}

/* y [rows, out] = x [rows, in] times the packed weight, plus bias (NULL for none); bfloat16, `in`
 * and `chunk` even. The outputs are shared among the threads as shares.h says; up to FEW_ROWS
 * rows read the blocks a thread holds whole several at a time, as packed_gemv does. */
void dpbf16_gemv(const uint16_t *x, const uint16_t *weight, const uint16_t *bias, uint16_t *y,
                 int64_t rows, int64_t in, int64_t out, int64_t chunk, int threads) {
#pragma omp parallel num_threads(threads)
    {
        const share_t share = thread_share((out + DP_BLOCK - 1) / DP_BLOCK, DP_PARTS);
        int64_t b0 = 0, b1 = 0; /* the blocks read side by side */
        if (rows <= FEW_ROWS) {
            whole_blocks(share, DP_PARTS, out / DP_BLOCK, &b0, &b1);
            dp_few_rows_runs(x, weight, bias, y, rows, b0, b1, in, out, chunk);
        }
        for (int64_t b = share.begin / DP_PARTS; b * DP_PARTS < share.end; ++b) {
            if (b >= b0 && b < b1) continue; /* read above */
            int64_t first, last;
            const int64_t width = out - b * DP_BLOCK < DP_BLOCK ? out - b * DP_BLOCK : DP_BLOCK;
            outputs_in_share(share, b, DP_PARTS, DP_FLOATS, width, &first, &last);
            for (int64_t r = 0; first < last && r < rows; r += DP_SLAB)
                dp_block_outputs(x + r * in, weight + b * in * DP_BLOCK, 0,
                                 bias ? bias + b * DP_BLOCK : 0, y + r * out + b * DP_BLOCK,
                                 rows - r < DP_SLAB ? rows - r : DP_SLAB, in, chunk, out, first,
                                 last);
        }
    }
}
#else
int dpbf16_gemv_ready(void) { return 0; }

void dpbf16_gemv(const uint16_t *x, const uint16_t *weight, const uint16_t *bias, uint16_t *y,
                 int64_t rows, int64_t in, int64_t out, int64_t chunk, int threads) {
    (void)x, (void)weight, (void)bias, (void)y, (void)rows, (void)in, (void)out, (void)chunk;
    (void)threads;
}
#endif
