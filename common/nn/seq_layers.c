/* seq_layers.c — CPU kernels for embedding, LayerNorm, causal attention and GELU (see
 * seq_layers.h).
 *
 * DESIGN: float arithmetic throughout (as the trainer's other kernels and llm.c), sums in
 * a fixed order. Attention is computed one (sequence, head) pair at a time with pst_sgemm:
 * the pair's scores Q K^T in a (T, T) matrix, the softmax and the causal mask in one pass
 * over each row (masked entries become 0), then P V; from 64 positions each product is two
 * at the causal cut, so the masked quarter is not computed (causal_gemm). The backward
 * takes P from the forward where the caller kept it (a (T, T) matrix per pair: a product
 * and the exponentials less), else recomputes it from the scores and the saved
 * log-sum-exp, as flash attention does, in a scratch that lives for one pair only. The
 * element loops are built for AVX-512, AVX2 and the baseline (PST_BIT_EXACT_CLONES): the
 * same bits on each, and GELU alone took 12% of a GPT step in SSE2 (docs/benchmarks.md,
 * 2026-11-27 14:10 UTC). */
#include "common/nn/seq_layers.h"

#include "common/dtype.h"
#include "common/nn/gemm.h"

#include <math.h>
#include <string.h>

/* Sums over a row in 16 interleaved partial sums (element j into lane j % 16, GCC's vector
 * type: one AVX-512 register, two AVX2 ones, four SSE2 ones, the same element-wise adds in
 * each), added at the end by halves: a fixed order, so the same bits in every clone. A
 * single running sum is one add after another, each waiting on the last: LayerNorm's and
 * the softmax's sums were latency-bound at a fraction of the vector units' rate. */
#define LANES 16
typedef float lanes_f __attribute__((vector_size(LANES * sizeof(float))));
typedef int32_t lanes_i __attribute__((vector_size(LANES * sizeof(int32_t))));

/* The 16 floats at p as a vector (no alignment needed). A macro: a function passing or
 * returning this type would have another ABI in each clone. */
#define LANES_AT(v, p) memcpy(&(v), (p), sizeof(lanes_f))

/* Halves of a lanes vector, for the horizontal steps below: one shuffle and one vector op
 * each, where a loop over an array went through memory one float at a time. */
typedef float half_f __attribute__((vector_size(LANES / 2 * sizeof(float))));
typedef float quarter_f __attribute__((vector_size(LANES / 4 * sizeof(float))));
typedef float eighth_f __attribute__((vector_size(LANES / 8 * sizeof(float))));
typedef int32_t half_i __attribute__((vector_size(LANES / 2 * sizeof(int32_t))));
typedef int32_t quarter_i __attribute__((vector_size(LANES / 4 * sizeof(int32_t))));
typedef int32_t eighth_i __attribute__((vector_size(LANES / 8 * sizeof(int32_t))));
#define LANES_LO(v) __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7)
#define LANES_HI(v) __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15)

/* The lanes added by halves: lane k plus lane k + 8, then k + 4, k + 2, k + 1. */
static inline float lanes_total(const lanes_f *acc)
{
    const half_f a = LANES_LO(*acc) + LANES_HI(*acc);
    const quarter_f b = __builtin_shufflevector(a, a, 0, 1, 2, 3) +
                        __builtin_shufflevector(a, a, 4, 5, 6, 7);
    const eighth_f c = __builtin_shufflevector(b, b, 0, 1) + __builtin_shufflevector(b, b, 2, 3);
    return c[0] + c[1];
}

/* x[0] + ... + x[n-1] in lanes. */
static inline float lanes_sum(const float *x, int n)
{
    lanes_f acc = {0};
    int j = 0;
    for (; j + LANES <= n; j += LANES) {
        lanes_f v;
        LANES_AT(v, x + j);
        acc += v;
    }
    for (int k = 0; j + k < n; k++)
        acc[k] += x[j + k];
    return lanes_total(&acc);
}

/* The sum of (x[j] - m)^2 over j < n, in lanes. */
static inline float lanes_sq_dev(const float *x, float m, int n)
{
    lanes_f acc = {0};
    int j = 0;
    for (; j + LANES <= n; j += LANES) {
        lanes_f v;
        LANES_AT(v, x + j);
        v -= m;
        acc += v * v;
    }
    for (int k = 0; j + k < n; k++) {
        const float d = x[j + k] - m;
        acc[k] += d * d;
    }
    return lanes_total(&acc);
}

