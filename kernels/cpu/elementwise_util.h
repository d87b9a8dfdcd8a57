/* elementwise_util.h - private helpers of the elementwise and reduce
 * families: dtype classes and the broadcast walk shared by their kernels.
 *
 * The broadcast walk coalesces an output shape and its (numpy-broadcast)
 * inputs into an outer loop of rows and one inner run along which each input
 * advances by 1 element or stays put (stride 0). Same-shape operands become
 * a single run, a scalar operand a run of stride 0, a bias row [C] against
 * [N,C] a run of C repeated N times: the typed inner loops never see index
 * arithmetic and stay vectorizable. */
#ifndef KILN_ELEMENTWISE_UTIL_H
#define KILN_ELEMENTWISE_UTIL_H

#include <stdint.h>

#include "common/tensor.h"
#include "graph/graph.h"

#define EW_MAX_IN 3

/* Element counts below this stay on the calling thread: for tiny tensors
 * waking a thread team costs more than the work (latency matters). */
#define EW_PAR_MIN 32768
/* Inner runs longer than this are cut into pieces so that one huge row
 * still spreads over the threads. */
#define EW_PIECE 16384

static inline int ew_is_float(enum dtype dt) {
    return dt == DT_FP32 || dt == DT_FP64 || dt == DT_FP16 || dt == DT_BF16;
}
static inline int ew_is_half(enum dtype dt) { return dt == DT_FP16 || dt == DT_BF16; }
static inline int ew_is_sint(enum dtype dt) {
    return dt == DT_INT8 || dt == DT_INT16 || dt == DT_INT32 || dt == DT_INT64;
}
static inline int ew_is_uint(enum dtype dt) {
    return dt == DT_UINT8 || dt == DT_UINT16 || dt == DT_UINT32 || dt == DT_UINT64;
}
static inline int ew_is_int(enum dtype dt) { return ew_is_sint(dt) || ew_is_uint(dt); }
static inline int ew_is_number(enum dtype dt) { return ew_is_float(dt) || ew_is_int(dt); }

struct ew_bcast {
    int nin;
    int nd;                                   /* outer dims after coalescing */
    int64_t dims[TENSOR_MAX_DIMS];
    int64_t str[EW_MAX_IN][TENSOR_MAX_DIMS];  /* element strides of each input over the outer dims */
    int64_t inner;                            /* length of the inner run */
    int64_t istr[EW_MAX_IN];                  /* 0 or 1 */
    int64_t outer;                            /* number of rows */
};

/* Plans the walk of out (whose shape is the broadcast of the inputs' shapes,
 * already checked) over nin inputs. */
static inline void ew_bcast_init(struct ew_bcast *b, const struct tensor *out, const struct tensor *const *in,
                                 int nin) {
    int64_t cd[TENSOR_MAX_DIMS];
    int full[EW_MAX_IN][TENSOR_MAX_DIMS];
    int m = 0, nd = out->ndim;
    for (int i = 0; i < nd; i++) {
        int64_t d = out->dims[i];
        if (d == 1) continue;
        int f[EW_MAX_IN], merge = m > 0;
        for (int k = 0; k < nin; k++) {
            int ik = in[k]->ndim - nd + i;
            f[k] = ik >= 0 && in[k]->dims[ik] == d;
            if (merge && full[k][m - 1] != f[k]) merge = 0;
        }
        if (merge) {
            cd[m - 1] *= d;
        } else {
            cd[m] = d;
            for (int k = 0; k < nin; k++) full[k][m] = f[k];
            m++;
        }
    }
    b->nin = nin;
    if (m == 0) {
        b->nd = 0;
        b->inner = 1;
        b->outer = 1;
        for (int k = 0; k < nin; k++) b->istr[k] = 0;
        return;
    }
    b->inner = cd[m - 1];
    b->nd = m - 1;
    b->outer = 1;
    for (int j = 0; j < m - 1; j++) {
        b->dims[j] = cd[j];
        b->outer *= cd[j];
    }
    for (int k = 0; k < nin; k++) {
        int64_t s = 1;
        for (int j = m - 1; j >= 0; j--) {
            int64_t st = full[k][j] ? s : 0;
            if (j == m - 1) b->istr[k] = st;
            else b->str[k][j] = st;
            if (full[k][j]) s *= cd[j];
        }
    }
}

/* Element offset of input k at the start of row r. */
static inline void ew_bcast_row(const struct ew_bcast *b, int64_t r, int64_t *off) {
    for (int k = 0; k < b->nin; k++) off[k] = 0;
    for (int j = b->nd - 1; j >= 0 && r; j--) {
        int64_t idx = r % b->dims[j];
        r /= b->dims[j];
        for (int k = 0; k < b->nin; k++) off[k] += idx * b->str[k][j];
    }
}

/* e^r for |r| <= ln2/2: Cephes' degree-6 polynomial. */
static inline float ew_exp_poly(float r) {
    float p = 1.9875691500E-4f;
    p = p * r + 1.3981999507E-3f;
    p = p * r + 8.3334519073E-3f;
    p = p * r + 4.1665795894E-2f;
    p = p * r + 1.6666665459E-1f;
    p = p * r + 5.0000001201E-1f;
    return p * r * r + r + 1.0f;
}

