/* fn(args..., v) with v = vecs made a constant (1 to 4: a packed block's 64 outputs are up to four
 * vectors), so that in each inlined copy of fn the loops over the vectors unroll and its sums stay
 * in registers. The few-row linears (packed_gemv.c, dpbf16_gemv.c) call their tiles and their
 * one-row loop through it. */
#ifndef NANOENGINE_CONSTANT_VECS_H
#define NANOENGINE_CONSTANT_VECS_H

#define WITH_CONSTANT_VECS(vecs, fn, ...)                                                         \
    switch (vecs) {                                                                               \
    case 1: fn(__VA_ARGS__, 1); break;                                                            \
    case 2: fn(__VA_ARGS__, 2); break;                                                            \
    case 3: fn(__VA_ARGS__, 3); break;                                                            \
    default: fn(__VA_ARGS__, 4); break;                                                           \
    }

/* fn(args..., rows, n, vecs) with rows (1 to 4) and n, the whole blocks read side by side (1 to 4
 * at 1-2 rows, 1 to 2 at 3-4: shares.h's STREAMS_FOR), made constants; vecs, a whole block's
 * vectors, is the caller's constant: the few-row linears' calls of their straight loop
 * (packed_gemv.c: few_rows). */
#define WITH_CONSTANT_ROWS_AND_STREAMS(rows, n, vecs, fn, ...)                                   \
    switch ((rows) * 8 + (n)) {                                                                   \
    case 9: fn(__VA_ARGS__, 1, 1, vecs); break;                                                   \
    case 10: fn(__VA_ARGS__, 1, 2, vecs); break;                                                  \
    case 11: fn(__VA_ARGS__, 1, 3, vecs); break;                                                  \
    case 12: fn(__VA_ARGS__, 1, 4, vecs); break;                                                  \
    case 17: fn(__VA_ARGS__, 2, 1, vecs); break;                                                  \
    case 18: fn(__VA_ARGS__, 2, 2, vecs); break;                                                  \
    case 19: fn(__VA_ARGS__, 2, 3, vecs); break;                                                  \
    case 20: fn(__VA_ARGS__, 2, 4, vecs); break;                                                  \
    case 25: fn(__VA_ARGS__, 3, 1, vecs); break;                                                  \
    case 26: fn(__VA_ARGS__, 3, 2, vecs); break;                                                  \
    case 33: fn(__VA_ARGS__, 4, 1, vecs); break;                                                  \
    case 34: fn(__VA_ARGS__, 4, 2, vecs); break;                                                  \
    }

#endif