/* x[0] y[0] + ... + x[n-1] y[n-1] in lanes. */
static inline float lanes_dot(const float *x, const float *y, int n)
{
    lanes_f acc = {0};
    int j = 0;
    for (; j + LANES <= n; j += LANES) {
        lanes_f a, b;
        LANES_AT(a, x + j);
        LANES_AT(b, y + j);
        acc += a * b;
    }
    for (int k = 0; j + k < n; k++)
        acc[k] += x[j + k] * y[j + k];
    return lanes_total(&acc);
}

/* b where b > a, else a, lane by lane (a NaN in b passed over); I: the int vector of a's
 * width. */
#define LANES_MAX(a, b, I) ((__typeof__(a))(((I)(b) & (I)((b) > (a))) | ((I)(a) & ~(I)((b) > (a)))))

/* The largest of x[0..n-1] (-inf for none; a maximum is the same in any order, and a NaN
 * is passed over as by a running maximum from -inf). x is readable up to end >= n: whole
 * vectors run to there, their lanes past n taken as -inf, so no scalar tail is left where
 * end is a multiple of LANES (lanes_end). */
static inline float lanes_max(const float *x, int n, int end)
{
    lanes_f acc, lane;
    for (int k = 0; k < LANES; k++) {
        acc[k] = -INFINITY;
        lane[k] = (float)k;
    }
    int j = 0;
    for (; j + LANES <= end; j += LANES) {
        lanes_f v;
        LANES_AT(v, x + j);
        const lanes_i in = lane + (float)j < (float)n;
        v = (lanes_f)(((lanes_i)v & in) | ((lanes_i)acc & ~in));
        acc = LANES_MAX(acc, v, lanes_i);
    }
    for (int k = 0; j + k < n; k++)
        acc[k] = x[j + k] > acc[k] ? x[j + k] : acc[k];
    const half_f a = LANES_MAX(LANES_LO(acc), LANES_HI(acc), half_i);
    const quarter_f b = LANES_MAX(__builtin_shufflevector(a, a, 0, 1, 2, 3),
                                  __builtin_shufflevector(a, a, 4, 5, 6, 7), quarter_i);
    const eighth_f c = LANES_MAX(__builtin_shufflevector(b, b, 0, 1),
                                 __builtin_shufflevector(b, b, 2, 3), eighth_i);
    return c[1] > c[0] ? c[1] : c[0];
}

PST_BIT_EXACT_CLONES
void pst_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                           int B, int T, int C, int c0, int c1)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *o = out + ((int64_t)b * T + t) * C;
            const float *e = wte + (int64_t)tokens[(int64_t)b * T + t] * C;
            const float *p = wpe + (int64_t)t * C;
            for (int c = c0; c < c1; c++)
                o[c] = e[c] + p[c];
        }
}

PST_BIT_EXACT_CLONES
void pst_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                            int B, int T, int C, int V, int accumulate, int c0, int c1)
{
    if (c1 <= c0)
        return;
    if (!accumulate) {
        for (int v = 0; dwte && v < V; v++)
            memset(dwte + (int64_t)v * C + c0, 0, sizeof(float) * (size_t)(c1 - c0));
        for (int t = 0; dwpe && t < T; t++)
            memset(dwpe + (int64_t)t * C + c0, 0, sizeof(float) * (size_t)(c1 - c0));
    }
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *d = dout + ((int64_t)b * T + t) * C;
            if (dwte) {
                float *e = dwte + (int64_t)tokens[(int64_t)b * T + t] * C;
                for (int c = c0; c < c1; c++)
                    e[c] += d[c];
            }
            if (dwpe) {
                float *p = dwpe + (int64_t)t * C;
                for (int c = c0; c < c1; c++)
                    p[c] += d[c];
            }
        }
}

PST_BIT_EXACT_CLONES
void pst_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                           const float *w, const float *b, int N, int C, int r0, int r1)
{
    (void)N;
    for (int r = r0; r < r1; r++) {
        const float *x = inp + (int64_t)r * C;
        const float m = lanes_sum(x, C) / (float)C;
        const float v = lanes_sq_dev(x, m, C) / (float)C;
        const float s = 1.0f / sqrtf(v + PST_LN_EPS);
        float *o = out + (int64_t)r * C;
        for (int c = 0; c < C; c++)
            o[c] = (x[c] - m) * s * w[c] + b[c];
        if (mean)
            mean[r] = m;
        if (rstd)
            rstd[r] = s;
    }
}

