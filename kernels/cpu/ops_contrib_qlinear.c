/* ops_contrib_qlinear.c - onnxruntime's QLinear contrib operators (domain
 * com.microsoft), which onnxruntime.quantization's quantize_static writes
 * in its QOperator format beside the standard QLinearConv and
 * QLinearMatMul: QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu,
 * QLinearGlobalAveragePool, QLinearAveragePool, QLinearConcat and
 * QLinearSoftmax.
 *
 * Each takes 8-bit tensors (uint8 or int8) with a float scale and an
 * optional zero point per tensor, computes in float on the dequantized
 * values as onnxruntime does, and requantizes into its output's scale and
 * zero point, rounding half to even and saturating. The unary ones go
 * through a 256-entry table made per call (cheaper than one exp per
 * element for any tensor worth quantizing). */

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/dnnl_util.h"
#include "kernels/cpu/elementwise_util.h"
#include "kernels/cpu/layout_util.h"
#include "kernels/cpu/matmul_util.h"
#include "kernels/cpu/params_util.h"
#include "kernels/ops.h"

static const struct tensor *in_at(const struct op_call *c, int i) { return i < c->nin ? c->in[i] : NULL; }

/* A (scale, zero point) pair: both per tensor. The scale is required. */
static int need_qparams(struct op_call *c, int si, int zi, enum dtype dt, const char *what) {
    const struct tensor *s = in_at(c, si), *z = zi >= 0 ? in_at(c, zi) : NULL;
    if (!s) return op_error(c, "input %d (%s scale) is required", si, what);
    if (s->dtype != DT_FP32 || tensor_numel(s) != 1)
        return op_error(c, "%s scale must be one float32 value", what);
    if (z && (z->dtype != dt || tensor_numel(z) != 1))
        return op_error(c, "%s zero point must be one %s value", what, dtype_name(dt));
    return 0;
}

struct qp {
    float scale;
    float zp;
};

static struct qp qp_at(const struct op_call *c, int si, int zi) {
    return (struct qp){(float)cpu_qparam_at(in_at(c, si), 0, 1.0), (float)cpu_qparam_at(zi >= 0 ? in_at(c, zi) : NULL, 0, 0)};
}

static inline float q_load(const void *p, enum dtype dt, int64_t i) {
    return dt == DT_UINT8 ? (float)((const uint8_t *)p)[i] : (float)((const int8_t *)p)[i];
}

/* Rounds v half to even and saturates it into element i of y. */
static inline void q_store(void *y, enum dtype dt, int64_t i, float v) {
    float r = nearbyintf(v);
    if (dt == DT_UINT8) ((uint8_t *)y)[i] = (uint8_t)(r != r ? 0 : r < 0 ? 0 : r > 255 ? 255 : r);
    else ((int8_t *)y)[i] = (int8_t)(r != r ? 0 : r < -128 ? -128 : r > 127 ? 127 : r);
}

static void like(struct tensor *o, const struct tensor *t) {
    *o = *t;
    o->data = NULL;
}

/* ------------------------------------------------------------------------
 * QLinearAdd, QLinearMul: A, A_scale, A_zero_point?, B, B_scale,
 * B_zero_point?, C_scale, C_zero_point?; numpy broadcasting.
 * ------------------------------------------------------------------------ */

static int qbin_infer(struct op_call *c) {
    const struct tensor *a = in_at(c, 0), *b = in_at(c, 3);
    int rc;
    if ((rc = cpu_need_q8(c, a, "A")) || (rc = cpu_need_q8(c, b, "B"))) return rc;
    if (b->dtype != a->dtype) return op_error(c, "A and B must have one dtype (%s and %s)", dtype_name(a->dtype), dtype_name(b->dtype));
    if ((rc = need_qparams(c, 1, 2, a->dtype, "A")) || (rc = need_qparams(c, 4, 5, a->dtype, "B")) ||
        (rc = need_qparams(c, 6, 7, a->dtype, "C")))
        return rc;
    if ((rc = op_broadcast_shape(c, a, b, c->out[0]))) return rc;
    /* Stored NHWC between integer convolutions (passes_qdq_layout): only
     * an element-by-element sum keeps that layout. */
    if (node_attr_int(c->node, "kiln_layout", 0) && (!tensor_same_shape(a, b) || strcmp(c->node->op_type, "QLinearAdd")))
        return op_error(c, "A and B are stored NHWC and must have the same shape");
    c->out[0]->dtype = a->dtype;
    return 0;
}

