/* A linear layer for a few rows (a decode step of one to a few sequences), reading the weight
 * oneDNN has packed (nanoengine/loading/build.py: pack_for_onednn) in place.
 *
 * At one row a linear is a matrix-vector product: every weight is read once and used once, so its
 * time is the time to read the weights. oneDNN's kernel reads them at two thirds of the rate this
 * plain loop does (docs/benchmarks.md, thirteenth round).
 *
 * The packed layout, float32: blocks of 64 outputs, one after the other; inside a block, input i's
 * 64 weights side by side: w[o, i] at (o / 64) * in_padded * 64 + i * 64 + o % 64, where in_padded
 * is `in` rounded up (to a multiple of 16 on the CPUs seen) and the padding is zeros. Each output is
 * summed as oneDNN sums it: over i in order, one fused multiply-add per term, in chunks of `chunk`
 * inputs whose sums start from zero and are added in order; then the bias. So the result has
 * oneDNN's bits: the caller (packed_linear.py) checks that for each shape and row count at its
 * first use, and keeps oneDNN where not. Built at first use by tracer/kernels/build.py. */
#include <stdint.h>

/* gcc's default for Intel's AVX-512 CPUs is 256-bit vectors; 512-bit ones read a row's weights in
 * 0.85x the time on a Sapphire Rapids (docs/benchmarks.md, fourteenth round). Each output's sum is
 * the same at any width. */
#pragma GCC push_options
#pragma GCC target("prefer-vector-width=512")

enum { BLOCK = 64, ROWS_AT_ONCE = 4 };

#define INLINE static inline __attribute__((always_inline))

/* One block's 64 outputs for `rows` rows (a constant in each inlined copy): the block's weights
 * are read once for all of them. */
INLINE void block_outputs(const float *x, const float *block, const float *bias, float *y,
                          int64_t in, int64_t chunk, int64_t out, int64_t width, const int rows) {
    float sum[ROWS_AT_ONCE][BLOCK];
    for (int64_t start = 0; start < in; start += chunk) {
        const int64_t end = start + chunk < in ? start + chunk : in;
        float part[ROWS_AT_ONCE][BLOCK] = {{0}};
        for (int64_t i = start; i < end; ++i)
            for (int r = 0; r < rows; ++r) {
                const float xi = x[r * in + i];
#pragma omp simd
                for (int o = 0; o < BLOCK; ++o)
                    part[r][o] = __builtin_fmaf(xi, block[i * BLOCK + o], part[r][o]);
            }
        for (int r = 0; r < rows; ++r)
#pragma omp simd
            for (int o = 0; o < BLOCK; ++o) sum[r][o] = start ? sum[r][o] + part[r][o] : part[r][o];
    }
    for (int r = 0; r < rows; ++r)
        for (int64_t o = 0; o < width; ++o) y[r * out + o] = bias ? sum[r][o] + bias[o] : sum[r][o];
}

/* y [rows, out] = x [rows, in] times the packed weight, plus bias (NULL for none). The blocks are
 * shared among the threads; the rows go four at a time. */
void packed_gemv(const float *x, const float *weight, const float *bias, float *y, int64_t rows,
                 int64_t in, int64_t in_padded, int64_t out, int64_t chunk, int threads) {
    const int64_t blocks = (out + BLOCK - 1) / BLOCK;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
        const float *block = weight + b * in_padded * BLOCK;
        const float *block_bias = bias ? bias + b * BLOCK : 0;
        const int64_t width = out - b * BLOCK < BLOCK ? out - b * BLOCK : BLOCK;
        for (int64_t r = 0; r < rows; r += ROWS_AT_ONCE) {
            const float *xr = x + r * in;
            float *yr = y + r * out + b * BLOCK;
            switch (rows - r < ROWS_AT_ONCE ? rows - r : ROWS_AT_ONCE) {
            case 1: block_outputs(xr, block, block_bias, yr, in, chunk, out, width, 1); break;
            case 2: block_outputs(xr, block, block_bias, yr, in, chunk, out, width, 2); break;
            case 3: block_outputs(xr, block, block_bias, yr, in, chunk, out, width, 3); break;
            default: block_outputs(xr, block, block_bias, yr, in, chunk, out, width, 4); break;
            }
        }
    }
}

#pragma GCC pop_options
