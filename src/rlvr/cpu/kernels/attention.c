/* Masked softmax attention for the training and log-prob forwards, forward and backward
 * (rlvr.attention holds the autograd function and the checks; SDPA is the reference).
 *
 *   out_i = sum_j softmax_j(s_ij) v_j,   s_ij = scale * q_i . k_j where mask_ij, else -inf
 *
 * What it does that torch's CPU flash-attention kernel, given an explicit mask, does not:
 * each query block stops at its last allowed key (the causal half and any trailing padding
 * are never computed), and the small matrix products run as register-blocked loops over a
 * whole (batch, KV head) instead of one BLAS call per block. A task is one (batch, KV head):
 * its keys are transposed once and shared by the query heads that read them (GQA), and in the
 * backward it owns its dK and dV, so tasks run in parallel without atomics.
 *
 * The backward recomputes the probabilities from the saved log-sum-exp per query row
 * (FlashAttention-2's scheme): P = exp(s - lse), dS = P * (dO V^T - rowsum(dO * O)) * scale,
 * dQ = dS K, dK = dS^T Q, dV = P^T dO.
 *
 * Layouts: q (B, Hq, Lq, D), k and v (B, Hkv, Lk, D), each with any batch/head/position
 * strides and unit stride over D; mask (bool bytes) broadcast over batch or head by a zero
 * stride, unit stride over keys, or NULL (then `causal` says whether query i sees keys
 * j <= i, as SDPA's is_causal); out and dout (B, Lq, Hq, D) contiguous (the layout the
 * attention module reshapes); lse (B, Hq, Lq); dq (B, Hq, Lq, D), dk and dv (B, Hkv, Lk, D)
 * contiguous. A query row with no allowed key gets a zero output and zero gradients. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#define R 8       /* query rows per block: R accumulators in the score micro-kernel */
#define KSTEP VL  /* keys per step of the score micro-kernel; key buffers are padded to it */

static int64_t padded(int64_t n) { return (n + KSTEP - 1) / KSTEP * KSTEP; }

/* s[i][j] = sum_d a[i][d] bt[d][j] for the R rows of a (row stride lda) and keys j < jend (a
 * multiple of KSTEP); bt is (D x ldb), s is (R x ldb). */
static void scores(const float *restrict a, int64_t lda, const float *restrict bt, int64_t ldb,
                   int64_t D, int64_t jend, float *restrict s) {
    for (int64_t j = 0; j < jend; j += KSTEP) {
        vf acc[R];
        UNROLL for (int i = 0; i < R; i++) acc[i] = (vf){0};
        for (int64_t d = 0; d < D; d++) {
            const vf b = LD(bt + d * ldb + j);
            UNROLL for (int i = 0; i < R; i++) acc[i] += a[i * lda + d] * b;
        }
        UNROLL for (int i = 0; i < R; i++) ST(s + i * ldb + j, acc[i]);
    }
}

/* The products whose output rows are D wide, for a compile-time D (the row then lives in
 * registers): PR rows at a time, PR * D / VL accumulators. Row strides: ldx, ldo, lda. Row i
 * of p or w is zero from kend[i] on, so no row is summed past it.
 *   rows_times_D:  o[i] = sum_{j < kend[i]} p[i][j] x_j       (the R rows of o)
 *   accum_t_D:     dst[j] += sum_{i < n} w[i][j] a_i          (j < jend, a multiple of KSTEP) */