/* The same-shape QLinearAdd (a residual connection): the broadcasting
 * loop's arithmetic without the broadcasting, vectorized and built for
 * AVX-512, AVX2 and the baseline as oneDNN's effective ISA allows (no FMA
 * contraction under -std=c11: the same bits on each). */
struct qadd_args {
    const void *a, *b;
    void *y;
    float za, ra, zb, rb, zc;
};

#define QADD_SAME_BODY(T, LO, HI)                                                                             \
    static inline __attribute__((always_inline)) void qadd_same_##T(const struct qadd_args *q, int64_t i0,     \
                                                                     int64_t i1) {                             \
        const T *restrict a = q->a, *restrict b = q->b;                                                       \
        T *restrict y = q->y;                                                                                 \
        const float za = q->za, ra = q->ra, zb = q->zb, rb = q->rb, zc = q->zc;                               \
        _Pragma("omp simd")                                                                                   \
        for (int64_t i = i0; i < i1; i++) {                                                                   \
            float v = nearbyintf(((float)a[i] - za) * ra + ((float)b[i] - zb) * rb + zc);                      \
            y[i] = (T)(int32_t)(v < LO ? LO : v > HI ? HI : v == v ? v : 0.0f); /* NaN: 0, as q_store */         \
        }                                                                                                     \
    }
QADD_SAME_BODY(uint8_t, 0.0f, 255.0f)
QADD_SAME_BODY(int8_t, -128.0f, 127.0f)

typedef void (*qadd_fn)(const struct qadd_args *q, int64_t i0, int64_t i1);
#define QADD_SAME(SUF, ATTR)                                                                                  \
    ATTR static void qadd_u8_##SUF(const struct qadd_args *q, int64_t i0, int64_t i1) {                       \
        qadd_same_uint8_t(q, i0, i1);                                                                         \
    }                                                                                                         \
    ATTR static void qadd_s8_##SUF(const struct qadd_args *q, int64_t i0, int64_t i1) {                       \
        qadd_same_int8_t(q, i0, i1);                                                                          \
    }
QADD_SAME(v2, )
#if defined(__x86_64__) && defined(__GNUC__)
QADD_SAME(v4, __attribute__((target("arch=x86-64-v4"))))
QADD_SAME(v3, __attribute__((target("arch=x86-64-v3"))))
static const qadd_fn qadd_fns[2][3] = {{qadd_u8_v2, qadd_u8_v3, qadd_u8_v4}, {qadd_s8_v2, qadd_s8_v3, qadd_s8_v4}};
#else
static const qadd_fn qadd_fns[2][3] = {{qadd_u8_v2, qadd_u8_v2, qadd_u8_v2}, {qadd_s8_v2, qadd_s8_v2, qadd_s8_v2}};
#endif

static void qadd_same(const struct qadd_args *q, enum dtype dt, int64_t n, int nthreads) {
    const int level = dnnl_util_isa_level();
    const qadd_fn f = qadd_fns[dt == DT_INT8][level >= 4 ? 2 : level == 3 ? 1 : 0];
    const int nt = n >= 4 * EW_PAR_MIN && nthreads > 1 ? nthreads : 1;
    if (nt == 1) {
        f(q, 0, n);
        return;
    }
    const int64_t chunk = (n / nt + 63) & ~(int64_t)63;
#pragma omp parallel for num_threads(nt)
    for (int t = 0; t < nt; t++) {
        int64_t i0 = t * chunk, i1 = i0 + chunk < n ? i0 + chunk : n;
        if (i0 < i1) f(q, i0, i1);
    }
}

