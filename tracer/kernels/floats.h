/* What the kernels need of a float: bfloat16 to and from float32 as torch converts, an element of
 * either kind of array as a float and back, and e^x as torch's vectorized exp computes it (SLEEF's
 * expf_u10 with fused multiply-adds), written out so that a loop calling it still vectorizes. */
#ifndef NANOENGINE_FLOATS_H
#define NANOENGINE_FLOATS_H

#include <stdint.h>
#include <string.h>

/* inlined into each caller: a trip count or an element type known there fixes the callee's loops */
#define INLINE static inline __attribute__((always_inline))

static inline float from_bf16(uint16_t x) {
    uint32_t bits = (uint32_t)x << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t to_bf16(float f) { /* round to nearest even, as torch does */
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    bits += 0x7FFF + ((bits >> 16) & 1);
    return (uint16_t)(bits >> 16);
}

/* element i of a float32 or bfloat16 array, as a float */
static inline float get(const void *a, int64_t i, int is_bf16) {
    return is_bf16 ? from_bf16(((const uint16_t *)a)[i]) : ((const float *)a)[i];
}

/* store f as element i, rounded to the array's type */
static inline void put(void *a, int64_t i, float f, int is_bf16) {
    if (is_bf16)
        ((uint16_t *)a)[i] = to_bf16(f);
    else
        ((float *)a)[i] = f;
}

/* x rounded to the tensor type, as torch holds every intermediate result */
static inline float round_to(float x, int is_bf16) { return is_bf16 ? from_bf16(to_bf16(x)) : x; }

INLINE float sleef_expf(float d) {
    const float q = (d * 1.442695040888963407359924681001892137f + 12582912.f) - 12582912.f;
    float s = __builtin_fmaf(q, -0.693145751953125f, d);
    s = __builtin_fmaf(q, -1.428606765330187045e-06f, s);
    float u = 0.000198527617612853646278381f;
    u = __builtin_fmaf(u, s, 0.00139304355252534151077271f);
    u = __builtin_fmaf(u, s, 0.00833336077630519866943359f);
    u = __builtin_fmaf(u, s, 0.0416664853692054748535156f);
    u = __builtin_fmaf(u, s, 0.166666671633720397949219f);
    u = __builtin_fmaf(u, s, 0.5f);
    u = 1.0f + __builtin_fmaf(s * s, u, s);
    const int32_t e = (int32_t)q, half = e >> 1; /* u * 2^e, in two steps that cannot overflow */
    const int32_t bits1 = (half + 127) << 23, bits2 = (e - half + 127) << 23;
    float scale1, scale2;
    memcpy(&scale1, &bits1, sizeof scale1);
    memcpy(&scale2, &bits2, sizeof scale2);
    u = u * scale1 * scale2;
    u = d < -104.f ? 0.f : u;
    return d > 104.f ? __builtin_inff() : u;
}

#endif
