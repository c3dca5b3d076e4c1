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

/* GCC vector extensions: VL floats a register, NACC accumulators a micro-kernel keeps in
 * registers (AVX-512 where built for it, else 8-wide: AVX2 or two SSE halves). */
#if defined(__AVX512F__)
#define VL 16   /* floats per vector register */
#define NACC 16 /* vector accumulators a micro-kernel keeps in registers */
#else
#define VL 8
#define NACC 8
#endif
typedef float vf __attribute__((vector_size(VL * sizeof(float))));
typedef float vfu __attribute__((vector_size(VL * sizeof(float)), aligned(sizeof(float))));
#define LD(p) (*(const vfu *)(p))
#define ST(p, x) (*(vfu *)(p) = (x))
#define UNROLL _Pragma("GCC unroll 16")

#endif