PST_BIT_EXACT_CLONES
void pst_layernorm_backward_input(float *dinp, const float *dout, const float *inp,
                                  const float *w, const float *mean, const float *rstd, int N,
                                  int C, const float *res, int r0, int r1)
{
    (void)N;
    for (int r = r0; r < r1; r++) {
        const float *x = inp + (int64_t)r * C, *d = dout + (int64_t)r * C;
        const float m = mean[r], s = rstd[r];
        /* the means of dnorm and of dnorm * norm, with dnorm = w * dout, in lanes */
        lanes_f am = {0}, anm = {0};
        int c = 0;
        for (; c + LANES <= C; c += LANES) {
            lanes_f norm, dnorm, dv;
            LANES_AT(norm, x + c);
            LANES_AT(dnorm, w + c);
            LANES_AT(dv, d + c);
            norm = (norm - m) * s;
            dnorm *= dv;
            am += dnorm;
            anm += dnorm * norm;
        }
        for (int k = 0; c + k < C; k++) {
            const float norm = (x[c + k] - m) * s, dnorm = w[c + k] * d[c + k];
            am[k] += dnorm;
            anm[k] += dnorm * norm;
        }
        const float dm = lanes_total(&am) / (float)C, dnm = lanes_total(&anm) / (float)C;
        float *di = dinp + (int64_t)r * C;
        const float *re = res ? res + (int64_t)r * C : NULL;
        for (int c = 0; c < C; c++) {
            float norm = (x[c] - m) * s, dnorm = w[c] * d[c];
            float g = (dnorm - dm - norm * dnm) * s;
            di[c] = re ? re[c] + g : g;
        }
    }
}

PST_BIT_EXACT_CLONES
void pst_layernorm_backward_params(float *dw, float *db, const float *dout, const float *inp,
                                   const float *mean, const float *rstd, int N, int C,
                                   int accumulate, int c0, int c1)
{
    if (c1 <= c0)
        return;
    if (!accumulate) {
        memset(dw + c0, 0, sizeof(float) * (size_t)(c1 - c0));
        memset(db + c0, 0, sizeof(float) * (size_t)(c1 - c0));
    }
    for (int r = 0; r < N; r++) {
        const float *x = inp + (int64_t)r * C, *d = dout + (int64_t)r * C;
        const float m = mean[r], s = rstd[r];
        for (int c = c0; c < c1; c++) {
            db[c] += d[c];
            dw[c] += (x[c] - m) * s * d[c];
        }
    }
}

/* The attention's and GELU's loops: no-trapping-math lets GCC if-convert the selects next to a
 * division and a float-to-int conversion (it changes no value); the dynamic cost model
 * vectorizes loops of unknown length. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("vect-cost-model=dynamic", "no-trapping-math")
#endif

/* e^x = 2^n (1 + q) for |x| <= 87, in float arithmetic that vectorizes: n = round(x / ln 2)
 * (by the 1.5 * 2^23 trick: SSE2 has no vector rint), r = x - n ln 2 in two parts
 * (|r| <= ln2/2), q = e^r - 1 by its Taylor series to r^8 (relative error below 1e-9).
 * Returns 2^n (from the exponent bits) and sets *q. */
static inline float exp_split(float x, float *q_out)
{
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const float r = (x - n * 0.693145751953125f) - n * 1.428606765330187e-06f;
    float q = 1.0f / 40320.0f;
    q = q * r + 1.0f / 5040.0f;
    q = q * r + 1.0f / 720.0f;
    q = q * r + 1.0f / 120.0f;
    q = q * r + 1.0f / 24.0f;
    q = q * r + 1.0f / 6.0f;
    q = q * r + 0.5f;
    q = q * r + 1.0f;
    *q_out = q * r;
    const int32_t bits = (int32_t)(n + 127.0f) << 23; /* -126 <= n <= 126 */
    float s2;
    memcpy(&s2, &bits, sizeof s2);
    return s2;
}

/* tanh (glibc's tanhf is a scalar call and was most of a GPT step's time): tanh a =
 * m / (m + 2) with m = e^{2a} - 1 = 2^n q + (2^n - 1), a = |u| (the sign put back; above 9,
 * tanh is 1 in float): no cancellation near 0. Measured (AMD EPYC, OPENBLAS_CORETYPE unset;
 * the function is plain float arithmetic, so any IEEE machine gives the same) against
 * double tanh over [-12, 12] in steps of 1e-5: relative error at most 1.9e-7 (about 3 float
 * ulps), absolute at most 9e-8.
 */
