/* A linear layer for a few rows (a decode step of one to a few dozen sequences), reading the
 * weight oneDNN has packed (nanoengine/loading/build.py: pack_for_onednn) in place.
 *
 * At one row a linear is a matrix-vector product: every weight is read once and used once, so its
 * time is the time to read the weights. oneDNN's kernel reads them at two thirds of the rate this
 * loop does (docs/benchmarks.md, thirteenth round). At 8-32 rows each weight serves every row, and
 * what counts is doing the multiply-adds while the next weights arrive from memory (fifteenth
 * round, AVX-512): the rows go through a block's weights a few at a time, in tiles that fit the
 * registers, and the weights a few tiles ahead are fetched into the L2 cache meanwhile. With AVX2
 * alone, the same in tiles of 16-register size (thirty-fourth round).
 *
 * The packed layout, float32: blocks of 64 outputs, one after the other; inside a block, input i's
 * 64 weights side by side: w[o, i] at (o / 64) * in_padded * 64 + i * 64 + o % 64, where in_padded
 * is `in` rounded up (to a multiple of 16 on the CPUs seen) and the padding is zeros. Each output
 * is summed as oneDNN sums it: over i in order, one fused multiply-add per term, in chunks of
 * `chunk` inputs whose sums start from zero and are added in order; then the bias. So the result
 * has oneDNN's bits: the caller (packed_linear.py) checks that for each shape and row count at its
 * first use, and keeps oneDNN where not. A partial sum parked in memory between tiles keeps its
 * bits, so the tiling does not change them. Built at first use by tracer/kernels/build.py. */
#include <stdint.h>

#include "constant_vecs.h"
#include "floats.h"
#include "shares.h"
#ifdef __AVX512F__
#include <immintrin.h>
#endif

/* gcc's default for Intel's AVX-512 CPUs is 256-bit vectors (fourteenth round). */
#pragma GCC push_options
#pragma GCC target("prefer-vector-width=512")

enum { BLOCK = 64 }; /* outputs per block of the packed layout */
enum {
    STRETCH = 64,        /* inputs a tile goes through before the next tile's rows take over */
    AHEAD = 4 * STRETCH, /* how far ahead (in inputs) AVX-512's tiles and rows ask for weights */
};

/* Where the weights `distance` inputs after input i lie: in this block before input `edge`, from
 * there in the block this thread goes through next, which need not follow it in memory
 * (decode_layers.c: gate_up_silu goes from a block of gate's outputs to the same block of up's). */
typedef struct {
    const float *near, *far; /* input i's line is near + i * BLOCK, or far + i * BLOCK */
    int64_t edge;
} ahead_t;

/* block (its outputs from the first) is followed by next (NULL: the block after it in memory) */
INLINE ahead_t ahead_of(const float *block, const float *next, int64_t in_padded, int64_t first,
                        int64_t distance) {
    next = next ? next : block + in_padded * BLOCK;
    return (ahead_t){block + first + distance * BLOCK,
                     next + first + (distance - in_padded) * BLOCK, in_padded - distance};
}

INLINE const float *line_ahead(ahead_t a, int64_t i) {
    return (i < a.edge ? a.near : a.far) + i * BLOCK;
}

#ifdef __AVX512F__ /* a tile: TILE_ROWS rows x 4 vectors of sums, and 4 of weights: 32 registers */
typedef __m512 fvec;
enum { FLOATS = 16, TILE_ROWS = 7, PARTS = BLOCK / FLOATS };
#define FMA _mm512_fmadd_ps
#define SET1 _mm512_set1_ps
#define LOAD _mm512_loadu_ps
#define STORE _mm512_storeu_ps
#define ZERO _mm512_setzero_ps

enum { SLAB = 64 }; /* rows a block's partial sums are kept for at a time */

/* part[r][o] (+)= sum over i in [start, end) of x[r, i] * w[o, i], for `rows` rows and `vecs`
 * vectors of a block's outputs (constants in each inlined copy; w and part start at the first of
 * them); `first` starts the sums from zero. Tile number `tile` of `tiles` asks for every tiles-th of
 * the lines a few stretches ahead: they share that. */