#define DEFINE_D(DD)                                                                        \
    enum { C_##DD = DD / VL, PR_##DD = NACC / C_##DD > 0 ? NACC / C_##DD : 1 };             \
    static void rows_times_##DD(const float *restrict p, int64_t ldp, const float *restrict x, \
                                int64_t ldx, const int64_t *kend, float *restrict o,        \
                                int64_t ldo) {                                              \
        for (int i0 = 0; i0 < R; i0 += PR_##DD) {                                           \
            vf acc[PR_##DD][C_##DD];                                                        \
            int64_t jend = 0;                                                               \
            for (int i = 0; i < PR_##DD; i++) jend = kend[i0 + i] > jend ? kend[i0 + i] : jend; \
            UNROLL for (int i = 0; i < PR_##DD; i++) UNROLL for (int c = 0; c < C_##DD; c++) \
                acc[i][c] = (vf){0};                                                        \
            for (int64_t j = 0; j < jend; j++) {                                            \
                vf xj[C_##DD];                                                              \
                UNROLL for (int c = 0; c < C_##DD; c++) xj[c] = LD(x + j * ldx + c * VL);   \
                UNROLL for (int i = 0; i < PR_##DD; i++) {                                  \
                    const float w = p[(i0 + i) * ldp + j];                                  \
                    UNROLL for (int c = 0; c < C_##DD; c++) acc[i][c] += w * xj[c];         \
                }                                                                           \
            }                                                                               \
            UNROLL for (int i = 0; i < PR_##DD; i++) UNROLL for (int c = 0; c < C_##DD; c++) \
                ST(o + (i0 + i) * ldo + c * VL, acc[i][c]);                                 \
        }                                                                                   \
    }                                                                                       \
    static void accum_t_##DD(const float *restrict w, int64_t ldw, const float *restrict a,  \
                             int64_t lda, int64_t n, const int64_t *kend, int64_t jend,     \
                             float *restrict dst) {                                         \
        for (int64_t j0 = 0; j0 < jend; j0 += PR_##DD) {                                    \
            vf acc[PR_##DD][C_##DD];                                                        \
            UNROLL for (int j = 0; j < PR_##DD; j++) UNROLL for (int c = 0; c < C_##DD; c++) \
                acc[j][c] = LD(dst + (j0 + j) * DD + c * VL);                               \
            for (int64_t i = 0; i < n; i++) {                                               \
                if (kend[i] <= j0) continue; /* zeros from here on */                       \
                vf ai[C_##DD];                                                              \
                UNROLL for (int c = 0; c < C_##DD; c++) ai[c] = LD(a + i * lda + c * VL);   \
                UNROLL for (int j = 0; j < PR_##DD; j++) {                                  \
                    const float x = w[i * ldw + j0 + j];                                    \
                    UNROLL for (int c = 0; c < C_##DD; c++) acc[j][c] += x * ai[c];         \
                }                                                                           \
            }                                                                               \
            UNROLL for (int j = 0; j < PR_##DD; j++) UNROLL for (int c = 0; c < C_##DD; c++) \
                ST(dst + (j0 + j) * DD + c * VL, acc[j][c]);                                \
        }                                                                                   \
    }
DEFINE_D(32)
DEFINE_D(64)
DEFINE_D(128)

static void rows_times(int64_t D, const float *p, int64_t ldp, const float *x, int64_t ldx,
                       const int64_t *kend, float *o, int64_t ldo) {
    if (D == 32) rows_times_32(p, ldp, x, ldx, kend, o, ldo);
    else if (D == 64) rows_times_64(p, ldp, x, ldx, kend, o, ldo);
    else rows_times_128(p, ldp, x, ldx, kend, o, ldo);
}

static void accum_t(int64_t D, const float *w, int64_t ldw, const float *a, int64_t lda,
                    int64_t n, const int64_t *kend, int64_t jend, float *dst) {
    if (D == 32) accum_t_32(w, ldw, a, lda, n, kend, jend, dst);
    else if (D == 64) accum_t_64(w, ldw, a, lda, n, kend, jend, dst);
    else accum_t_128(w, ldw, a, lda, n, kend, jend, dst);
}

/* dims: B, Hq, Hkv, Lq, Lk, D. strides: q (batch, head, position), k (same), v (same), mask
 * (batch, head, query). */
typedef struct {
    int64_t B, Hq, Hkv, Lq, Lk, D, Lkp;
    const int64_t *st;
    const uint8_t *mask;
    int causal;
    float scale;
} Shape;

static Shape shape_of(const int64_t *dims, const int64_t *strides, const uint8_t *mask,
                      int causal, float scale) {
    Shape s = {dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], padded(dims[4]),
               strides, mask, causal, scale};
    return s;
}

static const uint8_t *mask_row(const Shape *s, int64_t b, int64_t h, int64_t i) {
    return s->mask ? s->mask + b * s->st[9] + h * s->st[10] + i * s->st[11] : NULL;
}

/* One past the last key query row i may see. */
static int64_t key_end(const Shape *s, const uint8_t *m, int64_t i) {
    if (m) {
        int64_t j = s->Lk;
        while (j > 0 && !m[j - 1]) j--;
        return j;
    }
    if (s->causal) return i + 1 < s->Lk ? i + 1 : s->Lk;
    return s->Lk;
}

/* xt (D x Lkp) = x^T for the Lk rows at stride ldx, zero past Lk. */
static void transpose_keys(const Shape *s, const float *x, int64_t ldx, float *xt) {
    for (int64_t d = 0; d < s->D; d++) {
        float *row = xt + d * s->Lkp;
        for (int64_t j = 0; j < s->Lk; j++) row[j] = x[j * ldx + d];
        for (int64_t j = s->Lk; j < s->Lkp; j++) row[j] = 0.0f;
    }
}

/* Query rows i0 .. i0 + R of one head (rows at stride ld from x): sets each row's key end
 * (0 past Lq; not when kend is NULL) and returns the block's largest. Where the block is
 * whole, *a points at the rows themselves (*lda = ld); the last, partial block is copied to
 * tmp (R x D, zero rows past Lq; *lda = D). */
static int64_t load_block(const Shape *s, const float *x, int64_t ld, int64_t b, int64_t h,
                          int64_t i0, float *tmp, int64_t *kend, const float **a,
                          int64_t *lda) {
    int64_t kmax = 0;
    const int whole = i0 + R <= s->Lq;
    for (int i = 0; i < R; i++) {
        const int64_t row = i0 + i;
        if (kend) {
            kend[i] = row < s->Lq ? key_end(s, mask_row(s, b, h, row), row) : 0;
            kmax = kend[i] > kmax ? kend[i] : kmax;
        }
        if (whole) continue;
        if (row < s->Lq) memcpy(tmp + i * s->D, x + row * ld, (size_t)s->D * sizeof(float));
        else memset(tmp + i * s->D, 0, (size_t)s->D * sizeof(float));
    }
    *a = whole ? x + i0 * ld : tmp;
    *lda = whole ? ld : s->D;
    return kmax;
}

/* Row i's probabilities in place over p[0 .. jend) (zero past its key end and where masked);
 * returns the log-sum-exp of its scaled scores, +inf for a row with no allowed key. */
static float softmax_row(const Shape *s, float *restrict p, const uint8_t *restrict m,
                         int64_t kend, int64_t jend) {
    const float scale = s->scale;
    float mx = -INFINITY;
    if (m) {
#pragma omp simd reduction(max : mx)
        for (int64_t j = 0; j < kend; j++) {
            const float x = m[j] ? p[j] * scale : -INFINITY;
            p[j] = x;
            mx = x > mx ? x : mx;
        }
    } else {
#pragma omp simd reduction(max : mx)
        for (int64_t j = 0; j < kend; j++) {
            p[j] *= scale;
            mx = p[j] > mx ? p[j] : mx;
        }
    }
    for (int64_t j = kend; j < jend; j++) p[j] = 0.0f;
    if (mx == -INFINITY) {
        for (int64_t j = 0; j < kend; j++) p[j] = 0.0f;
        return INFINITY;
    }
    return mx + logf(softmax_from_max(p, kend, mx));
}

/* The backward's row i: p (the scores) becomes P = exp(scale s - lse) (zero where masked and
 * past the key end), ds (dP = dO v^T) becomes dS = P (dP - delta) scale, over [0, jend). */
static void grad_row(const Shape *s, float *restrict p, float *restrict ds,
                     const uint8_t *restrict m, int64_t kend, int64_t jend, float lse,
                     float delta) {
    const float scale = s->scale;
    if (m) {
#pragma omp simd
        for (int64_t j = 0; j < kend; j++)
            p[j] = m[j] ? exp_nonpositive(p[j] * scale - lse) : 0.0f;
    } else {
#pragma omp simd
        for (int64_t j = 0; j < kend; j++) p[j] = exp_nonpositive(p[j] * scale - lse);
    }
    for (int64_t j = kend; j < jend; j++) p[j] = 0.0f;
#pragma omp simd
    for (int64_t j = 0; j < jend; j++) ds[j] = p[j] * (ds[j] - delta) * scale;
}

/* Output rows i0 .. i0 + R (row stride ldo) of the block product P x (the rows past Lq are
 * dropped via tmp). */
static void block_out(const Shape *s, const float *p, const float *x, int64_t ldx,
                      const int64_t *kend, int64_t i0, float *o, int64_t ldo, float *tmp) {
    const int64_t D = s->D, rows = s->Lq - i0 < R ? s->Lq - i0 : R;
    if (rows == R) {
        rows_times(D, p, s->Lkp, x, ldx, kend, o, ldo);
    } else {
        rows_times(D, p, s->Lkp, x, ldx, kend, tmp, D);
        for (int64_t i = 0; i < rows; i++)
            memcpy(o + i * ldo, tmp + i * D, (size_t)D * sizeof(float));
    }
}

#define QC (8 * R) /* query rows whose dK, dV contributions are summed in one pass */

/* Floats of one thread's scratch: the forward's (keys transposed, a block's probabilities, a
 * partial query block) and the backward's (keys and values transposed, their gradient sums, a
 * chunk's P and dS, three partial blocks). */
static int64_t fwd_scratch(int64_t D, int64_t Lkp) { return D * Lkp + R * Lkp + R * D; }
static int64_t bwd_scratch(int64_t D, int64_t Lkp) { return 4 * D * Lkp + 2 * QC * Lkp + 3 * R * D; }

/* Bytes of one thread's scratch for Lk keys of width D, the larger pass's (rlvr.attention
 * sends keys to SDPA past its budget). */
int64_t rlvr_attention_scratch_bytes(int64_t Lk, int64_t D) {
    const int64_t f = fwd_scratch(D, padded(Lk)), b = bwd_scratch(D, padded(Lk));
    return (f > b ? f : b) * (int64_t)sizeof(float);
}

/* A thread's scratch, or NULL with *failed set (the caller skips its tasks). */
static float *thread_scratch(int64_t floats, int *failed) {
    float *p = malloc((size_t)floats * sizeof(float));
    if (!p) {
#pragma omp atomic write
        *failed = 1;
    }
    return p;
}

/* Returns 0, or -1 where scratch memory could not be had. */
int rlvr_attention_fwd(const float *q, const float *k, const float *v, const uint8_t *mask,
                       const int64_t *dims, const int64_t *strides, int causal, float scale,
                       float *out, float *lse, int threads) {
    const Shape s = shape_of(dims, strides, mask, causal, scale);
    const int64_t D = s.D, r = s.Hq / s.Hkv, *st = strides;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        float *kt = thread_scratch(fwd_scratch(D, s.Lkp), &failed);
        float *p = kt + D * s.Lkp, *tmp = p + R * s.Lkp;
        int64_t kend[R], lda;
        const float *a;
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < s.B * s.Hkv; task++) {
            if (!kt) continue;
            const int64_t b = task / s.Hkv, g = task % s.Hkv;
            transpose_keys(&s, k + b * st[3] + g * st[4], st[5], kt);
            const float *vg = v + b * st[6] + g * st[7];
            for (int64_t h = g * r; h < (g + 1) * r; h++) {
                const float *qh = q + b * st[0] + h * st[1];
                float *lse_h = lse + (b * s.Hq + h) * s.Lq;
                for (int64_t i0 = 0; i0 < s.Lq; i0 += R) {
                    const int64_t kmax = load_block(&s, qh, st[2], b, h, i0, tmp, kend, &a, &lda);
                    const int64_t jend = padded(kmax);
                    if (kmax > 0) scores(a, lda, kt, s.Lkp, D, jend, p);
                    for (int i = 0; i < R && i0 + i < s.Lq; i++)
                        lse_h[i0 + i] = kmax > 0 ? softmax_row(&s, p + i * s.Lkp,
                                                               mask_row(&s, b, h, i0 + i),
                                                               kend[i], jend)
                                                 : INFINITY;
                    block_out(&s, p, vg, st[8], kend, i0, out + ((b * s.Lq + i0) * s.Hq + h) * D,
                              s.Hq * D, tmp);
                }
            }
        }
        free(kt);
    }
    return failed ? -1 : 0;
}

int rlvr_attention_bwd(const float *q, const float *k, const float *v, const uint8_t *mask,
                       const int64_t *dims, const int64_t *strides, int causal, float scale,
                       const float *out, const float *dout, const float *lse, float *dq,
                       float *dk, float *dv, int threads) {
    const Shape s = shape_of(dims, strides, mask, causal, scale);
    const int64_t D = s.D, Lkp = s.Lkp, r = s.Hq / s.Hkv, *st = strides, ld = s.Hq * D;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        float *kt = thread_scratch(bwd_scratch(D, Lkp), &failed);
        float *vt = kt + D * Lkp, *dka = vt + D * Lkp, *dva = dka + Lkp * D;
        float *pc = dva + Lkp * D, *dsc = pc + QC * Lkp, *qtmp = dsc + QC * Lkp;
        float *dtmp = qtmp + R * D, *otmp = dtmp + R * D, delta[R];
        int64_t kend[QC], lda, ldd;
        const float *a, *da;
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < s.B * s.Hkv; task++) {
            if (!kt) continue;
            const int64_t b = task / s.Hkv, g = task % s.Hkv;
            const float *kg = k + b * st[3] + g * st[4], *vg = v + b * st[6] + g * st[7];
            transpose_keys(&s, kg, st[5], kt);
            transpose_keys(&s, vg, st[8], vt);
            memset(dka, 0, (size_t)(2 * Lkp * D) * sizeof(float)); /* dka and dva */
            for (int64_t h = g * r; h < (g + 1) * r; h++) {
                const float *qh = q + b * st[0] + h * st[1], *lse_h = lse + (b * s.Hq + h) * s.Lq;
                const float *dout_h = dout + (b * s.Lq * s.Hq + h) * D;
                for (int64_t c0 = 0; c0 < s.Lq; c0 += QC) {
                    const int64_t nc = s.Lq - c0 < QC ? s.Lq - c0 : QC;
                    int64_t jend_c = 0;
                    for (int64_t i0 = c0; i0 < c0 + nc; i0 += R) {
                        int64_t *ke = kend + (i0 - c0);
                        float *p = pc + (i0 - c0) * Lkp, *ds = dsc + (i0 - c0) * Lkp;
                        float *dq_h = dq + ((b * s.Hq + h) * s.Lq + i0) * D;
                        const int64_t kmax = load_block(&s, qh, st[2], b, h, i0, qtmp, ke, &a, &lda);
                        const int64_t jend = padded(kmax);
                        jend_c = jend > jend_c ? jend : jend_c;
                        if (kmax == 0) { /* rows with no key: dq 0, and no dK, dV terms */
                            const int64_t rows = s.Lq - i0 < R ? s.Lq - i0 : R;
                            memset(dq_h, 0, (size_t)(rows * D) * sizeof(float));
                            continue;
                        }
                        load_block(&s, dout_h, ld, b, h, i0, dtmp, NULL, &da, &ldd);
                        for (int i = 0; i < R; i++) {
                            float d = 0.0f;
                            if (i0 + i < s.Lq) {
                                const float *gi = dout_h + (i0 + i) * ld, *oi = out + (gi - dout);
#pragma omp simd reduction(+ : d)
                                for (int64_t c = 0; c < D; c++) d += gi[c] * oi[c];
                            }
                            delta[i] = d;
                        }
                        scores(a, lda, kt, Lkp, D, jend, p);   /* s = q k^T, then P */
                        scores(da, ldd, vt, Lkp, D, jend, ds); /* dP = dO v^T, then dS */
                        for (int i = 0; i < R; i++) {
                            const int live = i0 + i < s.Lq;
                            grad_row(&s, p + i * Lkp, ds + i * Lkp,
                                     live ? mask_row(&s, b, h, i0 + i) : NULL, ke[i], jend,
                                     live ? lse_h[i0 + i] : INFINITY, delta[i]);
                        }
                        block_out(&s, ds, kg, st[5], ke, i0, dq_h, D, otmp);
                    }
                    /* dK += dS^T q and dV += P^T dO over the chunk's rows, read in place */
                    accum_t(D, dsc, Lkp, qh + c0 * st[2], st[2], nc, kend, jend_c, dka);
                    accum_t(D, pc, Lkp, dout_h + c0 * ld, ld, nc, kend, jend_c, dva);
                }
            }
            float *dk_g = dk + (b * s.Hkv + g) * s.Lk * D, *dv_g = dv + (b * s.Hkv + g) * s.Lk * D;
            memcpy(dk_g, dka, (size_t)(s.Lk * D) * sizeof(float));
            memcpy(dv_g, dva, (size_t)(s.Lk * D) * sizeof(float));
        }
        free(kt);
    }
    return failed ? -1 : 0;
}
