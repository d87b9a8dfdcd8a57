/* sigmoid_vec.c - the logistic family of activations and a softmax row's
 * exponentials with AVX-512 and AVX2 (sigmoid_vec.h). The exponential is
 * elementwise_util.h's (Cephes' degree-6 polynomial on the same reduction),
 * taken of arguments <= 0 only (-|x|, or x less the row's largest). */
/* The baseline's exponential loop: its clamps become selects and the loop
 * vectorizes without trapping math (as in ops_softmax_fused.c). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

#include "kernels/cpu/sigmoid_vec.h"

#include "kernels/cpu/dnnl_util.h"
#include "kernels/cpu/elementwise_util.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <string.h>

#define V4 __attribute__((target("arch=x86-64-v4")))
#define V3 __attribute__((target("arch=x86-64-v3")))

/* Cephes' coefficients, highest first, then the split of ln 2. */
#define EXP_C0 1.9875691500E-4f
#define EXP_C1 1.3981999507E-3f
#define EXP_C2 8.3334519073E-3f
#define EXP_C3 4.1665795894E-2f
#define EXP_C4 1.6666665459E-1f
#define EXP_C5 5.0000001201E-1f
#define LN2_HI 0.693359375f
#define LN2_LO -2.12194440e-4f
#define LOG2E 1.44269504088896341f
/* below it e^v leaves the normal floats: 0 instead (denormal arithmetic made
 * GELU's tanh form 25% slower with AVX2 on an AMD EPYC) */
#define EXP_MIN -87.33f
/* sqrt(8 / pi) and GELU's cubic term: sigmoid(2u) = (1 + tanh(u)) / 2 */
#define GELU_K 1.59576912160573071176f
#define GELU_C 0.044715f
/* ew_erf_f's [13/8] rational approximation on [-4, 4] */
#define ERF_P0 -2.72614225801306e-10f
#define ERF_P1 2.77068142495902e-08f
#define ERF_P2 -2.10102402082508e-06f
#define ERF_P3 -5.69250639462346e-05f
#define ERF_P4 -7.34990630326855e-04f
#define ERF_P5 -2.95459980854025e-03f
#define ERF_P6 -1.60960333262415e-02f
#define ERF_Q0 -1.45660718464996e-05f
#define ERF_Q1 -2.13374055278905e-04f
#define ERF_Q2 -1.68282697438203e-03f
#define ERF_Q3 -7.37332916720468e-03f
#define ERF_Q4 -1.42647390514189e-02f

/* The arithmetic both widths share, over P(op) (the family's _op_ps
 * intrinsic) and S(c) (a broadcast constant). */

/* e^v's reduction v = n ln2 + r (v clamped to -104, below which e^v is 0
 * in float; NaN passes, max returning its second operand) and Cephes'
 * polynomial: sets p, n. */