static inline float tanh_f(float u)
{
    const float au = fabsf(u), a = au < 9.0f ? au : 9.0f;
    float q;
    const float s2 = exp_split(2.0f * a, &q);
    const float m = s2 * q + (s2 - 1.0f);
    const float t = m / (m + 2.0f);
    return u < 0.0f ? -t : t;
}

/* e^x for x <= 0 (a softmax's shifted scores; below -87 the result is 0, where
 * e^x < 2e-38). Measured (same machine) against double exp over (-87, 0] in steps of 1e-5:
 * relative error at most 9.7e-8 (1.6 ulps).
 */
static inline float exp_neg_f(float x)
{
    float q;
    const float s2 = exp_split(x > -87.0f ? x : -87.0f, &q);
    return x > -87.0f ? s2 * q + s2 : 0.0f;
}

/* Where a causal row of n visible entries ends for the vector loops: n rounded up to whole
 * vectors (at most T). The loops run to there without a scalar tail, the entries past n
 * computed as 0; a lane sum over them adds zeros, so it has the bits of one over n. */
static inline int lanes_end(int n, int T)
{
    const int nv = (n + LANES - 1) / LANES * LANES;
    return nv < T ? nv : T;
}

/* The causal cut of T rows: rows (queries) [0, cut) see only keys [0, cut), so their GEMMs
 * stop there, and the products of a pair skip a quarter of the (T, T) work, nearly all of it
 * masked. A whole number of vectors (lanes_end reads no further), T itself for short rows.
 * The products it drops are of zeros that would be added last (rows [0, cut)) or first
 * (keys [cut, T), from +0): where the GEMM sums each element in k order whatever the
 * shape (OpenBLAS) the bits are those of the whole products; oneDNN's kernels for the
 * smaller shapes sum in another order, so there they change (gemm.h: the library is part
 * of the arithmetic). */
static inline int causal_cut(int T)
{
    return T >= 4 * LANES ? (T / 2 + LANES - 1) / LANES * LANES : T;
}

/* The products of a causal pair, each in two at the cut; every matrix is row-major with
 * T rows of queries or keys, and hs the head's width (pst_sgemm's arguments otherwise):
 *   PST_CAUSAL_SCORES  C (T, T)  = alpha A (T, hs) @ B^T: rows [0, cut) over keys [0, cut)
 *   PST_CAUSAL_MIX     C (T, hs) = A (T, T) @ B (T, hs): rows [0, cut) over keys [0, cut)
 *   PST_CAUSAL_BACK    C (T, hs) = A^T (T, T) @ B (T, hs), C's rows the keys: keys [cut, T)
 *                      over the queries [cut, T) that see them */
enum { PST_CAUSAL_SCORES, PST_CAUSAL_MIX, PST_CAUSAL_BACK };

static void causal_gemm(int kind, int T, int hs, float alpha, const float *A, int lda,
                        const float *B, int ldb, float *C, int ldc)
{
    const int cut = causal_cut(T);
    const int64_t a2 = (int64_t)cut * lda, b2 = (int64_t)cut * ldb, c2 = (int64_t)cut * ldc;
    switch (kind) {
    case PST_CAUSAL_SCORES:
        pst_sgemm(0, 1, cut, cut, hs, alpha, A, lda, B, ldb, 0.0f, C, ldc);
        if (cut < T)
            pst_sgemm(0, 1, T - cut, T, hs, alpha, A + a2, lda, B, ldb, 0.0f, C + c2, ldc);
        break;
    case PST_CAUSAL_MIX:
        pst_sgemm(0, 0, cut, hs, cut, alpha, A, lda, B, ldb, 0.0f, C, ldc);
        if (cut < T)
            pst_sgemm(0, 0, T - cut, hs, T, alpha, A + a2, lda, B, ldb, 0.0f, C + c2, ldc);
        break;
    default:
        pst_sgemm(1, 0, cut, hs, T, alpha, A, lda, B, ldb, 0.0f, C, ldc);
        if (cut < T)
            pst_sgemm(1, 0, T - cut, hs, T - cut, alpha, A + a2 + cut, lda, B + b2, ldb, 0.0f,
                      C + c2, ldc);
    }
}

