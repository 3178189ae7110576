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

#endif