INLINE void run_tile(const float *x, int64_t in, const float *w, ahead_t ahead,
                     float (*part)[BLOCK], int64_t start, int64_t end, int first, int tile,
                     int tiles, const int rows, const int vecs) {
    fvec sum[TILE_ROWS][4];
    for (int r = 0; r < rows; ++r)
        for (int v = 0; v < vecs; ++v) sum[r][v] = first ? ZERO() : LOAD(&part[r][v * FLOATS]);
    for (int64_t i = start; i < end; ++i) {
        for (int line = tile; line < vecs; line += tiles)
            __builtin_prefetch(line_ahead(ahead, i) + line * 16, 0, 2); /* into L2 */
        fvec wi[4];
        for (int v = 0; v < vecs; ++v) wi[v] = LOAD(w + i * BLOCK + v * FLOATS);
        for (int r = 0; r < rows; ++r) {
            const fvec xi = SET1(x[r * in + i]);
            for (int v = 0; v < vecs; ++v) sum[r][v] = FMA(xi, wi[v], sum[r][v]);
        }
    }
    for (int r = 0; r < rows; ++r)
        for (int v = 0; v < vecs; ++v) STORE(&part[r][v * FLOATS], sum[r][v]);
}

#define TILE(rows) \
    WITH_CONSTANT_VECS(vecs, run_tile, x, in, w, ahead, part, start, end, first, tile, tiles, rows)

static void tile_rows(const float *x, int64_t in, const float *w, ahead_t ahead,
                      float (*part)[BLOCK], int64_t start, int64_t end, int first, int tile,
                      int tiles, int64_t rows, int64_t vecs) {
    switch (rows) {
    case 1: TILE(1); break;
    case 2: TILE(2); break;
    case 3: TILE(3); break;
    case 4: TILE(4); break;
    case 5: TILE(5); break;
    case 6: TILE(6); break;
    case 7: TILE(7); break;
    }
}
#undef TILE

/* A few rows (1 to FEW_ROWS) through `streams` blocks side by side, each block's outputs [first,
 * last) summed straight through the inputs (rows, streams and vecs constants in each inlined copy),
 * the weights asked for as far ahead as the tiles ask. At one row each weight is used once, so
 * there is nothing for the tiles to keep in the cache, and their stretches only slowed the reading
 * (the model's linears at one row read 40.3 against 34.8 GB/s on the Zen 4 host of
 * docs/benchmarks.md, twenty-sixth round); up to FEW_ROWS rows the multiply-adds still wait for
 * memory. Several blocks at once because a core reading one run of memory did not keep it busy:
 * on that host one run a core read ~30 GB/s, and a step's linears at one row read 1.1-1.3x as fast
 * four runs at a time (thirty-first round). The same sums as the tiles': the same bits. */
typedef struct {
    const float *w, *bias; /* from the block's first output on; bias NULL for none */
    ahead_t ahead;
    float *y; /* row r's outputs at y + r * the row stride */
} stream_t;

