/* One decoding step of attention over a prompt prefix stored once per group plus each row's
 * own generated tokens (rlvr.cpu.prefix_attention holds the reference in torch ops).
 *
 * Eager torch spends this step in ~20 small ops (batched matmuls of one query row, softmax,
 * regrouping copies); here it is one pass per (row, query head), parallel over both:
 *
 *   s_j = q . k_j * scale + bias_j    over the prompt's P keys, then the row's own t keys
 *   out = sum_j softmax(s)_j v_j
 *
 * Built at first use by rlvr.cpu.native with the system C compiler; no -ffast-math (it
 * would flush denormals process-wide and drop -inf handling), so the exponential (common.h) is
 * a branch-free polynomial the compiler can vectorise. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "common.h"

/* The helpers below are always inlined into `attend`, whose variants for the common head
 * sizes (attend_32/64/128) see D as a constant: the dot products and the output row are then
 * fully unrolled and the output accumulates in registers (measured ~12% faster than a runtime
 * D on bench/vs_trl.py's shapes, D = 64; the rest of a call's time is reading the KV cache). */
#define INLINE static inline __attribute__((always_inline))

/* s[j] = (q . k_j) * scale + (bias ? bias[j] : 0) for the `len` keys at k (row stride D);
 * returns max_j s[j]. Four keys per pass, each dot product vectorised over D. */
INLINE float scores(const float *restrict q, const float *restrict k, const float *bias,
                    int64_t len, int64_t D, float scale, float *restrict s) {
    int64_t j = 0;
    for (; j + 4 <= len; j += 4) {
        const float *k0 = k + j * D, *k1 = k0 + D, *k2 = k1 + D, *k3 = k2 + D;
        float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
#pragma omp simd reduction(+ : a0, a1, a2, a3)
        for (int64_t d = 0; d < D; d++) {
            a0 += q[d] * k0[d];
            a1 += q[d] * k1[d];
            a2 += q[d] * k2[d];
            a3 += q[d] * k3[d];
        }
        s[j] = a0 * scale, s[j + 1] = a1 * scale, s[j + 2] = a2 * scale, s[j + 3] = a3 * scale;
    }
    for (; j < len; j++) {
        const float *kj = k + j * D;
        float a = 0.0f;
#pragma omp simd reduction(+ : a)
        for (int64_t d = 0; d < D; d++) a += q[d] * kj[d];
        s[j] = a * scale;
    }
    float m = -INFINITY;
    for (j = 0; j < len; j++) {
        if (bias) s[j] += bias[j];
        m = s[j] > m ? s[j] : m;
    }
    return m;
}

/* o += sum_j w[j] * v_j over `len` values at v (row stride D). */
INLINE void weighted_sum(const float *restrict w, const float *restrict v, int64_t len,
                         int64_t D, float *restrict o) {
    for (int64_t j = 0; j < len; j++) {
        const float wj = w[j], *vj = v + j * D;
#pragma omp simd
        for (int64_t d = 0; d < D; d++) o[d] += wj * vj[d];
    }
}

/* One (row, query head): softmax over [prompt keys | own keys] of q's scores, times values. */
INLINE void attend_body(const float *restrict qi, const float *kpi, const float *vpi,
                        const float *b, int64_t P, const float *koi, const float *voi,
                        int64_t t, int64_t D, float scale, float *restrict s,
                        float *restrict o) {
    const int64_t L = P + t;
    float m = scores(qi, kpi, b, P, D, scale, s);
    float m_own = scores(qi, koi, 0, t, D, scale, s + P);
    m = m_own > m ? m_own : m;
    softmax_from_max(s, L, m);
    for (int64_t d = 0; d < D; d++) o[d] = 0.0f;
    weighted_sum(s, vpi, P, D, o);
    weighted_sum(s + P, voi, t, D, o);
}

#define ATTEND_ARGS                                                                       \
    const float *restrict qi, const float *kpi, const float *vpi, const float *b, int64_t P, \
        const float *koi, const float *voi, int64_t t, int64_t D, float scale,              \
        float *restrict s, float *restrict o