/* Splits x = n ln2 + r, n rounded to nearest (the 1.5 * 2^23 trick: plain
 * arithmetic that vectorizes); returns r, n in *n. */
static inline float ew_exp_split(float x, float *n) {
    float t = x * 1.44269504088896341f + 12582912.0f;
    *n = t - 12582912.0f;
    return x - *n * 0.693359375f - *n * -2.12194440e-4f;
}

/* e^x for float, branch-free so that loops over it vectorize (libm's expf
 * is an opaque call): 2^n * e^r with |r| <= ln2/2; within 1 ulp of expf
 * over the normal range, 0 below -104, inf above ln(FLT_MAX), NaN
 * propagates. */
static inline float ew_exp_f(float x) {
    float xc = x > -104.0f ? x : -104.0f;
    xc = xc < 88.72283935546875f ? xc : 88.72283935546875f;
    float n, p = ew_exp_poly(ew_exp_split(xc, &n));
    /* 2^n as two factors so that neither leaves the normal range */
    int32_t ni = (int32_t)n, n1 = ni >> 1;
    union { int32_t i; float f; } s1, s2;
    s1.i = (n1 + 127) << 23;
    s2.i = (ni - n1 + 127) << 23;
    float y = p * s1.f * s2.f;
    y = x > -104.0f ? y : 0.0f;
    y = x < 88.72283935546875f ? y : __builtin_inff();
    return x == x ? y : x;
}

/* e^x for x <= 0 where tiny results may be 0 (a softmax's shifted
 * scores): 0 below -87.3, where e^x would leave the normal floats. Masked
 * scores (the float minimum, -inf) land there, and denormal arithmetic
 * costs far more. */
static inline float ew_exp_neg_f(float x) {
    float xc = x > -87.3f ? x : -87.3f;
    float n, p = ew_exp_poly(ew_exp_split(xc, &n));
    union { int32_t i; float f; } s;
    s.i = ((int32_t)n + 127) << 23;
    return x > -87.3f ? p * s.f : 0.0f;
}
static inline float ew_sigmoid_f(float x) { return 1.0f / (1.0f + ew_exp_f(-x)); }
/* tanh: Cephes' odd polynomial near 0 (no cancellation), 1 - 2/(e^2|x| + 1)
 * elsewhere; within 2 ulp. */
static inline float ew_tanh_f(float x) {
    float ax = x < 0 ? -x : x;
    float z = x * x;
    float s = ((((-5.70498872745E-3f * z + 2.06390887954E-2f) * z - 5.37397155531E-2f) * z + 1.33314422036E-1f) * z - 3.33332819422E-1f) * z * x + x;
    float l = 1.0f - 2.0f / (ew_exp_f(2.0f * ax) + 1.0f);
    l = x < 0 ? -l : l;
    return ax < 0.625f ? s : l;
}

/* erf: a [13/8] odd rational approximation on [-4, 4] (the form Eigen
 * uses), clamped beyond where erf is +-1 in float; absolute error under
 * 5e-7 everywhere, against libm's erff about 10x slower and opaque to the
 * vectorizer. */
static inline float ew_erf_f(float x) {
    float xc = x < 4.0f ? x : 4.0f;
    xc = xc > -4.0f ? xc : -4.0f;
    float x2 = xc * xc;
    float p = -2.72614225801306e-10f;
    p = p * x2 + 2.77068142495902e-08f;
    p = p * x2 + -2.10102402082508e-06f;
    p = p * x2 + -5.69250639462346e-05f;
    p = p * x2 + -7.34990630326855e-04f;
    p = p * x2 + -2.95459980854025e-03f;
    p = p * x2 + -1.60960333262415e-02f;
    p = p * xc;
    float q = -1.45660718464996e-05f;
    q = q * x2 + -2.13374055278905e-04f;
    q = q * x2 + -1.68282697438203e-03f;
    q = q * x2 + -7.37332916720468e-03f;
    q = q * x2 + -1.42647390514189e-02f;
    return x == x ? p / q : x;
}

/* Applies a fused activation (graph/graph.h) to n floats in place, built
 * for the CPU's vector width (ops_elementwise.c); the values equal
 * act_apply()'s within the few ulp of the branch-free exp, tanh and erf. */
void ew_act_f32(float *x, int64_t n, enum act_kind act, float a, float b);

/* One row of LayerNormalization (rms 0) or RMSNormalization (rms 1) on
 * float: y = (x - mean) / sqrt(var + eps) * scale + b, scale and b full
 * (nsc, nb == n) or one value (b may be NULL); mean and inv (NULL: not
 * wanted) get the row's mean (0 with rms) and 1/sqrt(var + eps). Built for
 * the CPU's vector width (ops_elementwise.c). */
void ew_norm_row_f32(const float *xr, const float *sc, int64_t nsc, const float *b, int64_t nb, float *yr, float *mean,
                     float *inv, int64_t n, float eps, int rms);

#endif