/* One (sequence, head) pair: S = scale * Q K^T into S ((T, T): the pair's kept
 * probabilities or the scratch), the softmax of each row over its visible keys j <= t
 * (masked entries set to 0) in place, then Y = P V; both products stop at the causal cut. */
PST_BIT_EXACT_CLONES
static void attention_forward_pair(float *out, float *lse, const float *qkv, int T, int C,
                                   int H, int b, int h, float *S)
{
    const int hs = C / H, C3 = 3 * C, cut = causal_cut(T);
    const float scale = 1.0f / sqrtf((float)hs);
    const float *base = qkv + (int64_t)b * T * C3;
    const float *Q = base + h * hs, *K = base + C + h * hs, *Vv = base + 2 * C + h * hs;
    causal_gemm(PST_CAUSAL_SCORES, T, hs, scale, Q, C3, K, C3, S, T);
    float *l = lse + ((int64_t)b * H + h) * T;
    for (int t = 0; t < T; t++) {
        float *row = S + (int64_t)t * T;
        const int n = t + 1, nv = lanes_end(n, T), end = t < cut ? cut : T;
        const float m = lanes_max(row, n, nv);
        for (int j = 0; j < nv; j++) {
            const float e = exp_neg_f(j < n ? row[j] - m : 0.0f);
            row[j] = j < n ? e : 0.0f;
        }
        const float sum = lanes_sum(row, nv); /* the zeros add nothing: the bits of n's */
        const float inv = 1.0f / sum;
        for (int j = 0; j < nv; j++)
            row[j] *= inv;
        for (int j = nv; j < end; j++) /* what the products read */
            row[j] = 0.0f;
        l[t] = m + logf(sum);
    }
    causal_gemm(PST_CAUSAL_MIX, T, hs, 1.0f, S, T, Vv, C3, out + (int64_t)b * T * C + h * hs,
                C);
}

void pst_attention_forward(float *out, float *lse, float *probs, const float *qkv, int B, int T,
                           int C, int H, float *scratch, int bh0, int bh1)
{
    (void)B; /* pairs are given by [bh0, bh1) */
    for (int bh = bh0; bh < bh1; bh++)
        attention_forward_pair(out, lse, qkv, T, C, H, bh / H, bh % H,
                               probs ? probs + (int64_t)bh * T * T : scratch);
}

/* One pair: P kept from the forward (kept), else recomputed into P from S = scale * Q K^T
 * and the saved log-sum-exp; dP = dY V^T; dS = P * (dP - D) * scale with
 * D_t = sum_j P_tj dP_tj; then dQ = dS K, dK = dS^T Q, dV = P^T dY, each writing its head's
 * columns of dqkv; every product stops at the causal cut. */
PST_BIT_EXACT_CLONES
static void attention_backward_pair(float *dqkv, const float *dout, const float *qkv,
                                    const float *lse, const float *kept, int T, int C, int H,
                                    int b, int h, float *P, float *dP)
{
    const int hs = C / H, C3 = 3 * C, cut = causal_cut(T);
    const float scale = 1.0f / sqrtf((float)hs);
    const float *base = qkv + (int64_t)b * T * C3;
    const float *Q = base + h * hs, *K = base + C + h * hs, *Vv = base + 2 * C + h * hs;
    const float *dY = dout + (int64_t)b * T * C + h * hs;
    float *dbase = dqkv + (int64_t)b * T * C3;
    const float *l = lse + ((int64_t)b * H + h) * T;
    const float *Pr = kept ? kept : P; /* the probabilities the products below read */
    if (!kept)
        causal_gemm(PST_CAUSAL_SCORES, T, hs, scale, Q, C3, K, C3, P, T);
    causal_gemm(PST_CAUSAL_SCORES, T, hs, 1.0f, dY, C, Vv, C3, dP, T);
    for (int t = 0; t < T; t++) {
        float *dp = dP + (int64_t)t * T;
        const int n = t + 1, nv = lanes_end(n, T), end = t < cut ? cut : T;
        if (!kept) {
            float *p = P + (int64_t)t * T;
            for (int j = 0; j < nv; j++) {
                const float e = exp_neg_f(j < n ? p[j] - l[t] : 0.0f);
                p[j] = j < n ? e : 0.0f;
            }
            for (int j = nv; j < end; j++) /* what the products below read */
                p[j] = 0.0f;
        }
        const float *p = Pr + (int64_t)t * T;
        for (int j = 0; j < nv; j++)
            dp[j] = j < n ? dp[j] : 0.0f;
        const float D = lanes_dot(p, dp, nv); /* 0 x 0 adds nothing: the bits of n's */
        for (int j = 0; j < nv; j++)
            dp[j] = j < n ? p[j] * (dp[j] - D) * scale : 0.0f;
        for (int j = nv; j < end; j++)
            dp[j] = 0.0f;
    }
    causal_gemm(PST_CAUSAL_MIX, T, hs, 1.0f, dP, T, K, C3, dbase + h * hs, C3);
    causal_gemm(PST_CAUSAL_BACK, T, hs, 1.0f, dP, T, Q, C3, dbase + C + h * hs, C3);
    causal_gemm(PST_CAUSAL_BACK, T, hs, 1.0f, Pr, T, dY, C, dbase + 2 * C + h * hs, C3);
}

