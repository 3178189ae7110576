/* A bfloat16 linear layer for a few rows, on Intel's AMX tiles, reading the weight oneDNN has packed
 * (nanoengine/loading/build.py: pack_for_onednn) in place: packed_gemv.c's counterpart in bfloat16.
 *
 * The packed layout, bfloat16: blocks of 32 outputs, one after the other; inside a block, inputs go
 * in pairs, and each pair's 32 outputs side by side, the pair's two weights next to each other:
 * w[o, i] at (o / 32) * in * 32 + (i / 2) * 64 + (o % 32) * 2 + i % 2. That is the layout AMX's
 * tile multiply takes: a tile of 16 rows (pairs of inputs) by 16 outputs is 16 runs of 64 bytes,
 * 128 bytes apart.
 *
 * AMX's bf16 multiply (TDPBF16PS) adds 32 inputs' products to a float32 sum in one instruction, with
 * an internal order and rounding of its own; no loop of multiply-adds gives its bits. So this kernel
 * runs the same instruction on the same groups of 32 inputs, in order, into one float32 sum per
 * output, as oneDNN does at these row counts; then the bias, then one rounding to bfloat16. The
 * caller (packed_linear.py) checks that it gives oneDNN's bits for each shape and row count at first
 * use, and keeps oneDNN where not. Built at first use by tracer/kernels/build.py; where the compiler
 * or the CPU lacks AMX, amx_gemv_ready says no and the engine keeps oneDNN. */
#include <stdint.h>
#include <string.h>

#include "floats.h"

enum { AMX_BLOCK = 32, K_STEP = 32, GROUP = 16 };
enum {
    STEP_BYTES = K_STEP * AMX_BLOCK * 2, /* a block's weights for one multiply: 2 kB */
    AMX_AHEAD = 16 * 1024,               /* how far ahead (bytes) the weights are asked into L2 */
};

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };

/* Linux lets a process use the tiles' 8 kB of state only once it has asked. Returns 1 when it may. */
int amx_gemv_ready(void) {
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t bytes_per_row[16];
    uint8_t rows[16];
} tile_config_t;

/* GCC's tile intrinsics (12.2) are asm statements that understate the memory they touch (tile
 * loads and stores: none; the configuration's load: its first 8 of 64 bytes), so the compiler may
 * move ordinary loads and stores across them. This keeps the configuration's and the staged copy's
 * stores before the instructions that read them, and the sums' reads after the tile stores that
 * write them (without it, a variant of the kernel loaded a stale copy). */
static inline void compiler_barrier(void) { __asm__ volatile("" ::: "memory"); }

/* Tiles 0-1: group 0's sums (outputs 0-15, 16-31 of a block); 2-3: group 1's; 4, 5: the groups'
 * inputs, 32 each; 6, 7: the block's weights for those 32 inputs, two halves of 16 outputs. */
static void configure_tiles(int64_t rows0, int64_t rows1) {
    tile_config_t c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    const int64_t rows[8] = {rows0, rows0, rows1, rows1, rows0, rows1, K_STEP / 2, K_STEP / 2};
    for (int t = 0; t < 8; ++t) {
        c.rows[t] = (uint8_t)(rows[t] ? rows[t] : 1);
        c.bytes_per_row[t] = 64;
    }
    compiler_barrier();
    _tile_loadconfig(&c);
}

/* bias added, rounded to bfloat16, `width` outputs of each of `rows` rows stored */
static void store_rows(const float sum[GROUP][AMX_BLOCK], const uint16_t *bias, uint16_t *y,
                       int64_t rows, int64_t out, int64_t width) {
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = 0; o < width; ++o)
            y[r * out + o] = to_bf16(bias ? sum[r][o] + from_bf16(bias[o]) : sum[r][o]);
}

/* A multiply's 2 kB of weights copied into `stage` (in the L1 cache) with vector loads, and the
 * weights AMX_AHEAD bytes on asked into L2 meanwhile. The tiles then load from the copy: tile loads
 * straight from memory read at ~24 GB/s where vector loads read at ~29 (docs/benchmarks.md,
 * seventeenth round). The same numbers reach the tiles, so the bits do not change. */
