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

/* sigmoid(x) from exp of a non-positive argument only (exp_nonpositive's domain). */
static inline float sigmoid(float x) {
    const float e = exp_nonpositive(-fabsf(x)), inv = 1.0f / (1.0f + e);
    return x >= 0.0f ? inv : e * inv;
}

/* s[0 .. n) <- softmax, given m = max_j s[j] (finite); returns sum_j exp(s[j] - m). */
static inline float softmax_from_max(float *restrict s, int64_t n, float m) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; j++) {
        s[j] = exp_nonpositive(s[j] - m);
        sum += s[j];
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int64_t j = 0; j < n; j++) s[j] *= inv;
    return sum;
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