#define ATTEND_FIXED(N)                                                                   \
    static void attend_##N(ATTEND_ARGS) {                                                 \
        float acc[N]; /* the output row, in registers */                                  \
        (void)D;                                                                          \
        attend_body(qi, kpi, vpi, b, P, koi, voi, t, N, scale, s, acc);                   \
        memcpy(o, acc, sizeof acc);                                                       \
    }
ATTEND_FIXED(32)
ATTEND_FIXED(64)
ATTEND_FIXED(128)

static void attend(ATTEND_ARGS) {
    switch (D) {
        case 32: attend_32(qi, kpi, vpi, b, P, koi, voi, t, D, scale, s, o); return;
        case 64: attend_64(qi, kpi, vpi, b, P, koi, voi, t, D, scale, s, o); return;
        case 128: attend_128(qi, kpi, vpi, b, P, koi, voi, t, D, scale, s, o); return;
        default: attend_body(qi, kpi, vpi, b, P, koi, voi, t, D, scale, s, o);
    }
}

/* q, out: (n, Hq, D). Prompt keys/values kp, vp: (U, Hkv, P, D) contiguous; bias: (n, P)
 * additive (0 or -inf); group: (n,) prompt of each row. Own keys/values ko, vo: row r, KV
 * head h, token j at [r * own_row + h * own_head + j * D]. scratch: threads * (P + t). A query
 * head h reads KV head h / (Hq / Hkv). */
void rlvr_prefix_decode_attention(const float *q, int64_t n, int64_t Hq, int64_t Hkv,
                                  int64_t D, const float *kp, const float *vp, int64_t P,
                                  const float *bias, const int64_t *group, const float *ko,
                                  const float *vo, int64_t t, int64_t own_row,
                                  int64_t own_head, float scale, float *out, float *scratch,
                                  int threads) {
    const int64_t per_kv = Hq / Hkv;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < n * Hq; i++) {
        const int64_t row = i / Hq, kv = (i % Hq) / per_kv, u = group[row];
        const int64_t own = row * own_row + kv * own_head, pre = (u * Hkv + kv) * P * D;
        attend(q + i * D, kp + pre, vp + pre, bias + row * P, P, ko + own, vo + own, t, D,
               scale, scratch + omp_get_thread_num() * (P + t), out + i * D);
    }
}

/* x (D) rotated by RoPE into y: y = x * cos + rotate_half(x) * sin, rotate_half(x) =
 * [-x2, x1] (the Llama family's convention; cos and sin hold D entries, halves repeated). */
static inline void rope(const float *restrict x, const float *restrict c,
                        const float *restrict sn, int64_t D, float *restrict y) {
    const int64_t h = D / 2;
#pragma omp simd
    for (int64_t d = 0; d < h; d++) y[d] = x[d] * c[d] - x[d + h] * sn[d];
#pragma omp simd
    for (int64_t d = h; d < D; d++) y[d] = x[d] * c[d] + x[d - h] * sn[d];
}

/* The whole attention half of a decoding step after the q/k/v matmul. qkv: (n, (Hq + 2 Hkv)
 * D), each row [q heads | k heads | v heads]; cos, sin: (n, D). First every row's new key
 * (rotated) and value are written to its own cache at token t - 1; then each (row, query
 * head) rotates its query and attends over the prompt and the row's t own tokens. out:
 * (n, Hq, D); scratch: threads * (P + t + D). */