static int qbin_run(struct op_call *c) {
    const int mul = strcmp(c->node->op_type, "QLinearMul") == 0;
    const struct tensor *ins[2] = {c->in[0], c->in[3]};
    struct tensor *y = c->out[0];
    const struct qp qa = qp_at(c, 1, 2), qb = qp_at(c, 4, 5), qc = qp_at(c, 6, 7);
    const enum dtype dt = y->dtype;
    struct ew_bcast w;
    ew_bcast_init(&w, y, ins, 2);
    const float ra = qa.scale / qc.scale, rb = qb.scale / qc.scale, rm = qa.scale * qb.scale / qc.scale;
    int64_t n = tensor_numel(y);
    if (!mul && tensor_numel(ins[0]) == n && tensor_numel(ins[1]) == n) {
        const struct qadd_args q = {ins[0]->data, ins[1]->data, y->data, qa.zp, ra, qb.zp, rb, qc.zp};
        qadd_same(&q, dt, n, c->nthreads);
        return 0;
    }
#pragma omp parallel for if (w.outer * w.inner >= EW_PAR_MIN && w.outer > 1) num_threads(c->nthreads)
    for (int64_t r = 0; r < w.outer; r++) {
        int64_t off[EW_MAX_IN];
        ew_bcast_row(&w, r, off);
        for (int64_t j = 0; j < w.inner; j++) {
            float va = q_load(ins[0]->data, dt, off[0] + j * w.istr[0]) - qa.zp;
            float vb = q_load(ins[1]->data, dt, off[1] + j * w.istr[1]) - qb.zp;
            q_store(y->data, dt, r * w.inner + j, (mul ? va * vb * rm : va * ra + vb * rb) + qc.zp);
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * QLinearSigmoid, QLinearLeakyRelu (alpha): X, X_scale, X_zero_point?,
 * Y_scale, Y_zero_point?
 * ------------------------------------------------------------------------ */

static int qunary_infer(struct op_call *c) {
    const struct tensor *x = in_at(c, 0);
    int rc;
    if ((rc = cpu_need_q8(c, x, "X")) || (rc = need_qparams(c, 1, 2, x->dtype, "X")) ||
        (rc = need_qparams(c, 3, 4, x->dtype, "Y")))
        return rc;
    like(c->out[0], x);
    return 0;
}

struct qunary_params {
    int leaky;
    float alpha;
};

static int qunary_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct qunary_params p = {strcmp(c->node->op_type, "QLinearLeakyRelu") == 0,
                              node_attr_float(c->node, "alpha", 0.01f)};
    return params_keep(c, &p, sizeof p, state);
}

static int qunary_run(struct op_call *c) {
    const struct qunary_params *p = c->state;
    const struct tensor *x = c->in[0];
    const enum dtype dt = x->dtype;
    const struct qp qx = qp_at(c, 1, 2), qy = qp_at(c, 3, 4);
    uint8_t table[256];
    for (int v = 0; v < 256; v++) {
        float q = dt == DT_UINT8 ? (float)v : (float)(int8_t)(uint8_t)v;
        float f = (q - qx.zp) * qx.scale;
        f = p->leaky ? (f >= 0 ? f : f * p->alpha) : 1.0f / (1.0f + expf(-f));
        q_store(table, dt, v, f / qy.scale + qy.zp);
    }
    const uint8_t *xs = x->data;
    uint8_t *ys = c->out[0]->data;
    const int64_t n = tensor_numel(x);
#pragma omp parallel for simd if (n >= EW_PAR_MIN) num_threads(c->nthreads)
    for (int64_t i = 0; i < n; i++) ys[i] = table[xs[i]];
    return 0;
}

/* ------------------------------------------------------------------------
 * QLinearConcat: Y_scale, Y_zero_point, then (X, X_scale, X_zero_point)
 * per input; axis.
 * ------------------------------------------------------------------------ */

static int qconcat_infer(struct op_call *c) {
    if (c->nin < 5 || (c->nin - 2) % 3) return op_error(c, "needs Y_scale, Y_zero_point and triples of (X, scale, zero point); got %d inputs", c->nin);
    const struct tensor *x0 = in_at(c, 2);
    int rc;
    if ((rc = cpu_need_q8(c, x0, "input 2")) || (rc = need_qparams(c, 0, 1, x0->dtype, "Y"))) return rc;
    int axis = op_axis(c, node_attr_int(c->node, "axis", 0), x0->ndim);
    if (axis < 0) return STATUS_INVALID;
    struct tensor *y = c->out[0];
    like(y, x0);
    y->dims[axis] = 0;
    for (int i = 2; i < c->nin; i += 3) {
        const struct tensor *x = in_at(c, i);
        if (!x || x->dtype != x0->dtype || x->ndim != x0->ndim)
            return op_error(c, "input %d must be a %s tensor of rank %d", i, dtype_name(x0->dtype), x0->ndim);
        if ((rc = need_qparams(c, i + 1, i + 2, x0->dtype, "X"))) return rc;
        for (int d = 0; d < x->ndim; d++)
            if (d != axis && x->dims[d] != x0->dims[d])
                return op_error(c, "input %d has dim %d of %lld, expected %lld", i, d, (long long)x->dims[d],
                                (long long)x0->dims[d]);
        y->dims[axis] += x->dims[axis];
    }
    return 0;
}

struct qconcat_params {
    int64_t outer, inner; /* before the axis; after it, times the element */
};

static int qconcat_prepare(struct op_call *c, void **state, size_t *scratch) {
    const struct tensor *x0 = c->in[2];
    int axis = op_axis(c, node_attr_int(c->node, "axis", 0), x0->ndim);
    if (axis < 0) return STATUS_INVALID;
    struct qconcat_params p = {1, 1};
    for (int d = 0; d < x0->ndim; d++)
        if (d < axis) p.outer *= x0->dims[d];
        else if (d > axis) p.inner *= x0->dims[d];
    return params_keep(c, &p, sizeof p, state);
}

static int qconcat_run(struct op_call *c) {
    const struct qconcat_params *p = c->state;
    struct tensor *y = c->out[0];
    const enum dtype dt = y->dtype;
    const struct qp qy = qp_at(c, 0, 1);
    const int64_t ylen = tensor_numel(y) / (p->outer ? p->outer : 1);
    int64_t at = 0;
    for (int i = 2; i < c->nin; i += 3) {
        const struct tensor *x = c->in[i];
        const struct qp qx = qp_at(c, i + 1, i + 2);
        const int64_t len = tensor_numel(x) / (p->outer ? p->outer : 1);
        const int same = qx.scale == qy.scale && qx.zp == qy.zp;
        for (int64_t o = 0; o < p->outer; o++) {
            uint8_t *dst = (uint8_t *)y->data + o * ylen + at;
            const uint8_t *src = (const uint8_t *)x->data + o * len;
            if (same) {
                memcpy(dst, src, (size_t)len);
                continue;
            }
            for (int64_t j = 0; j < len; j++)
                q_store(dst, dt, j, (q_load(src, dt, j) - qx.zp) * (qx.scale / qy.scale) + qy.zp);
        }
        at += len;
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * QLinearGlobalAveragePool and QLinearAveragePool: X, x_scale,
 * x_zero_point?, y_scale, y_zero_point?; channels_last (NHWC) or not.
 * QLinearAveragePool has AveragePool's attributes (kernel_shape, strides,
 * pads, auto_pad, ceil_mode, count_include_pad).
 * ------------------------------------------------------------------------ */

#define QPOOL_MAX_SP (TENSOR_MAX_DIMS - 2)

struct qpool_params {
    int nsp, channels_last, include_pad, global;
    int64_t n, ch;
    int64_t in[QPOOL_MAX_SP], out[QPOOL_MAX_SP], k[QPOOL_MAX_SP], s[QPOOL_MAX_SP], pl[QPOOL_MAX_SP], pr[QPOOL_MAX_SP];
};

/* Geometry of the pool; global when the op is QLinearGlobalAveragePool. */
static int qpool_geom(struct op_call *c, struct qpool_params *p) {
    const struct tensor *x = c->in[0];
    memset(p, 0, sizeof *p);
    if (x->ndim < 3) return op_error(c, "X must have rank >= 3 (got %d)", x->ndim);
    p->nsp = x->ndim - 2;
    p->channels_last = node_attr_int(c->node, "channels_last", 0) != 0;
    p->include_pad = node_attr_int(c->node, "count_include_pad", 0) != 0;
    p->n = x->dims[0];
    p->ch = x->dims[p->channels_last ? x->ndim - 1 : 1];
    const int global = strcmp(c->node->op_type, "QLinearGlobalAveragePool") == 0;
    p->global = global;
    const int64_t *ks = NULL, *ss = NULL, *pads = NULL;
    int nk = global ? 0 : node_attr_ints(c->node, "kernel_shape", &ks);
    int ns = global ? -1 : node_attr_ints(c->node, "strides", &ss);
    int np = global ? -1 : node_attr_ints(c->node, "pads", &pads);
    const char *ap = global ? "NOTSET" : node_attr_str(c->node, "auto_pad", "NOTSET");
    int ceil_mode = !global && node_attr_int(c->node, "ceil_mode", 0) != 0;
    if (!global && nk != p->nsp) return op_error(c, "kernel_shape must have %d values", p->nsp);
    if ((ns >= 0 && ns != p->nsp) || (np >= 0 && np != 2 * p->nsp))
        return op_error(c, "strides and pads must have %d and %d values", p->nsp, 2 * p->nsp);
    for (int i = 0; i < p->nsp; i++) {
        int64_t in = x->dims[p->channels_last ? 1 + i : 2 + i];
        p->in[i] = in;
        p->k[i] = global ? in : ks[i];
        p->s[i] = ns > 0 ? ss[i] : 1;
        if (p->k[i] < 1 || p->s[i] < 1) return op_error(c, "kernel_shape and strides must be positive");
        int64_t pl = np > 0 ? pads[i] : 0, pr = np > 0 ? pads[p->nsp + i] : 0;
        if (strcmp(ap, "SAME_UPPER") == 0 || strcmp(ap, "SAME_LOWER") == 0) {
            int64_t out = (in + p->s[i] - 1) / p->s[i];
            int64_t total = (out - 1) * p->s[i] + p->k[i] - in;
            total = total < 0 ? 0 : total;
            pl = strcmp(ap, "SAME_UPPER") == 0 ? total / 2 : total - total / 2;
            pr = total - pl;
        } else if (strcmp(ap, "VALID") == 0) {
            pl = pr = 0;
        } else if (strcmp(ap, "NOTSET") != 0) {
            return op_error(c, "auto_pad '%s' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID", ap);
        }
        p->pl[i] = pl;
        p->pr[i] = pr;
        int64_t span = in + pl + pr - p->k[i];
        if (span < 0) return op_error(c, "the kernel is larger than the padded input along spatial dim %d", i);
        p->out[i] = (ceil_mode ? (span + p->s[i] - 1) / p->s[i] : span / p->s[i]) + 1;
        /* a last window that starts in the right padding is dropped */
        if (ceil_mode && (p->out[i] - 1) * p->s[i] >= in + pl) p->out[i]--;
    }
    return 0;
}

static int qpool_infer(struct op_call *c) {
    const struct tensor *x = in_at(c, 0);
    int rc;
    struct qpool_params p;
    if ((rc = cpu_need_q8(c, x, "X")) || (rc = need_qparams(c, 1, 2, x->dtype, "x")) ||
        (rc = need_qparams(c, 3, 4, x->dtype, "y")) || (rc = qpool_geom(c, &p)))
        return rc;
    struct tensor *y = c->out[0];
    like(y, x);
    for (int i = 0; i < p.nsp; i++) y->dims[p.channels_last ? 1 + i : 2 + i] = p.out[i];
    return 0;
}

static int qpool_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct qpool_params p;
    int rc = qpool_geom(c, &p);
    if (p.global) *scratch = sizeof(int32_t) * (size_t)(p.ch > 0 ? p.ch : 1);
    return rc ? rc : params_keep(c, &p, sizeof p, state);
}

/* The global pool's integer sums: per channel over the map, for channels-last
 * bytes (rows of ch values, summed as rows: vectorized) or planes. */
#define QGAP_SUMS(T)                                                                                          \
    static void qgap_sums_##T(const T *x, int64_t ch, int64_t sp, int cl, int32_t *restrict acc) {            \
        if (cl) {                                                                                             \
            for (int64_t k = 0; k < ch; k++) acc[k] = 0;                                                      \
            for (int64_t s = 0; s < sp; s++) {                                                                \
                const T *restrict r = x + s * ch;                                                             \
                for (int64_t k = 0; k < ch; k++) acc[k] += r[k];                                              \
            }                                                                                                 \
            return;                                                                                           \
        }                                                                                                     \
        for (int64_t k = 0; k < ch; k++) {                                                                    \
            const T *restrict r = x + k * sp;                                                                 \
            int32_t a = 0;                                                                                    \
            for (int64_t s = 0; s < sp; s++) a += r[s];                                                       \
            acc[k] = a;                                                                                       \
        }                                                                                                     \
    }
QGAP_SUMS(uint8_t)
QGAP_SUMS(int8_t)

/* QLinearGlobalAveragePool: X channels-last when its channels_last says so
 * or the layout planner stored it so (kiln_layout 1: dims NCHW, bytes NHWC);
 * Y is [N, C, 1...] either way, the same bytes. The arithmetic of the
 * general loop below: the sum of x - zp (exact integers), divided by the
 * map's size, scaled. */
static void qgap_run(struct op_call *c, const struct qpool_params *p, int64_t isp) {
    const struct tensor *x = c->in[0];
    struct tensor *y = c->out[0];
    const enum dtype dt = x->dtype;
    const struct qp qx = qp_at(c, 1, 2), qy = qp_at(c, 3, 4);
    const int cl = p->channels_last || (layout_of(c->node) & 1);
    const float mult = qx.scale / qy.scale;
    int32_t *acc = c->scratch;
    for (int64_t b = 0; b < p->n; b++) {
        const int64_t off = b * p->ch * isp;
        if (dt == DT_UINT8) qgap_sums_uint8_t((const uint8_t *)x->data + off, p->ch, isp, cl, acc);
        else qgap_sums_int8_t((const int8_t *)x->data + off, p->ch, isp, cl, acc);
        const int64_t zsum = isp * (int64_t)qx.zp;
        for (int64_t k = 0; k < p->ch; k++) {
            float v = isp > 0 ? (float)((int64_t)acc[k] - zsum) / (float)isp : 0.0f;
            q_store(y->data, dt, b * p->ch + k, v * mult + qy.zp);
        }
    }
}

static int qpool_run(struct op_call *c) {
    const struct qpool_params *p = c->state;
    const struct tensor *x = c->in[0];
    struct tensor *y = c->out[0];
    const enum dtype dt = x->dtype;
    const struct qp qx = qp_at(c, 1, 2), qy = qp_at(c, 3, 4);
    int64_t isp = 1, osp = 1;
    for (int i = 0; i < p->nsp; i++) {
        isp *= p->in[i];
        osp *= p->out[i];
    }
    if (p->global && c->scratch_size >= sizeof(int32_t) * (size_t)p->ch && isp < ((int64_t)1 << 23)) {
        qgap_run(c, p, isp);
        return 0;
    }
    /* element strides of a spatial step and of a channel, in X and Y */
    const int64_t xc = p->channels_last ? 1 : isp, xs = p->channels_last ? p->ch : 1;
    const int64_t yc = p->channels_last ? 1 : osp, ys = p->channels_last ? p->ch : 1;
    const int64_t planes = p->n * p->ch;
#pragma omp parallel for if (planes * osp >= 4096 && planes > 1) num_threads(c->nthreads)
    for (int64_t pc = 0; pc < planes; pc++) {
        const int64_t ni = pc / p->ch, ci = pc % p->ch;
        const int64_t xbase = ni * p->ch * isp + ci * xc, ybase = ni * p->ch * osp + ci * yc;
        for (int64_t o = 0; o < osp; o++) {
            int64_t lo[QPOOL_MAX_SP], hi[QPOOL_MAX_SP], win = 1, cnt = 1, rem = o;
            for (int i = p->nsp - 1; i >= 0; i--) {
                int64_t oi = rem % p->out[i];
                rem /= p->out[i];
                int64_t start = oi * p->s[i] - p->pl[i], end = start + p->k[i];
                /* count_include_pad counts the pads, not a ceil_mode overhang past them */
                int64_t padded_end = end > p->in[i] + p->pr[i] ? p->in[i] + p->pr[i] : end;
                lo[i] = start < 0 ? 0 : start;
                hi[i] = end > p->in[i] ? p->in[i] : end;
                win *= padded_end - start;
                cnt *= hi[i] > lo[i] ? hi[i] - lo[i] : 0;
            }
            float sum = 0;
            if (cnt > 0) {
                int64_t idx[QPOOL_MAX_SP];
                memcpy(idx, lo, sizeof(int64_t) * (size_t)p->nsp);
                for (;;) {
                    int64_t e = 0;
                    for (int i = 0; i < p->nsp; i++) e = e * p->in[i] + idx[i];
                    sum += q_load(x->data, dt, xbase + e * xs) - qx.zp;
                    int i = p->nsp - 1;
                    while (i >= 0 && ++idx[i] >= hi[i]) {
                        idx[i] = lo[i];
                        i--;
                    }
                    if (i < 0) break;
                }
            }
            int64_t div = p->include_pad ? win : cnt;
            float v = div > 0 ? sum / (float)div : 0.0f;
            q_store(y->data, dt, ybase + o * ys, v * (qx.scale / qy.scale) + qy.zp);
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * QLinearSoftmax: X, X_scale, x_zero_point?, y_scale, y_zero_point?;
 * axis, opset (below 13 the axes from axis on are one, as Softmax-1 had
 * them). As onnxruntime computes it: exp((x - max) * x_scale) over the
 * row, and y = round(e * floor(1 / y_scale) / sum) + y_zero_point (its
 * integral reciprocal of the scale kept, so the answers agree).
 * ------------------------------------------------------------------------ */

struct qsmax_params {
    int64_t outer, len, inner;
};

static int qsmax_geom(struct op_call *c, struct qsmax_params *p) {
    const struct tensor *x = c->in[0];
    int64_t opset = node_attr_int(c->node, "opset", 13);
    int axis = op_axis(c, node_attr_int(c->node, "axis", opset < 13 ? 1 : -1), x->ndim);
    if (axis < 0) return STATUS_INVALID;
    *p = (struct qsmax_params){1, 1, 1};
    for (int d = 0; d < x->ndim; d++)
        if (d < axis) p->outer *= x->dims[d];
        else if (d == axis || opset < 13) p->len *= x->dims[d];
        else p->inner *= x->dims[d];
    return 0;
}

static int qsmax_infer(struct op_call *c) {
    const struct tensor *x = in_at(c, 0);
    struct qsmax_params p;
    int rc;
    if ((rc = cpu_need_q8(c, x, "X")) || (rc = need_qparams(c, 1, 2, x->dtype, "X")) ||
        (rc = need_qparams(c, 3, 4, x->dtype, "Y")) || (rc = qsmax_geom(c, &p)))
        return rc;
    like(c->out[0], x);
    return 0;
}

static int qsmax_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct qsmax_params p;
    int rc = qsmax_geom(c, &p);
    if (rc) return rc;
    *scratch = sizeof(float) * 256;
    return params_keep(c, &p, sizeof p, state);
}

static int qsmax_run(struct op_call *c) {
    const struct qsmax_params *p = c->state;
    const struct tensor *x = c->in[0];
    const enum dtype dt = x->dtype;
    const struct qp qx = qp_at(c, 1, 2), qy = qp_at(c, 3, 4);
    const float ymul = floorf(1.0f / qy.scale);
    /* e^((q - max) * scale) for every difference q - max in [-255, 0] */
    float *table = c->scratch;
    for (int d = 0; d < 256; d++) table[d] = (float)exp(-(double)d * (double)qx.scale);
    const int64_t rows = p->outer * p->inner;
#pragma omp parallel for if (rows * p->len >= EW_PAR_MIN && rows > 1) num_threads(c->nthreads)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t base = (r / p->inner) * p->len * p->inner + r % p->inner, step = p->inner;
        float mx = -FLT_MAX, sum = 0;
        for (int64_t j = 0; j < p->len; j++) {
            float v = q_load(x->data, dt, base + j * step);
            mx = v > mx ? v : mx;
        }
        for (int64_t j = 0; j < p->len; j++) sum += table[(int)(mx - q_load(x->data, dt, base + j * step))];
        for (int64_t j = 0; j < p->len; j++) {
            float e = table[(int)(mx - q_load(x->data, dt, base + j * step))];
            q_store(c->out[0]->data, dt, base + j * step, nearbyintf(e * ymul / sum) + qy.zp);
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * The table
 * ------------------------------------------------------------------------ */

#define MS "com.microsoft"

const struct op_def op_defs_contrib_qlinear[] = {
    {"QLinearAdd", MS, qbin_infer, NULL, qbin_run, NULL, 0},
    {"QLinearMul", MS, qbin_infer, NULL, qbin_run, NULL, 0},
    {"QLinearSigmoid", MS, qunary_infer, qunary_prepare, qunary_run, op_params_free, 0},
    {"QLinearLeakyRelu", MS, qunary_infer, qunary_prepare, qunary_run, op_params_free, 0},
    {"QLinearConcat", MS, qconcat_infer, qconcat_prepare, qconcat_run, op_params_free, 0},
    {"QLinearGlobalAveragePool", MS, qpool_infer, qpool_prepare, qpool_run, op_params_free, 0},
    {"QLinearAveragePool", MS, qpool_infer, qpool_prepare, qpool_run, op_params_free, 0},
    {"QLinearSoftmax", MS, qsmax_infer, qsmax_prepare, qsmax_run, op_params_free, 0},
    {0},
};