INLINE void few_rows(const float *x, const stream_t *s, int64_t in, int64_t chunk, int64_t stride,
                     int64_t width, const int rows, const int streams, const int vecs) {
    fvec sum[STREAMS][FEW_ROWS][PARTS], part[STREAMS][FEW_ROWS][PARTS];
    for (int64_t start = 0; start < in; start += chunk) {
        const int64_t end = start + chunk < in ? start + chunk : in;
        for (int k = 0; k < streams; ++k)
            for (int r = 0; r < rows; ++r)
                for (int v = 0; v < vecs; ++v) part[k][r][v] = ZERO();
        for (int64_t i = start; i < end; ++i) {
            for (int k = 0; k < streams; ++k)
                for (int v = 0; v < vecs; ++v) /* into L2 */
                    __builtin_prefetch(line_ahead(s[k].ahead, i) + v * FLOATS, 0, 2);
            for (int k = 0; k < streams; ++k) {
                fvec wi[PARTS];
                for (int v = 0; v < vecs; ++v) wi[v] = LOAD(s[k].w + i * BLOCK + v * FLOATS);
                for (int r = 0; r < rows; ++r) {
                    const fvec xi = SET1(x[r * in + i]);
                    for (int v = 0; v < vecs; ++v) part[k][r][v] = FMA(xi, wi[v], part[k][r][v]);
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
        for (int r = 0; r < rows; ++r)
            for (int v = 0; v < vecs; ++v) { /* the last vector may hold fewer than FLOATS */
                const int64_t n = width - v * FLOATS < FLOATS ? width - v * FLOATS : FLOATS;
                const __mmask16 keep = (__mmask16)((1u << n) - 1);
                fvec y = sum[k][r][v];
                if (s[k].bias)
                    y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(keep, s[k].bias + v * FLOATS));
                _mm512_mask_storeu_ps(s[k].y + r * stride + v * FLOATS, keep, y);
            }
}

/* `rows` rows through n whole blocks of a weight side by side (n <= STREAMS_FOR(rows)): the block
 * ids in blocks, block k's 64 outputs of row r to y[k] + r * stride. */
static void few_rows_blocks(const float *x, const float *weight, const float *bias,
                            const int64_t *blocks, float *const *y, int n, int64_t rows,
                            int64_t in, int64_t in_padded, int64_t chunk, int64_t stride) {
    stream_t s[STREAMS];
    for (int k = 0; k < n; ++k) {
        const float *w = weight + blocks[k] * in_padded * BLOCK;
        s[k] = (stream_t){w, bias ? bias + blocks[k] * BLOCK : 0,
                          ahead_of(w, 0, in_padded, 0, AHEAD), y[k]};
    }
    WITH_CONSTANT_ROWS_AND_STREAMS(rows, n, PARTS, few_rows, x, s, in, chunk, stride, BLOCK);
}

/* `rows` rows through whole blocks [b0, b1) in STREAMS_FOR(rows) runs read side by side; y [rows,
 * out]. */
static void few_rows_runs(const float *x, const float *weight, const float *bias, float *y,
                          int64_t rows, int64_t b0, int64_t b1, int64_t in, int64_t in_padded,
                          int64_t out, int64_t chunk) {
    const int64_t runs = STREAMS_FOR(rows), per = (b1 - b0 + runs - 1) / runs; /* blocks a run */
    for (int64_t j = 0; j < per; ++j) {
        int64_t blocks[STREAMS];
        float *ys[STREAMS];
        const int n = side_by_side(b0, b1, per, j, blocks);
        for (int k = 0; k < n; ++k) ys[k] = y + blocks[k] * BLOCK;
        few_rows_blocks(x, weight, bias, blocks, ys, n, rows, in, in_padded, chunk, out);
    }
}

/* Outputs [first, last) of one block for up to SLAB rows (first and last multiples of FLOATS, or
 * last the block's width): each chunk of inputs a stretch at a time, and each stretch through all
 * the rows' tiles while its weights are in the cache; one row straight through (few_rows). */
static void block_outputs(const float *x, const float *block, const float *next,
                          const float *bias, float *y, int64_t rows, int64_t in, int64_t in_padded,
                          int64_t chunk, int64_t out, int64_t first, int64_t last) {
    const int64_t vecs = (last - first + FLOATS - 1) / FLOATS;
    const ahead_t ahead = ahead_of(block, next, in_padded, first, AHEAD);
    if (rows == 1) {
        const stream_t s = {block + first, bias ? bias + first : 0, ahead, y + first};
        WITH_CONSTANT_VECS(vecs, few_rows, x, &s, in, chunk, out, last - first, 1, 1);
        return;
    }
    float sum[SLAB][BLOCK], part[SLAB][BLOCK];
    const int64_t tiles = (rows + TILE_ROWS - 1) / TILE_ROWS;
    for (int64_t start = 0; start < in; start += chunk) {
        const int64_t end = start + chunk < in ? start + chunk : in;
        float(*into)[BLOCK] = start ? part : sum; /* the first chunk's sums straight into sum */
        for (int64_t s = start; s < end; s += STRETCH) {
            const int64_t e = s + STRETCH < end ? s + STRETCH : end;
            for (int64_t t = 0; t < tiles; ++t) { /* the rows shared out evenly among the tiles */
                const int64_t r0 = t * rows / tiles, r1 = (t + 1) * rows / tiles;
                tile_rows(x + r0 * in, in, block + first, ahead,
                          (float(*)[BLOCK])(into[r0] + first), s, e, s == start, (int)t,
                          (int)tiles, r1 - r0, vecs);
            }
        }
        for (int64_t r = 0; start && r < rows; ++r)
            for (int64_t o = first; o < last; ++o) sum[r][o] += part[r][o];
    }
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = first; o < last; ++o) y[r * out + o] = bias ? sum[r][o] + bias[o] : sum[r][o];
}

#else /* AVX2 and others: a block's outputs shared among the threads by quarters */
enum { SLAB = 64, PARTS = 4 }; /* rows a block's partial sums are kept for at a time */
enum { FEW = 4, FEW_AHEAD = STRETCH }; /* rows the straight loop takes at once; how far ahead
                                          (inputs) it asks for the weights */

/* Outputs [0, width) of `blocks` blocks side by side (block k's weights, bias and y from w[k],
 * bias[k] (NULL: none) and y[k], each from its first output on; width, rows and blocks constants
 * in each inlined copy, so gcc unrolls every loop; n <= width stored): the thirteenth
 * round's loop, which gcc vectorizes, each block's weights read once for all the rows and asked
 * into L2 FEW_AHEAD inputs ahead. A block at a time and unasked, the model's linears from memory
 * at 2-4 rows took 1.1-1.2x as long on a Zen 3, whose core had too few lines in flight (forty-third
 * round). */
INLINE void rows_outputs(const float *x, const float *const *w, const float *const *bias,
                         float *const *y, int64_t in, int64_t chunk, int64_t out, int64_t n,
                         const int width, const int rows, const int blocks) {
    float sum[2][FEW][BLOCK];
    for (int64_t start = 0; start < in; start += chunk) {
        const int64_t end = start + chunk < in ? start + chunk : in;
        float part[2][FEW][BLOCK] = {{{0}}};
        for (int64_t i = start; i < end; ++i)
            for (int k = 0; k < blocks; ++k) {
                for (int o = 0; o < width; o += 16) /* into L2 */
                    __builtin_prefetch(w[k] + (i + FEW_AHEAD) * BLOCK + o, 0, 2);
                for (int r = 0; r < rows; ++r) {
                    const float xi = x[r * in + i];
#pragma omp simd
                    for (int o = 0; o < width; ++o)
                        part[k][r][o] = __builtin_fmaf(xi, w[k][i * BLOCK + o], part[k][r][o]);
                }
            }
        for (int k = 0; k < blocks; ++k)
            for (int r = 0; r < rows; ++r)
#pragma omp simd
                for (int o = 0; o < width; ++o)
                    sum[k][r][o] = start ? sum[k][r][o] + part[k][r][o] : part[k][r][o];
    }
    for (int k = 0; k < blocks; ++k)
        for (int r = 0; r < rows; ++r)
            for (int64_t o = 0; o < n; ++o)
                y[k][r * out + o] = bias[k] ? sum[k][r][o] + bias[k][o] : sum[k][r][o];
}

#define ROWS_OUTPUTS(width)                                                                       \
    switch (rows) {                                                                               \
    case 1: rows_outputs(x, w, b, ys, in, chunk, out, n, width, 1, 1); break;                     \
    case 2: rows_outputs(x, w, b, ys, in, chunk, out, n, width, 2, 1); break;                     \
    case 3: rows_outputs(x, w, b, ys, in, chunk, out, n, width, 3, 1); break;                     \
    default: rows_outputs(x, w, b, ys, in, chunk, out, n, width, 4, 1); break;                    \
    }

/* Up to FEW rows of outputs [first, first + n) of a block, n <= 64 (all pointers from the block's
 * first output on). */
static void few_outputs(const float *x, const float *block, const float *bias, float *y,
                        int64_t rows, int64_t in, int64_t chunk, int64_t out, int64_t n) {
    const float *const w[1] = {block}, *const b[1] = {bias};
    float *const ys[1] = {y};
    switch ((n + 15) / 16) {
    case 1: ROWS_OUTPUTS(16); break;
    case 2: ROWS_OUTPUTS(32); break;
    case 3: ROWS_OUTPUTS(48); break;
    default: ROWS_OUTPUTS(64); break;
    }
}
#undef ROWS_OUTPUTS

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
/* More than FEW rows go through a block in tiles of up to TILE_ROWS rows x 16 outputs: 12 sums,
 * 2 vectors of weights and one of x fill 15 of the 16 registers. Each stretch of inputs goes
 * through every 16 outputs' tiles while its weights are in L1, and the next stretch's weights are
 * asked into L2 meanwhile, evenly over all the stretch's tiles: asked for all in its first tile,
 * they stalled the core while its few miss buffers were full, and the decoder's linears from memory
 * took 1.33-1.39x as long at 16-32 rows (docs/benchmarks.md, thirty-fifth round). Asked AHEAD
 * inputs on, as AVX-512's tiles ask, they took 1.01-1.05x as long at 8-28 rows on a Zen 3, half a
 * stretch on 1.2-1.3x (forty-third round). */
enum { TILE_ROWS = 6, TILE_AHEAD = STRETCH };

/* part[r][0..16 * groups) (+)= sum over i in [start, end) of x[r, i] * w[o, i] for `rows` rows (a
 * constant in each inlined copy), 16 outputs at a time; w and part start at the first output;
 * `first` starts the sums from zero. Meanwhile the `lines` cache lines from `ask` on are asked for,
 * spread evenly over the call's steps. All the groups of 16 in one call: one call for each sixteen
 * took 1.02-1.09x oneDNN's time at 16-32 rows, this one 0.99-1.01x (thirty-fourth round). */
INLINE void run_tile(const float *x, int64_t in, const float *w, float (*part)[BLOCK],
                     int64_t start, int64_t end, int first, const float *ask, int64_t lines,
                     int64_t groups, const int rows) {
    const int64_t steps = groups * (end - start);
    int64_t owed = 0; /* the lines due so far, times steps: one is asked each time one is due */
    for (int64_t g = 0; g < groups; ++g, w += 16, part = (float(*)[BLOCK])(&part[0][16])) {
        __m256 sum[TILE_ROWS][2];
        for (int r = 0; r < rows; ++r)
            for (int v = 0; v < 2; ++v)
                sum[r][v] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(&part[r][v * 8]);
        for (int64_t i = start; i < end; ++i) {
            for (owed += lines; owed >= steps; owed -= steps, ask += 16)
                __builtin_prefetch(ask, 0, 2); /* into L2 */
            const __m256 w0 = _mm256_loadu_ps(w + i * BLOCK);
            const __m256 w1 = _mm256_loadu_ps(w + i * BLOCK + 8);
            for (int r = 0; r < rows; ++r) {
                const __m256 xi = _mm256_broadcast_ss(x + r * in + i);
                sum[r][0] = _mm256_fmadd_ps(xi, w0, sum[r][0]);
                sum[r][1] = _mm256_fmadd_ps(xi, w1, sum[r][1]);
            }
        }
        for (int r = 0; r < rows; ++r)
            for (int v = 0; v < 2; ++v) _mm256_storeu_ps(&part[r][v * 8], sum[r][v]);
    }
}

static void tile_rows(const float *x, int64_t in, const float *w, float (*part)[BLOCK],
                      int64_t start, int64_t end, int first, const float *ask, int64_t lines,
                      int64_t groups, int64_t rows) {
    switch (rows) {
    case 1: run_tile(x, in, w, part, start, end, first, ask, lines, groups, 1); break;
    case 2: run_tile(x, in, w, part, start, end, first, ask, lines, groups, 2); break;
    case 3: run_tile(x, in, w, part, start, end, first, ask, lines, groups, 3); break;
    case 4: run_tile(x, in, w, part, start, end, first, ask, lines, groups, 4); break;
    case 5: run_tile(x, in, w, part, start, end, first, ask, lines, groups, 5); break;
    case 6: run_tile(x, in, w, part, start, end, first, ask, lines, groups, 6); break;
    }
}

/* One row through two whole blocks side by side (w, bias and y: each block's, from its first
 * output; bias NULL for none): the same sums as the straight loop's, 16 vectors of them in
 * registers. A core reading two runs of memory at once kept it busier than one: the model's
 * linears at one row took 0.91-0.93x the time (thirty-fourth round; 3 and 4 runs no better). */
static void one_row_two_blocks(const float *x, const float *const w[2], const float *const bias[2],
                               float *const y[2], int64_t in, int64_t chunk) {
    __m256 sum[2][8];
    for (int64_t start = 0; start < in; start += chunk) {
        const int64_t end = start + chunk < in ? start + chunk : in;
        __m256 part[2][8];
        for (int k = 0; k < 2; ++k)
            for (int v = 0; v < 8; ++v) part[k][v] = _mm256_setzero_ps();
        for (int64_t i = start; i < end; ++i) {
            const __m256 xi = _mm256_broadcast_ss(x + i);
            for (int k = 0; k < 2; ++k)
                for (int v = 0; v < 8; ++v)
                    part[k][v] = _mm256_fmadd_ps(xi, _mm256_loadu_ps(w[k] + i * BLOCK + v * 8),
                                                 part[k][v]);
        }
        for (int k = 0; k < 2; ++k)
            for (int v = 0; v < 8; ++v)
                sum[k][v] = start ? _mm256_add_ps(sum[k][v], part[k][v]) : part[k][v];
    }
    for (int k = 0; k < 2; ++k)
        for (int v = 0; v < 8; ++v)
            _mm256_storeu_ps(y[k] + v * 8, bias[k] ? _mm256_add_ps(sum[k][v],
                                                                   _mm256_loadu_ps(bias[k] + v * 8))
                                                   : sum[k][v]);
}

/* 1 to FEW rows through two whole blocks side by side (w, bias and y: each block's, from its first
 * output; row r's outputs `out` after row r - 1's): one row by its own loop, more by the straight
 * loop; the same sums as few_outputs', the same bits. */
static void few_rows_two_blocks(const float *x, const float *const w[2],
                                const float *const bias[2], float *const y[2], int64_t rows,
                                int64_t in, int64_t chunk, int64_t out) {
    switch (rows) {
    case 1: one_row_two_blocks(x, w, bias, y, in, chunk); break;
    case 2: rows_outputs(x, w, bias, y, in, chunk, out, BLOCK, BLOCK, 2, 2); break;
    case 3: rows_outputs(x, w, bias, y, in, chunk, out, BLOCK, BLOCK, 3, 2); break;
    default: rows_outputs(x, w, bias, y, in, chunk, out, BLOCK, BLOCK, 4, 2); break;
    }
}

/* Up to FEW rows through whole blocks [b0, b1) in two runs read side by side; returns where the
 * blocks it read end (an odd one is left). y [rows, out]. */
static int64_t two_block_runs(const float *x, const float *weight, const float *bias, float *y,
                              int64_t rows, int64_t b0, int64_t b1, int64_t in, int64_t in_padded,
                              int64_t out, int64_t chunk) {
    const int64_t per = (b1 - b0) / 2; /* blocks a run */
    for (int64_t j = b0; j < b0 + per; ++j) {
        const int64_t blocks[2] = {j, j + per};
        const float *w[2], *b[2];
        float *ys[2];
        for (int k = 0; k < 2; ++k) {
            w[k] = weight + blocks[k] * in_padded * BLOCK;
            b[k] = bias ? bias + blocks[k] * BLOCK : 0;
            ys[k] = y + blocks[k] * BLOCK;
        }
        few_rows_two_blocks(x, w, b, ys, rows, in, chunk, out);
    }
    return b0 + 2 * per;
}

/* Outputs [first, last) of a block for up to SLAB rows (first a multiple of 16), in tiles. The
 * weights after the block's are its next's (NULL: the block after it in memory). */
static void tiled_outputs(const float *x, const float *block, const float *next,
                          const float *bias, float *y, int64_t rows, int64_t in, int64_t in_padded,
                          int64_t chunk, int64_t out, int64_t first, int64_t last) {
    float sum[SLAB][BLOCK], part[SLAB][BLOCK];
    const int64_t tiles = (rows + TILE_ROWS - 1) / TILE_ROWS;
    const ahead_t to_ask = ahead_of(block, next, in_padded, 0, TILE_AHEAD);
    for (int64_t start = 0; start < in; start += chunk) {
        const int64_t end = start + chunk < in ? start + chunk : in;
        float(*into)[BLOCK] = start ? part : sum; /* the first chunk's sums straight into sum */
        for (int64_t s = start; s < end; s += STRETCH) {
            const int64_t e = s + STRETCH < end ? s + STRETCH : end;
            const float *ahead = line_ahead(to_ask, s);
            const int64_t lines = (e - s) * BLOCK / 16; /* the next stretch's weights */
            for (int64_t t = 0; t < tiles; ++t) { /* the rows shared out evenly */
                const int64_t r0 = t * rows / tiles, r1 = (t + 1) * rows / tiles;
                const int64_t l0 = t * lines / tiles, l1 = (t + 1) * lines / tiles;
                tile_rows(x + r0 * in, in, block + first, (float(*)[BLOCK])(into[r0] + first), s,
                          e, s == start, ahead + l0 * 16, l1 - l0, (last - first + 15) / 16,
                          r1 - r0);
            }
        }
        /* a later chunk's sums added (tested in the loop: an `if` around it, 1.01-1.02x as long) */
        for (int64_t r = 0; start && r < rows; ++r)
            for (int64_t o = first; o < last; ++o) sum[r][o] += part[r][o];
    }
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = first; o < last; ++o)
            y[r * out + o] = bias ? sum[r][o] + bias[o] : sum[r][o];
}
#endif

/* Outputs [first, last) of a block for up to SLAB rows (first a multiple of 16): up to FEW rows
 * through the straight loop, more in tiles (without AVX2, the straight loop FEW rows at a time).
 * At 5-8 rows the tiles take 0.71-0.87x the loop's time, at 2-3 rows 1.05-1.11x (the model's
 * linears from memory, thirty-fifth round). */
static void block_outputs(const float *x, const float *block, const float *next,
                          const float *bias, float *y, int64_t rows, int64_t in, int64_t in_padded,
                          int64_t chunk, int64_t out, int64_t first, int64_t last) {
#if defined(__AVX2__) && defined(__FMA__)
    if (rows > FEW) {
        tiled_outputs(x, block, next, bias, y, rows, in, in_padded, chunk, out, first, last);
        return;
    }
#endif
    (void)next, (void)in_padded;
    for (int64_t r = 0; r < rows; r += FEW)
        few_outputs(x + r * in, block + first, bias ? bias + first : 0, y + r * out + first,
                    rows - r < FEW ? rows - r : FEW, in, chunk, out, last - first);
}
#endif

/* y [rows, out] = x [rows, in] times the packed weight, plus bias (NULL for none). The outputs are
 * shared among the threads as shares.h says (a block is PARTS vectors of AVX-512, or quarters of
 * a block with AVX2); the rows go SLAB at a time. With AVX-512 up to FEW_ROWS rows read the blocks
 * a thread holds whole several at a time (few_rows_runs), with AVX2 up to FEW rows two at a time
 * (two_block_runs), and a block it holds part of alone. */
void packed_gemv(const float *x, const float *weight, const float *bias, float *y, int64_t rows,
                 int64_t in, int64_t in_padded, int64_t out, int64_t chunk, int threads) {
#pragma omp parallel num_threads(threads)
    {
        const share_t share = thread_share((out + BLOCK - 1) / BLOCK, PARTS);
        int64_t b0 = 0, b1 = 0; /* the blocks read side by side */
#ifdef __AVX512F__
        if (rows <= FEW_ROWS) {
            whole_blocks(share, PARTS, out / BLOCK, &b0, &b1);
            few_rows_runs(x, weight, bias, y, rows, b0, b1, in, in_padded, out, chunk);
        }
#elif defined(__AVX2__) && defined(__FMA__)
        if (rows <= FEW) {
            whole_blocks(share, PARTS, out / BLOCK, &b0, &b1);
            b1 = two_block_runs(x, weight, bias, y, rows, b0, b1, in, in_padded, out, chunk);
        }
#endif
        for (int64_t b = share.begin / PARTS; b * PARTS < share.end; ++b) {
            if (b >= b0 && b < b1) continue; /* read above */
            int64_t first, last;
            const int64_t width = out - b * BLOCK < BLOCK ? out - b * BLOCK : BLOCK;
            outputs_in_share(share, b, PARTS, BLOCK / PARTS, width, &first, &last);
            for (int64_t r = 0; first < last && r < rows; r += SLAB)
                block_outputs(x + r * in, weight + b * in_padded * BLOCK, 0,
                              bias ? bias + b * BLOCK : 0, y + r * out + b * BLOCK,
                              rows - r < SLAB ? rows - r : SLAB, in, in_padded, chunk, out, first,
                              last);
        }
    }
}

#ifdef __AVX512F__
#undef FMA
#undef SET1
#undef LOAD
#undef STORE
#undef ZERO
#endif
#pragma GCC pop_options
