/* Decoding-step linears (rlvr.cpu.packed.PackedLinear, via rlvr.cpu.packed.Panels).
 *
 * y (M x N) = x (M x K) W^T + bias, then an epilogue (+ other, * other, or SiLU), for the few
 * dozen rows of a decoding step. oneDNN spends ~15 us of setup on every call, most of a
 * 32-row matmul's time on a small model; this is one register-blocked pass: W is packed once
 * per rollout into panels of NP output columns (k-major inside a panel), and each panel is
 * streamed once per block of 8 rows of x, broadcast from L1/L2. Threads split the panels. */
#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"

#define NP (2 * VL)

enum { EPI_NONE = 0, EPI_ADD = 1, EPI_SILU = 2, EPI_MUL = 3 };

/* wp[(n / NP) * K * NP + k * NP + n % NP] = w[n][k], zero past N. */
void rlvr_pack_panels(const float *w, int64_t N, int64_t K, float *wp, int threads) {
    const int64_t panels = (N + NP - 1) / NP;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t p = 0; p < panels; p++) {
        float *dst = wp + p * K * NP;
        for (int64_t c = 0; c < NP; c++) {
            const int64_t n = p * NP + c;
            if (n < N) {
                const float *row = w + n * K;
                for (int64_t k = 0; k < K; k++) dst[k * NP + c] = row[k];
            } else {
                for (int64_t k = 0; k < K; k++) dst[k * NP + c] = 0.0f;
            }
        }
    }
}

static inline vf silu_v(vf x) {
    vf out;
    for (int c = 0; c < VL; c++) out[c] = x[c] * sigmoid(x[c]); /* as the fused SiLU */
    return out;
}

/* Rows [i0, i0 + RB) of panel p; RB is 8 or 1 (the tail). */
#define LINEAR_ROWS(RB)                                                                      \
    static void linear_rows_##RB(const float *restrict x, int64_t i0, int64_t K,             \
                                 const float *restrict panel, int64_t n0, int64_t N,         \
                                 const float *bias, int epi, const float *other,             \
                                 float *restrict y) {                                        \
        vf acc[RB][2];                                                                       \
        UNROLL for (int i = 0; i < RB; i++) acc[i][0] = acc[i][1] = (vf){0};                 \
        for (int64_t k = 0; k < K; k++) {                                                    \
            const vf b0 = LD(panel + k * NP), b1 = LD(panel + k * NP + VL);                  \
            UNROLL for (int i = 0; i < RB; i++) {                                            \
                const float a = x[(i0 + i) * K + k];                                         \
                acc[i][0] += a * b0;                                                         \
                acc[i][1] += a * b1;                                                         \
            }                                                                                \
        }                                                                                    \
        for (int i = 0; i < RB; i++) {                                                       \
            float *yr = y + (i0 + i) * N;                                                    \
            const float *orow = other ? other + (i0 + i) * N : NULL;                         \
            for (int h = 0; h < 2; h++) {                                                    \
                const int64_t n = n0 + h * VL;                                               \
                if (n >= N) break;                                                           \
                vf v = acc[i][h];                                                            \
                if (n + VL <= N) {                                                           \
                    if (bias) v += LD(bias + n);                                             \
                    if (epi == EPI_SILU) v = silu_v(v);                                      \
                    else if (epi == EPI_ADD) v += LD(orow + n);                              \
                    else if (epi == EPI_MUL) v *= LD(orow + n);                              \
                    ST(yr + n, v);                                                           \
                } else {                                                                     \
                    vf t = v;                                                                \
                    if (epi == EPI_SILU) { /* bias first, on the lanes that exist */         \
                        for (int c = 0; c < N - n; c++) t[c] += bias ? bias[n + c] : 0.0f;   \
                        t = silu_v(t);                                                       \
                    }                                                                        \
                    for (int c = 0; c < N - n; c++) {                                        \
                        float s = epi == EPI_SILU ? t[c] : v[c] + (bias ? bias[n + c] : 0.0f); \
                        if (epi == EPI_ADD) s += orow[n + c];                                \
                        else if (epi == EPI_MUL) s *= orow[n + c];                           \
                        yr[n + c] = s;                                                       \
                    }                                                                        \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
    }
LINEAR_ROWS(8)
LINEAR_ROWS(1)

void rlvr_linear(const float *x, int64_t M, int64_t K, const float *wp, int64_t N,
                 const float *bias, int epi, const float *other, float *y, int threads) {
    const int64_t panels = (N + NP - 1) / NP;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t p = 0; p < panels; p++) {
        const float *panel = wp + p * K * NP;
        int64_t i0 = 0;
        for (; i0 + 8 <= M; i0 += 8)
            linear_rows_8(x, i0, K, panel, p * NP, N, bias, epi, other, y);
        for (; i0 < M; i0++) linear_rows_1(x, i0, K, panel, p * NP, N, bias, epi, other, y);
    }
}

int rlvr_panel_width(void) { return NP; }