#define EXP_POLY(P, S, VT, ROUND, v, p, n)                                                                         \
    VT n = ROUND(P(mul)(P(max)(S(-104.0f), v), S(LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);         \
    VT r_ = P(fnmadd)(n, S(LN2_HI), P(max)(S(-104.0f), v));                                                       \
    r_ = P(fnmadd)(n, S(LN2_LO), r_);                                                                             \
    VT p = P(fmadd)(S(EXP_C0), r_, S(EXP_C1));                                                                    \
    p = P(fmadd)(p, r_, S(EXP_C2));                                                                               \
    p = P(fmadd)(p, r_, S(EXP_C3));                                                                               \
    p = P(fmadd)(p, r_, S(EXP_C4));                                                                               \
    p = P(fmadd)(p, r_, S(EXP_C5));                                                                               \
    p = P(fmadd)(p, P(mul)(r_, r_), P(add)(r_, S(1.0f)));

/* 0.5 v (1 + erf(v / sqrt(2))) with RECIP for erf's p / q. */
#define GELU_ERF_FN(NAME, ATTR, VT, P, S, RECIP)                                                                   \
    ATTR static inline VT NAME(VT v) {                                                                             \
        VT x = P(min)(S(4.0f), P(max)(S(-4.0f), P(mul)(v, S(0.70710678118654752f))));                              \
        VT x2 = P(mul)(x, x);                                                                                      \
        VT p = P(fmadd)(S(ERF_P0), x2, S(ERF_P1));                                                                 \
        p = P(fmadd)(p, x2, S(ERF_P2));                                                                            \
        p = P(fmadd)(p, x2, S(ERF_P3));                                                                            \
        p = P(fmadd)(p, x2, S(ERF_P4));                                                                            \
        p = P(fmadd)(p, x2, S(ERF_P5));                                                                            \
        p = P(fmadd)(p, x2, S(ERF_P6));                                                                            \
        p = P(mul)(p, x);                                                                                          \
        VT q = P(fmadd)(S(ERF_Q0), x2, S(ERF_Q1));                                                                 \
        q = P(fmadd)(q, x2, S(ERF_Q2));                                                                            \
        q = P(fmadd)(q, x2, S(ERF_Q3));                                                                            \
        q = P(fmadd)(q, x2, S(ERF_Q4));                                                                            \
        return P(mul)(P(mul)(S(0.5f), v), P(add)(P(mul)(p, RECIP(q)), S(1.0f)));                                   \
    }

/* One row per kind over ROW(EXPR), EXPR reading v (input plus bias). */
#define KINDS_FN(NAME, ATTR, VT, P, S, SIG, GELU_ERF, ROW)                                                         \
    ATTR static void NAME(enum sigmoid_vec_kind k, float a, const float *x, const float *bias, float *y, int64_t n) { \
        const VT A = S(a);                                                                                         \
        switch (k) {                                                                                               \
        case SIGV_SIGMOID: ROW(SIG(P(mul)(A, v))) break;                                                           \
        case SIGV_SWISH: ROW(P(mul)(v, SIG(P(mul)(A, v)))) break;                                                  \
        case SIGV_GELU_TANH:                                                                                       \
            ROW(P(mul)(v, SIG(P(mul)(P(mul)(S(GELU_K), v), P(fmadd)(S(GELU_C), P(mul)(v, v), S(1.0f)))))) break;   \
        case SIGV_GELU_ERF: ROW(GELU_ERF(v)) break;                                                                \
        }                                                                                                          \
    }

/* ---- AVX-512 ---- */

#define P16(op) _mm512_##op##_ps
#define S16(c) _mm512_set1_ps(c)

/* e^v for v <= 0 (or NaN): p 2^n by scalef. */
V4 static inline __m512 exp_neg16(__m512 v) {
    EXP_POLY(P16, S16, __m512, _mm512_roundscale_ps, v, p, n)
    return _mm512_maskz_scalef_ps(_mm512_cmp_ps_mask(v, S16(EXP_MIN), _CMP_NLT_UQ), p, n);
}

/* 1 / d: the 14-bit estimate and one Newton step. */
V4 static inline __m512 recip16(__m512 d) {
    __m512 r = _mm512_rcp14_ps(d);
    return _mm512_fmadd_ps(_mm512_fnmadd_ps(d, r, S16(1.0f)), r, r);
}

V4 static inline __m512 sig16(__m512 z) {
    __m512 e = exp_neg16(_mm512_or_ps(z, S16(-0.0f))); /* e^-|z| */
    __m512 r = recip16(_mm512_add_ps(e, S16(1.0f)));
    return _mm512_mask_mul_ps(r, _mm512_cmp_ps_mask(z, _mm512_setzero_ps(), _CMP_LT_OQ), e, r);
}

GELU_ERF_FN(gelu_erf16, V4, __m512, P16, S16, recip16)

/* The last partial vector masked. */
#define ROW16(EXPR)                                                                                                 \
    for (int64_t i = 0; i < n; i += 16) {                                                                           \
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);                           \
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);                                                                 \
        if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, bias + i));                                         \
        _mm512_mask_storeu_ps(y + i, m, (EXPR));                                                                    \
    }
KINDS_FN(sigv_16, V4, __m512, P16, S16, sig16, gelu_erf16, ROW16)

/* ---- AVX2 ---- */

#define P8(op) _mm256_##op##_ps
#define S8(c) _mm256_set1_ps(c)

/* e^v for v <= 0 (or NaN): p 2^n, 2^n built in the exponent bits. */
V3 static inline __m256 exp_neg8(__m256 v) {
    EXP_POLY(P8, S8, __m256, _mm256_round_ps, v, p, n)
    __m256i s = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(s)), _mm256_cmp_ps(v, S8(EXP_MIN), _CMP_NLT_UQ));
}