void pst_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *lse,
                            const float *probs, int B, int T, int C, int H, float *scratch,
                            int bh0, int bh1)
{
    (void)B;
    for (int bh = bh0; bh < bh1; bh++)
        attention_backward_pair(dqkv, dout, qkv, lse, probs ? probs + (int64_t)bh * T * T : NULL,
                                T, C, H, bh / H, bh % H, scratch, scratch + (int64_t)T * T);
}

#define GELU_S 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_K 0.044715f

/* tanh(u(x)), u = sqrt(2/pi) (x + 0.044715 x^3): the one expression every GELU loop uses */
static inline float gelu_th(float x)
{
    return tanh_f(GELU_S * (x + GELU_K * x * x * x));
}

/* gelu'(x) from x and th = tanh(u(x)): one expression for both backward paths, so the
 * derivative the forward keeps has the bits the backward would compute. */
static inline float gelu_deriv(float x, float th)
{
    const float sech2 = 1.0f - th * th;
    return 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_S * (1.0f + 3.0f * GELU_K * x * x);
}

/* The one forward loop: out = gelu(inp (+ bias)), and deriv = gelu' of the same where set.
 * Inlined into each kernel below with its constant NULLs, so each gets its own loop. */
static inline void gelu_fwd_span(float *out, float *deriv, const float *inp,
                                 const float *bias, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        const float x = bias ? inp[i] + bias[i] : inp[i];
        const float th = gelu_th(x);
        out[i] = 0.5f * x * (1.0f + th);
        if (deriv)
            deriv[i] = gelu_deriv(x, th);
    }
}

PST_BIT_EXACT_CLONES
void pst_gelu_forward(float *out, const float *inp, int64_t n)
{
    gelu_fwd_span(out, NULL, inp, NULL, n);
}

PST_BIT_EXACT_CLONES
void pst_gelu_forward_deriv(float *out, float *deriv, const float *inp, int64_t n)
{
    gelu_fwd_span(out, deriv, inp, NULL, n);
}

PST_BIT_EXACT_CLONES
void pst_gelu_forward_bias(float *out, float *deriv, const float *inp, const float *bias,
                           int64_t rows, int width)
{
    for (int64_t r = 0; r < rows; r++) {
        const int64_t at = r * width;
        if (deriv)
            gelu_fwd_span(out + at, deriv + at, inp + at, bias, width);
        else
            gelu_fwd_span(out + at, NULL, inp + at, bias, width);
    }
}

PST_BIT_EXACT_CLONES
void pst_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        const float x = inp[i];
        dinp[i] = gelu_deriv(x, gelu_th(x)) * dout[i];
    }
}

PST_BIT_EXACT_CLONES
void pst_gelu_backward_deriv(float *dinp, const float *deriv, const float *dout, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        dinp[i] = deriv[i] * dout[i];
}

PST_BIT_EXACT_CLONES
void pst_gelu_backward_dbias(float *dinp, float *dbias, const float *deriv, const float *dout,
                             int64_t rows, int width, int accumulate, int j0, int j1)
{
    if (j1 <= j0)
        return;
    if (!accumulate)
        memset(dbias + j0, 0, sizeof(float) * (size_t)(j1 - j0));
    for (int64_t r = 0; r < rows; r++) {
        const int64_t at = r * width;
        for (int j = j0; j < j1; j++) {
            const float g = deriv[at + j] * dout[at + j];
            dinp[at + j] = g;
            dbias[j] += g;
        }
    }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