static const uint16_t *staged(const uint16_t *weights, uint16_t *stage) {
    const char *from = (const char *)weights;
    char *to = (char *)stage;
    for (int64_t b = 0; b < STEP_BYTES; b += 64) {
        __builtin_prefetch(from + b + AMX_AHEAD, 0, 2);
        _mm512_store_si512(to + b, _mm512_loadu_si512(from + b));
    }
    compiler_barrier();
    return stage;
}

/* One block's outputs for up to two groups of 16 rows (rows1 may be 0): the block's weights are
 * loaded once for both. */
static void tile_block_outputs(const uint16_t *x, const uint16_t *block, const uint16_t *bias,
                          uint16_t *y, int64_t in, int64_t out, int64_t width, int64_t rows0,
                          int64_t rows1) {
    const int64_t x_stride = in * 2, w_stride = AMX_BLOCK * 2 * 2; /* bytes */
    /* two in turn: a step's copy never overwrites what the step before still loads from, so the
     * one barrier in staged() a step is enough */
    _Alignas(64) uint16_t stage[2][STEP_BYTES / 2];
    _tile_zero(0);
    _tile_zero(1);
    if (rows1) {
        _tile_zero(2);
        _tile_zero(3);
    }
    for (int64_t i = 0; i < in; i += K_STEP) {
        const uint16_t *w = staged(block + i * AMX_BLOCK, stage[(i / K_STEP) % 2]);
        _tile_loadd(6, w, w_stride);
        _tile_loadd(7, w + AMX_BLOCK, w_stride);
        _tile_loadd(4, x + i, x_stride);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        if (rows1) {
            _tile_loadd(5, x + GROUP * in + i, x_stride);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
    float sum[2][GROUP][AMX_BLOCK]; /* each group's own: no tile store overwrites sums unread */
    _tile_stored(0, &sum[0][0][0], AMX_BLOCK * 4);
    _tile_stored(1, &sum[0][0][GROUP], AMX_BLOCK * 4);
    if (rows1) {
        _tile_stored(2, &sum[1][0][0], AMX_BLOCK * 4);
        _tile_stored(3, &sum[1][0][GROUP], AMX_BLOCK * 4);
    }
    compiler_barrier();
    store_rows(sum[0], bias, y, rows0, out, width);
    if (rows1) store_rows(sum[1], bias, y + GROUP * out, rows1, out, width);
}

/* y [rows, out] = x [rows, in] times the packed weight, plus bias (NULL for none); bfloat16, `in` a
 * multiple of 32. The blocks are shared among the threads; the rows go 32 at a time. */
void amx_gemv(const uint16_t *x, const uint16_t *weight, const uint16_t *bias, uint16_t *y,
              int64_t rows, int64_t in, int64_t out, int threads) {
    const int64_t blocks = (out + AMX_BLOCK - 1) / AMX_BLOCK;
#pragma omp parallel num_threads(threads)
    for (int64_t r = 0; r < rows; r += 2 * GROUP) {
        const int64_t rows0 = rows - r < GROUP ? rows - r : GROUP;
        const int64_t rows1 = rows - r - rows0 < GROUP ? rows - r - rows0 : GROUP;
        configure_tiles(rows0, rows1);
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; ++b) {
            const int64_t width = out - b * AMX_BLOCK < AMX_BLOCK ? out - b * AMX_BLOCK : AMX_BLOCK;
            const uint16_t *block_bias = bias ? bias + b * AMX_BLOCK : 0;
            tile_block_outputs(x + r * in, weight + b * in * AMX_BLOCK, block_bias,
                               y + r * out + b * AMX_BLOCK, in, out, width, rows0, rows1);
        }
    }
}
#else
int amx_gemv_ready(void) { return 0; }

void amx_gemv(const uint16_t *x, const uint16_t *weight, const uint16_t *bias, uint16_t *y,
              int64_t rows, int64_t in, int64_t out, int threads) {
    (void)x, (void)weight, (void)bias, (void)y, (void)rows, (void)in, (void)out, (void)threads;
}
#endif