/* 1 / d: the 12-bit estimate and one Newton step. */
V3 static inline __m256 recip8(__m256 d) {
    __m256 r = _mm256_rcp_ps(d);
    return _mm256_fmadd_ps(_mm256_fnmadd_ps(d, r, S8(1.0f)), r, r);
}

V3 static inline __m256 sig8(__m256 z) {
    __m256 e = exp_neg8(_mm256_or_ps(z, S8(-0.0f)));
    __m256 r = recip8(_mm256_add_ps(e, S8(1.0f)));
    return _mm256_blendv_ps(r, _mm256_mul_ps(e, r), _mm256_cmp_ps(z, _mm256_setzero_ps(), _CMP_LT_OQ));
}

GELU_ERF_FN(gelu_erf8, V3, __m256, P8, S8, recip8)

/* The last partial vector through a zero-padded copy. */
#define ROW8(EXPR)                                                                                                  \
    for (int64_t i = 0; i < n; i += 8) {                                                                            \
        float tx[8] = {0}, tb[8] = {0}, ty[8];                                                                      \
        const int full = n - i >= 8;                                                                                \
        const size_t len = full ? 8 : (size_t)(n - i);                                                              \
        if (!full) {                                                                                                \
            memcpy(tx, x + i, len * sizeof(float));                                                                 \
            if (bias) memcpy(tb, bias + i, len * sizeof(float));                                                    \
        }                                                                                                           \
        __m256 v = _mm256_loadu_ps(full ? x + i : tx);                                                              \
        if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(full ? bias + i : tb));                                      \
        _mm256_storeu_ps(full ? y + i : ty, (EXPR));                                                                \
        if (!full) memcpy(y + i, ty, len * sizeof(float));                                                          \
    }
KINDS_FN(sigv_8, V3, __m256, P8, S8, sig8, gelu_erf8, ROW8)

V4 static float exp_sum16(float *row, int64_t n, float shift) {
    __m512 acc = _mm512_setzero_ps(), sh = S16(shift);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 e = exp_neg16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, row + i), sh));
        _mm512_mask_storeu_ps(row + i, m, e);
        acc = _mm512_mask_add_ps(acc, m, acc, e);
    }
    return _mm512_reduce_add_ps(acc);
}

V3 static float exp_sum8(float *row, int64_t n, float shift) {
    __m256 acc = _mm256_setzero_ps(), sh = S8(shift);
    for (int64_t i = 0; i < n; i += 8) {
        float t[8] = {0};
        const int full = n - i >= 8;
        const size_t len = full ? 8 : (size_t)(n - i);
        if (!full) memcpy(t, row + i, len * sizeof(float));
        __m256 e = exp_neg8(_mm256_sub_ps(_mm256_loadu_ps(full ? row + i : t), sh));
        if (full) {
            _mm256_storeu_ps(row + i, e);
        } else { /* the padding's lanes out of the sum */
            __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            e = _mm256_and_ps(e, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)len), lane)));
            _mm256_storeu_ps(t, e);
            memcpy(row + i, t, len * sizeof(float));
        }
        acc = _mm256_add_ps(acc, e);
    }
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

int sigmoid_vec(enum sigmoid_vec_kind k, float a, const float *x, const float *bias, float *y, int64_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
    const int level = dnnl_util_isa_level();
    if (level >= 4) {
        sigv_16(k, a, x, bias, y, n);
        return 1;
    }
    if (level == 3) {
        sigv_8(k, a, x, bias, y, n);
        return 1;
    }
#else
    (void)k, (void)a, (void)x, (void)bias, (void)y, (void)n;
#endif
    return 0;
}

float exp_shift_sum(float *row, int64_t n, float shift) {
#if defined(__x86_64__) && defined(__GNUC__)
    const int level = dnnl_util_isa_level();
    if (level >= 4) return exp_sum16(row, n, shift);
    if (level == 3) return exp_sum8(row, n, shift);
#endif
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < n; i++) {
        row[i] = ew_exp_neg_f(row[i] - shift);
        sum += row[i];
    }
    return sum;
}
