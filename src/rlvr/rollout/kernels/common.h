/* What the kernel sources share. */
#ifndef RLVR_KERNELS_COMMON_H
#define RLVR_KERNELS_COMMON_H

#include <math.h>
#include <stdint.h>

/* exp(x) for x <= 0 (scores minus their max), Cephes' expf polynomial: ~1 ulp, 0 below
 * -87.3 (which covers -inf from masked prompt padding). */
static inline float exp_nonpositive(float x) {
    float zero = x < -87.33654f ? 0.0f : 1.0f;
    x = x < -87.33654f ? -87.33654f : x;
    float fx = floorf(x * 1.44269504088896341f + 0.5f);
    x = x - fx * 0.693359375f - fx * -2.12194440e-4f;
    float z = x * x;
    float y = ((((1.9875691500e-4f * x + 1.3981999507e-3f) * x + 8.3334519073e-3f) * x +
                4.1665795894e-2f) * x + 1.6666665459e-1f) * x + 5.0000001201e-1f;
    y = y * z + x + 1.0f;
    union {
        int32_t i;
        float f;
    } pow2 = {.i = ((int32_t)fx + 127) << 23}; /* 2^fx: the exponent bits, type-punned */
    return y * pow2.f * zero;
}

#endif