void rlvr_rope_cache_attention(const float *qkv, const float *cos, const float *sin,
                               int64_t n, int64_t Hq, int64_t Hkv, int64_t D,
                               const float *kp, const float *vp, int64_t P, const float *bias,
                               const int64_t *group, float *ko, float *vo, int64_t t,
                               int64_t own_row, int64_t own_head, float scale, float *out,
                               float *scratch, int threads) {
    const int64_t per_kv = Hq / Hkv, width = (Hq + 2 * Hkv) * D, L = P + t;
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n * Hkv; i++) {
            const int64_t row = i / Hkv, kv = i % Hkv;
            const float *k = qkv + row * width + (Hq + kv) * D, *v = k + Hkv * D;
            float *kd = ko + row * own_row + kv * own_head + (t - 1) * D;
            float *vd = vo + row * own_row + kv * own_head + (t - 1) * D;
            rope(k, cos + row * D, sin + row * D, D, kd);
            memcpy(vd, v, (size_t)D * sizeof(float));
        }  /* implicit barrier: every new key is written before any row attends */
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n * Hq; i++) {
            const int64_t row = i / Hq, h = i % Hq, kv = h / per_kv, u = group[row];
            const int64_t own = row * own_row + kv * own_head, pre = (u * Hkv + kv) * P * D;
            float *s = scratch + omp_get_thread_num() * (L + D), *qr = s + L;
            rope(qkv + row * width + h * D, cos + row * D, sin + row * D, D, qr);
            attend(qr, kp + pre, vp + pre, bias + row * P, P, ko + own, vo + own, t, D, scale,
                   s, out + i * D);
        }
    }
}

/* Categorical sampling from softmax(logits * inv_temp) of n rows over V, by inverse CDF with
 * one uniform u[r] in [0, 1) per row; ids in `suppress` (EOS before min_new_tokens) are
 * excluded from the draw. log_probs[r]: the drawn token's log-probability under the
 * unsuppressed softmax, as the trainer computes it. Sums in double, so that the walk and the
 * total agree far below float rounding. Rows in parallel; scratch: threads * V floats. */
void rlvr_sample(const float *logits, int64_t n, int64_t V, float inv_temp, const float *u,
                 const int64_t *suppress, int64_t n_suppress, int64_t *tokens,
                 float *log_probs, float *scratch, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t r = 0; r < n; r++) {
        const float *l = logits + r * V;
        float *e = scratch + omp_get_thread_num() * V, m = -INFINITY;
        for (int64_t j = 0; j < V; j++) {
            const float s = l[j] * inv_temp;
            m = s > m ? s : m;
        }
#pragma omp simd
        for (int64_t j = 0; j < V; j++) e[j] = exp_nonpositive(l[j] * inv_temp - m);
        double z = 0.0;
#pragma omp simd reduction(+ : z)
        for (int64_t j = 0; j < V; j++) z += e[j];
        const float lse = m + (float)log(z);
        for (int64_t k = 0; k < n_suppress; k++)
            if (suppress[k] >= 0 && suppress[k] < V) e[suppress[k]] = 0.0f;
        double z_choice = 0.0;
#pragma omp simd reduction(+ : z_choice)
        for (int64_t j = 0; j < V; j++) z_choice += e[j];
        const double target = (double)u[r] * z_choice;
        double cum = 0.0;
        int64_t tok = 0;
        for (int64_t j = 0; j < V; j++) {
            if (e[j] == 0.0f) continue;
            tok = j; /* the last allowed id, should rounding leave cum <= target */
            cum += e[j];
            if (cum > target) break;
        }
        tokens[r] = tok;
        log_probs[r] = l[tok] * inv_temp - lse;
    }
}

/* ---- Training: RMSNorm and SiLU-gate with their backward (rlvr.fused) ---- */

/* RMSNorm of n rows of width d, fp32 statistics (the Llama family's norm): y = w * x * r per
 * row, r = 1 / sqrt(mean(x^2) + eps) saved for the backward. The lean decoder calls it with
 * one thread, training with all. */
void rlvr_rms_norm_fwd(const float *x, const float *w, int64_t n, int64_t d, float eps,
                       float *y, float *r, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < n; i++) {
        const float *xi = x + i * d;
        float *yi = y + i * d, ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int64_t j = 0; j < d; j++) ss += xi[j] * xi[j];
        const float ri = 1.0f / sqrtf(ss / (float)d + eps);
        r[i] = ri;
#pragma omp simd
        for (int64_t j = 0; j < d; j++) yi[j] = w[j] * (xi[j] * ri);
    }
}

