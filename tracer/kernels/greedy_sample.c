/* Greedy sampling's pick: each row's first largest logit, as torch's max(dim=-1).indices finds it,
 * in one pass that compares a vector of logits at a time and a second that finds where the largest
 * first occurs (torch's reduction with indices compares one logit at a time: 0.56 ms for 31 rows of
 * 49,152 bfloat16 logits on 2 threads, this 0.11 ms; docs/benchmarks.md, twentieth round).
 *
 * float32 or bfloat16 logits, row-major and contiguous. A row holding a NaN gets -1: the caller
 * leaves it to torch, whose choice among NaNs this does not copy. Built at first use by
 * tracer/kernels/build.py. */
#include <math.h>
#include <stdint.h>

#include "floats.h"

#define LANES 32 /* logits compared at once: two vectors of AVX-512, four of AVX2 */

INLINE float logit(const void *row, int64_t i, const int is_bf16) {
    return is_bf16 ? from_bf16(((const uint16_t *)row)[i]) : ((const float *)row)[i];
}

/* does row[start:end] hold `largest`? */
INLINE int holds(const void *row, int64_t start, int64_t end, float largest, const int is_bf16) {
    int found = 0;
    for (int64_t i = start; i < end; i++)
        found |= logit(row, i, is_bf16) == largest;
    return found;
}

INLINE int64_t first_largest(const void *row, int64_t n, const int is_bf16) {
    float lanes[LANES]; /* lane j: the largest of logits j, j + LANES, j + 2 LANES, ... */
    int nan[LANES];
    for (int j = 0; j < LANES; j++) {
        lanes[j] = -INFINITY;
        nan[j] = 0;
    }
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) { /* one vector max a step: the compiler sees the lanes */
            const float x = logit(row, i + j, is_bf16);
            lanes[j] = x > lanes[j] ? x : lanes[j];
            nan[j] |= x != x;
        }
    float largest = -INFINITY;
    int any_nan = 0;
    for (; i < n; i++) {
        const float x = logit(row, i, is_bf16);
        largest = x > largest ? x : largest;
        any_nan |= x != x;
    }
    for (int j = 0; j < LANES; j++) {
        largest = lanes[j] > largest ? lanes[j] : largest;
        any_nan |= nan[j];
    }
    if (any_nan)
        return -1;
    for (int64_t start = 0; start < n; start += LANES) {
        const int64_t end = start + LANES < n ? start + LANES : n;
        if (holds(row, start, end, largest, is_bf16))
            for (int64_t k = start; k < end; k++)
                if (logit(row, k, is_bf16) == largest)
                    return k;
    }
    return 0; /* not reached: the largest is in the row (every logit -inf: the first) */
}

void first_largest_rows(const void *logits, int64_t rows, int64_t n, int is_bf16, int64_t *out,
                        int num_threads) {
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int64_t r = 0; r < rows; r++)
        out[r] = is_bf16 ? first_largest((const uint16_t *)logits + r * n, n, 1)
                         : first_largest((const float *)logits + r * n, n, 0);
}
