/* How the few-row linears (packed_gemv.c, dpbf16_gemv.c) share a linear's outputs among their
 * OpenMP threads: the packed weight's blocks of outputs are `parts` vectors each, and each thread
 * takes an equal run of all the blocks' vectors, a block between two threads split by vectors: 9
 * blocks on 2 threads are 4.5 each, not 5 and 4 (docs/benchmarks.md, twenty-third round). Each
 * output is summed by one thread whichever, so the sharing never changes a bit. */
#ifndef NANOENGINE_SHARES_H
#define NANOENGINE_SHARES_H

#include <omp.h>
#include <stdint.h>

typedef struct {
    int64_t begin, end; /* this thread's vectors [begin, end), counted over all the blocks */
} share_t;

/* Inside a parallel region: the calling thread's run of blocks * parts vectors. */
static inline share_t thread_share(int64_t blocks, int64_t parts) {
    const int64_t vectors = blocks * parts, n = omp_get_num_threads(), t = omp_get_thread_num();
    return (share_t){t * vectors / n, (t + 1) * vectors / n};
}

/* Block b's outputs in the share, [*first, *last) (none where first >= last): `width` outputs the
 * block has (the last one may be part full), `per_part` a vector's. */
static inline void outputs_in_share(share_t share, int64_t b, int64_t parts, int64_t per_part,
                                    int64_t width, int64_t *first, int64_t *last) {
    const int64_t v0 = share.begin > b * parts ? share.begin - b * parts : 0;
    const int64_t v1 = share.end < (b + 1) * parts ? share.end - b * parts : parts;
    *first = v0 * per_part;
    *last = v1 * per_part < width ? v1 * per_part : width;
}

/* Up to FEW_ROWS rows the few-row linears read the blocks a thread holds whole several at a time,
 * side by side: as many as keep the partial sums (rows x blocks x 4 vectors) within the 32 vector
 * registers, at most STREAMS (packed_gemv.c: few_rows). */
enum { FEW_ROWS = 4, STREAMS = 4 };
#define STREAMS_FOR(rows) ((rows) <= 2 ? STREAMS : 2)

/* The blocks a share holds whole, [*begin, *end): every vector of a block with all its outputs
 * (the first `full` blocks have them). */
static inline void whole_blocks(share_t share, int64_t parts, int64_t full, int64_t *begin,
                                int64_t *end) {
    *begin = (share.begin + parts - 1) / parts;
    *end = share.end / parts < full ? share.end / parts : full;
    *end = *end > *begin ? *end : *begin;
}

/* Whole blocks [b0, b1) cut into runs of `per` blocks (the last may be shorter), read side by side:
 * the blocks of step j, run k's j-th in blocks[k]. Returns how many. */
static inline int side_by_side(int64_t b0, int64_t b1, int64_t per, int64_t j, int64_t *blocks) {
    int n = 0;
    for (int64_t b = b0 + j; b < b1; b += per) blocks[n++] = b;
    return n;
}

#endif