/* dx = r * (g - x * r^2 * mean(g * x)), g = w * dy; dw = sum over rows of dy * x * r, summed
 * from per-thread partials (dw_part: threads * d, zeroed here). */
void rlvr_rms_norm_bwd(const float *dy, const float *x, const float *w, const float *r,
                       int64_t n, int64_t d, float *dx, float *dw, float *dw_part,
                       int threads) {
    memset(dw_part, 0, (size_t)threads * (size_t)d * sizeof(float));
#pragma omp parallel num_threads(threads)
    {
        float *acc = dw_part + omp_get_thread_num() * d;
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n; i++) {
            const float *dyi = dy + i * d, *xi = x + i * d, ri = r[i];
            float *dxi = dx + i * d, dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int64_t j = 0; j < d; j++) dot += w[j] * dyi[j] * xi[j];
            const float c = ri * ri * dot / (float)d;
#pragma omp simd
            for (int64_t j = 0; j < d; j++) {
                dxi[j] = ri * (w[j] * dyi[j] - xi[j] * c);
                acc[j] += dyi[j] * xi[j] * ri;
            }
        }
    }
    for (int64_t j = 0; j < d; j++) {
        float s = 0.0f;
        for (int t = 0; t < threads; t++) s += dw_part[t * d + j];
        dw[j] = s;
    }
}

#define BLOCK 2048 /* elements per parallel work item */

static void silu_mul_block(const float *restrict g, const float *restrict u, int64_t len,
                           float *restrict y) {
#pragma omp simd
    for (int64_t i = 0; i < len; i++) y[i] = g[i] * sigmoid(g[i]) * u[i];
}

static void silu_mul_grad_block(const float *restrict dy, const float *restrict g,
                                const float *restrict u, int64_t len, float *restrict dg,
                                float *restrict du) {
#pragma omp simd
    for (int64_t i = 0; i < len; i++) {
        const float s = sigmoid(g[i]);
        dg[i] = dy[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
        du[i] = dy[i] * g[i] * s;
    }
}

/* y = silu(g) * u over n elements. */
void rlvr_silu_mul_fwd(const float *g, const float *u, int64_t n, float *y, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t b = 0; b < n; b += BLOCK)
        silu_mul_block(g + b, u + b, (b + BLOCK < n ? b + BLOCK : n) - b, y + b);
}

/* dg = dy * u * silu'(g), silu'(g) = s (1 + g (1 - s)); du = dy * silu(g). */
void rlvr_silu_mul_bwd(const float *dy, const float *g, const float *u, int64_t n, float *dg,
                       float *du, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t b = 0; b < n; b += BLOCK)
        silu_mul_grad_block(dy + b, g + b, u + b, (b + BLOCK < n ? b + BLOCK : n) - b, dg + b,
                            du + b);
}

/* ---- Training: RoPE with its backward (rlvr.fused) ---- */

/* y = x * cos + rotate_half(x) * sin for N token rows of H heads: x, y (N, H, D), cos and sin
 * (N, D) shared by a row's heads. */
void rlvr_rope_fwd(const float *x, const float *c, const float *s, int64_t N, int64_t H,
                   int64_t D, float *y, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < N * H; i++)
        rope(x + i * D, c + (i / H) * D, s + (i / H) * D, D, y + i * D);
}

/* The transpose: dx = dy * cos + rotate_half^T(dy * sin), rotate_half^T(z) = [z2, -z1]. */
void rlvr_rope_bwd(const float *dy, const float *c, const float *s, int64_t N, int64_t H,
                   int64_t D, float *dx, int threads) {
    const int64_t h = D / 2;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < N * H; i++) {
        const float *g = dy + i * D, *ci = c + (i / H) * D, *si = s + (i / H) * D;
        float *o = dx + i * D;
#pragma omp simd
        for (int64_t d = 0; d < h; d++) o[d] = g[d] * ci[d] + g[d + h] * si[d + h];
#pragma omp simd
        for (int64_t d = h; d < D; d++) o[d] = g[d] * ci[d] - g[d - h] * si[d - h];
    }
}
