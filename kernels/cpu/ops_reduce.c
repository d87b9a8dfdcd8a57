/* ops_reduce.c - reductions (ReduceSum, ReduceMean, ReduceMax... over any set
 * of axes), ArgMax/ArgMin, and the operators built on reductions: the
 * NegativeLogLikelihood and SoftmaxCrossEntropy losses, LpNormalization and
 * MeanVarianceNormalization.
 *
 * The axes are an attribute up to opset 12 (ReduceSum) or 17 (the others)
 * and an optional input from then on; as an input they must be constant when
 * the plan is built, since they decide the output's shape.
 *
 * A reduction coalesces the input's dims into kept and reduced groups (dims
 * of size 1 vanish, neighbours of the same kind merge), so "mean over H and
 * W" is one contiguous run per output and only genuinely interleaved axes
 * pay for the general odometer walk. Float data accumulates in double;
 * integer data in int64 (wrapping like the narrower types would, once
 * stored back). */
/* See ops_elementwise.c: no code here reads the floating-point flags, and
 * without this GCC leaves the selects of max/min loops scalar. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#ifdef __clang__
#pragma clang diagnostic ignored "-Wpass-failed"
#endif

#include <float.h>
#include <limits.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/dnnl_util.h"
#include "kernels/cpu/elementwise_util.h"
#include "kernels/cpu/layout_util.h"
#include "kernels/cpu/par_util.h"
#include "kernels/ops.h"

enum red_kind { RED_SUM, RED_MEAN, RED_MAX, RED_MIN, RED_PROD, RED_L1, RED_L2, RED_LOGSUM, RED_LOGSUMEXP, RED_SUMSQ };

static const struct red_name {
    const char *op;
    enum red_kind kind;
} g_red_names[] = {
    {"ReduceSum", RED_SUM},       {"ReduceMean", RED_MEAN},     {"ReduceMax", RED_MAX},
    {"ReduceMin", RED_MIN},       {"ReduceProd", RED_PROD},     {"ReduceL1", RED_L1},
    {"ReduceL2", RED_L2},         {"ReduceLogSum", RED_LOGSUM}, {"ReduceLogSumExp", RED_LOGSUMEXP},
    {"ReduceSumSquare", RED_SUMSQ},
};

static int red_kind_of(const struct graph_node *n) {
    for (size_t i = 0; i < sizeof g_red_names / sizeof g_red_names[0]; i++)
        if (strcmp(n->op_type, g_red_names[i].op) == 0) return (int)g_red_names[i].kind;
    return -1;
}

static const struct tensor *in_opt(const struct op_call *c, int i) { return i < c->nin ? c->in[i] : NULL; }

/* The input's shape split into kept and reduced dims, with element strides. */
struct red_geom {
    int nk, nr;
    int64_t kdims[TENSOR_MAX_DIMS], kstr[TENSOR_MAX_DIMS];
    int64_t rdims[TENSOR_MAX_DIMS], rstr[TENSOR_MAX_DIMS];
    int64_t nout, nred;
    int noop; /* empty axes with noop_with_empty_axes: the output is the input */
    int keepdims;
    int red[TENSOR_MAX_DIMS];
};

/* Reads the axes (attribute or input by opset) into g->red. */
static int red_axes(struct op_call *c, const struct tensor *x, struct red_geom *g) {
    const struct graph_node *n = c->node;
    int from_input = strcmp(n->op_type, "ReduceSum") == 0 ? n->opset >= 13 : n->opset >= 18;
    int64_t axes[TENSOR_MAX_DIMS];
    int na = 0;
    if (from_input) {
        const struct tensor *t = in_opt(c, 1);
        if (t) {
            if (t->dtype != DT_INT64 && t->dtype != DT_INT32)
                return op_error(c, "axes must be int64, got %s", dtype_name(t->dtype));
            int64_t m = tensor_numel(t);
            if (m > 0 && !t->data) {
                op_error(c, "input 1 (axes) is computed at run time, and the output's shape depends on it");
                return STATUS_DATA_DEPENDENT;
            }
            if (m < 0 || m > x->ndim)
                return op_error(c, "axes has %lld values for an input of rank %d", (long long)m, x->ndim);
            for (int64_t i = 0; i < m; i++) axes[na++] = op_int_at(t, i);
        }
    } else {
        const int64_t *a;
        int m = node_attr_ints(n, "axes", &a);
        if (m > x->ndim) return op_error(c, "attribute 'axes' has %d values for an input of rank %d", m, x->ndim);
        for (int i = 0; i < m; i++) axes[na++] = a[i];
    }
    g->keepdims = node_attr_int(n, "keepdims", 1) != 0;
    g->noop = 0;
    for (int i = 0; i < TENSOR_MAX_DIMS; i++) g->red[i] = 0;
    if (na == 0) {
        if (node_attr_int(n, "noop_with_empty_axes", 0)) g->noop = 1;
        else
            for (int i = 0; i < x->ndim; i++) g->red[i] = 1;
        return 0;
    }
    for (int i = 0; i < na; i++) {
        int ax = op_axis(c, axes[i], x->ndim);
        if (ax < 0) return STATUS_INVALID;
        if (g->red[ax]) return op_error(c, "axis %lld appears twice in axes", (long long)axes[i]);
        g->red[ax] = 1;
    }
    return 0;
}

static void red_coalesce(const struct tensor *x, struct red_geom *g) {
    int64_t st = 1;
    int last = -1; /* kind of the group met last (walking from the innermost dim), -1 none */
    int nk = 0, nr = 0;
    int64_t kd[TENSOR_MAX_DIMS], ks[TENSOR_MAX_DIMS], rd[TENSOR_MAX_DIMS], rs[TENSOR_MAX_DIMS];
    g->nout = 1;
    g->nred = 1;
    for (int i = x->ndim - 1; i >= 0; i--) {
        int64_t d = x->dims[i];
        int r = g->noop ? 0 : g->red[i];
        if (r) g->nred *= d;
        else g->nout *= d;
        if (d != 1) {
            if (r) {
                if (last == 1) rd[nr - 1] *= d;
                else {
                    rd[nr] = d;
                    rs[nr++] = st;
                }
            } else {
                if (last == 0) kd[nk - 1] *= d;
                else {
                    kd[nk] = d;
                    ks[nk++] = st;
                }
            }
            last = r;
        }
        st *= d;
    }
    /* stored outermost first */
    g->nk = nk;
    g->nr = nr;
    for (int i = 0; i < nk; i++) {
        g->kdims[i] = kd[nk - 1 - i];
        g->kstr[i] = ks[nk - 1 - i];
    }
    for (int i = 0; i < nr; i++) {
        g->rdims[i] = rd[nr - 1 - i];
        g->rstr[i] = rs[nr - 1 - i];
    }
}

static int red_dtype_ok(enum dtype dt) {
    return ew_is_number(dt) || dt == DT_BOOL;
}

static int red_infer(struct op_call *c) {
    if (c->nin < 1 || !c->in[0]) return op_error(c, "input 0 (data) is required");
    if (c->nout < 1 || !c->out[0]) return op_error(c, "output 0 is required");
    const struct tensor *x = c->in[0];
    if (x->ndim < 0) return op_error(c, "input 0 has no known rank");
    int kind = red_kind_of(c->node);
    if (kind < 0) return op_error(c, "not a reduction");
    if (!red_dtype_ok(x->dtype) || (x->dtype == DT_BOOL && kind != RED_MAX && kind != RED_MIN)) {
        op_error(c, "dtype %s is not supported by this operator", dtype_name(x->dtype));
        return STATUS_UNSUPPORTED;
    }
    struct red_geom g;
    int rc = red_axes(c, x, &g);
    if (rc) return rc;
    struct tensor *o = c->out[0];
    o->dtype = x->dtype;
    o->ndim = 0;
    for (int i = 0; i < x->ndim; i++) {
        if (g.noop || !g.red[i]) o->dims[o->ndim++] = x->dims[i];
        else if (g.keepdims) o->dims[o->ndim++] = 1;
    }
    return 0;
}

/* Walks the reduced elements of one output (base = its first input element);
 * BODY sees the element offset `off`. */
#define RED_WALK(g, base, BODY)                                                                                     \
    do {                                                                                                            \
        if ((g)->nr == 1) {                                                                                         \
            const int64_t st_ = (g)->rstr[0], n_ = (g)->rdims[0];                                                   \
            for (int64_t r_ = 0; r_ < n_; r_++) {                                                                   \
                const int64_t off = (base) + r_ * st_;                                                              \
                BODY;                                                                                               \
            }                                                                                                       \
        } else {                                                                                                    \
            int64_t idx_[TENSOR_MAX_DIMS] = {0}, cur_ = (base);                                                     \
            for (int64_t k_ = 0; k_ < (g)->nred; k_++) {                                                            \
                const int64_t off = cur_;                                                                           \
                BODY;                                                                                               \
                for (int d_ = (g)->nr - 1; d_ >= 0; d_--) {                                                         \
                    cur_ += (g)->rstr[d_];                                                                          \
                    if (++idx_[d_] < (g)->rdims[d_]) break;                                                         \
                    cur_ -= (g)->rstr[d_] * (g)->rdims[d_];                                                         \
                    idx_[d_] = 0;                                                                                   \
                }                                                                                                   \
            }                                                                                                       \
        }                                                                                                           \
    } while (0)

static int64_t red_base(const struct red_geom *g, int64_t o) {
    int64_t off = 0;
    for (int j = g->nk - 1; j >= 0 && o; j--) {
        off += (o % g->kdims[j]) * g->kstr[j];
        o /= g->kdims[j];
    }
    return off;
}

static inline double red_abs_d(double v) { return fabs(v); }
static inline int64_t red_abs_i(int64_t v) { return v < 0 ? (int64_t)(0 - (uint64_t)v) : v; }
static inline uint64_t red_abs_u(uint64_t v) { return v; }
#define RED_ABS(v) _Generic((v), double: red_abs_d, uint64_t: red_abs_u, default: red_abs_i)(v)

/* float data reduced over one contiguous run: the common case (a mean over
 * H*W, over the last axis) gets vectorized loops. Sums go by blocks of
 * 256 in float (SIMD lanes) added up in double, which keeps the error of
 * a long sum near that of a double accumulation. Returns 0 if not handled. */
#define RED_BLOCK 256
static int red_fast_f32(const float *x, const struct red_geom *g, int64_t base, enum red_kind k, float *y) {
    if (g->nr != 1 || g->rstr[0] != 1 || g->rdims[0] < 16) return 0;
    const float *p = x + base;
    const int64_t n = g->rdims[0];
    switch (k) {
    case RED_SUM: case RED_MEAN: case RED_SUMSQ: case RED_L1: case RED_L2: {
        double acc = 0;
        for (int64_t i0 = 0; i0 < n; i0 += RED_BLOCK) {
            const int64_t m = n - i0 < RED_BLOCK ? n - i0 : RED_BLOCK;
            const float *q = p + i0;
            float s = 0;
            if (k == RED_SUMSQ || k == RED_L2) {
                _Pragma("omp simd reduction(+ : s)") for (int64_t i = 0; i < m; i++) s += q[i] * q[i];
            } else if (k == RED_L1) {
                _Pragma("omp simd reduction(+ : s)") for (int64_t i = 0; i < m; i++) s += fabsf(q[i]);
            } else {
                _Pragma("omp simd reduction(+ : s)") for (int64_t i = 0; i < m; i++) s += q[i];
            }
            acc += s;
        }
        if (k == RED_MEAN) acc /= (double)n;
        else if (k == RED_L2) acc = sqrt(acc);
        *y = (float)acc;
        return 1;
    }
    case RED_MAX: case RED_MIN: {
        float m = p[0];
        int nan = 0;
        if (k == RED_MAX) {
            _Pragma("omp simd reduction(max : m) reduction(| : nan)") for (int64_t i = 0; i < n; i++) {
                m = p[i] > m ? p[i] : m;
                nan |= p[i] != p[i];
            }
        } else {
            _Pragma("omp simd reduction(min : m) reduction(| : nan)") for (int64_t i = 0; i < n; i++) {
                m = p[i] < m ? p[i] : m;
                nan |= p[i] != p[i];
            }
        }
        *y = nan ? NAN : m;
        return 1;
    }
    default: return 0;
    }
}
#define FAST_F32(x, g, base, k, y) red_fast_f32(x, g, base, k, y)
#define FAST_NONE(x, g, base, k, y) 0

static inline double sat_d(double v, double lo, double hi) { return v != v ? 0 : v < lo ? lo : v > hi ? hi : v; }

/* One instantiation per input dtype. ACC is the accumulator of the exact
 * reductions (sum, product, extrema); LD loads an element as ACC, STA stores
 * an ACC, STD stores a double (L2, logs, means of floats). */
#define DEF_REDUCE(suf, T, ACC, LD, STA, STD, LOWEST, HIGHEST, ISFLOAT, ADD, MUL, FAST)                             \
    static void red_one_##suf(const T *x, const struct red_geom *g, int64_t o, enum red_kind k, T *y) {             \
        const int64_t base = red_base(g, o);                                                                        \
        if (FAST(x, g, base, k, y + o)) return;                                                                     \
        ACC acc;                                                                                                    \
        double dacc = 0;                                                                                            \
        switch (k) {                                                                                                \
        case RED_SUM:                                                                                               \
        case RED_MEAN:                                                                                              \
            acc = 0;                                                                                                \
            RED_WALK(g, base, acc = ADD(acc, LD(x[off])));                                                          \
            if (k == RED_SUM) STA(y[o], acc);                                                                       \
            else if (ISFLOAT) STD(y[o], (double)acc / (double)g->nred);                                             \
            else STA(y[o], g->nred ? (ACC)(acc / (ACC)g->nred) : (ACC)0);                                           \
            return;                                                                                                 \
        case RED_SUMSQ:                                                                                             \
            acc = 0;                                                                                                \
            RED_WALK(g, base, { ACC v_ = LD(x[off]); acc = ADD(acc, MUL(v_, v_)); });                               \
            STA(y[o], acc);                                                                                         \
            return;                                                                                                 \
        case RED_L1:                                                                                                \
            acc = 0;                                                                                                \
            RED_WALK(g, base, { ACC v_ = LD(x[off]); acc = ADD(acc, RED_ABS(v_)); });                               \
            STA(y[o], acc);                                                                                         \
            return;                                                                                                 \
        case RED_PROD:                                                                                              \
            acc = 1;                                                                                                \
            RED_WALK(g, base, acc = MUL(acc, LD(x[off])));                                                          \
            STA(y[o], acc);                                                                                         \
            return;                                                                                                 \
        case RED_MAX:                                                                                               \
            acc = LOWEST;                                                                                           \
            RED_WALK(g, base, { ACC v_ = LD(x[off]); if (v_ > acc || v_ != v_) acc = v_; });                        \
            STA(y[o], acc);                                                                                         \
            return;                                                                                                 \
        case RED_MIN:                                                                                               \
            acc = HIGHEST;                                                                                          \
            RED_WALK(g, base, { ACC v_ = LD(x[off]); if (v_ < acc || v_ != v_) acc = v_; });                        \
            STA(y[o], acc);                                                                                         \
            return;                                                                                                 \
        case RED_L2:                                                                                                \
            RED_WALK(g, base, { double v_ = (double)LD(x[off]); dacc += v_ * v_; });                                \
            STD(y[o], sqrt(dacc));                                                                                  \
            return;                                                                                                 \
        case RED_LOGSUM:                                                                                            \
            RED_WALK(g, base, dacc += (double)LD(x[off]));                                                          \
            STD(y[o], log(dacc));                                                                                   \
            return;                                                                                                 \
        case RED_LOGSUMEXP: {                                                                                       \
            double m = -INFINITY;                                                                                   \
            RED_WALK(g, base, { double v_ = (double)LD(x[off]); if (v_ > m) m = v_; });                             \
            if (isinf(m)) {                                                                                         \
                STD(y[o], m);                                                                                       \
                return;                                                                                             \
            }                                                                                                       \
            RED_WALK(g, base, dacc += exp((double)LD(x[off]) - m));                                                 \
            STD(y[o], m + log(dacc));                                                                               \
            return;                                                                                                 \
        }                                                                                                           \
        }                                                                                                           \
    }                                                                                                               \
    static void red_##suf(const T *x, T *y, const struct red_geom *g, enum red_kind k, int nt) {                    \
        if (g->nout * (g->nred ? g->nred : 1) < EW_PAR_MIN || nt <= 1 || g->nout < 2) {                             \
            for (int64_t o = 0; o < g->nout; o++) red_one_##suf(x, g, o, k, y);                                     \
            return;                                                                                                 \
        }                                                                                                           \
        _Pragma("omp parallel for num_threads(nt) schedule(static)")                                                \
        for (int64_t o = 0; o < g->nout; o++) red_one_##suf(x, g, o, k, y);                                         \
    }

#define LD_ID(v) (v)
/* Float sums are plain; integer ones wrap (through uint64) instead of
 * overflowing into undefined behaviour. */
#define FADD(a, b) ((a) + (b))
#define FMUL(a, b) ((a) * (b))
#define IADD(a, b) ((int64_t)((uint64_t)(a) + (uint64_t)(b)))
#define IMUL(a, b) ((int64_t)((uint64_t)(a) * (uint64_t)(b)))
#define UADD(a, b) ((a) + (b))
#define UMUL(a, b) ((a) * (b))
#define LD_H(v) ((double)fp16_to_fp32(v))
#define LD_BH(v) ((double)bf16_to_fp32(v))
#define ST_F32(dst, v) ((dst) = (float)(v))
#define ST_F64(dst, v) ((dst) = (double)(v))
#define ST_H(dst, v) ((dst) = fp32_to_fp16((float)(v)))
#define ST_BH(dst, v) ((dst) = fp32_to_bf16((float)(v)))
#define ST_I8(dst, v) ((dst) = (int8_t)(v))
#define ST_I16(dst, v) ((dst) = (int16_t)(v))
#define ST_I32(dst, v) ((dst) = (int32_t)(v))
#define ST_I64(dst, v) ((dst) = (int64_t)(v))
#define ST_U8(dst, v) ((dst) = (uint8_t)(v))
#define ST_U16(dst, v) ((dst) = (uint16_t)(v))
#define ST_U32(dst, v) ((dst) = (uint32_t)(v))
#define ST_U64(dst, v) ((dst) = (uint64_t)(v))
#define SD_I8(dst, v) ((dst) = (int8_t)sat_d(v, INT8_MIN, INT8_MAX))
#define SD_I16(dst, v) ((dst) = (int16_t)sat_d(v, INT16_MIN, INT16_MAX))
#define SD_I32(dst, v) ((dst) = (int32_t)sat_d(v, INT32_MIN, INT32_MAX))
#define SD_I64(dst, v) ((dst) = (int64_t)sat_d(v, -9223372036854775808.0, 9223372036854774784.0))
#define SD_U8(dst, v) ((dst) = (uint8_t)sat_d(v, 0, UINT8_MAX))
#define SD_U16(dst, v) ((dst) = (uint16_t)sat_d(v, 0, UINT16_MAX))
#define SD_U32(dst, v) ((dst) = (uint32_t)sat_d(v, 0, UINT32_MAX))
#define SD_U64(dst, v) ((dst) = (uint64_t)sat_d(v, 0, 18446744073709549568.0))

DEF_REDUCE(f32, float, double, LD_ID, ST_F32, ST_F32, -INFINITY, INFINITY, 1, FADD, FMUL, FAST_F32)
DEF_REDUCE(f64, double, double, LD_ID, ST_F64, ST_F64, -INFINITY, INFINITY, 1, FADD, FMUL, FAST_NONE)
DEF_REDUCE(f16, uint16_t, double, LD_H, ST_H, ST_H, -INFINITY, INFINITY, 1, FADD, FMUL, FAST_NONE)
DEF_REDUCE(bf16, uint16_t, double, LD_BH, ST_BH, ST_BH, -INFINITY, INFINITY, 1, FADD, FMUL, FAST_NONE)
DEF_REDUCE(i8, int8_t, int64_t, LD_ID, ST_I8, SD_I8, INT8_MIN, INT8_MAX, 0, IADD, IMUL, FAST_NONE)
DEF_REDUCE(i16, int16_t, int64_t, LD_ID, ST_I16, SD_I16, INT16_MIN, INT16_MAX, 0, IADD, IMUL, FAST_NONE)
DEF_REDUCE(i32, int32_t, int64_t, LD_ID, ST_I32, SD_I32, INT32_MIN, INT32_MAX, 0, IADD, IMUL, FAST_NONE)
DEF_REDUCE(i64, int64_t, int64_t, LD_ID, ST_I64, SD_I64, INT64_MIN, INT64_MAX, 0, IADD, IMUL, FAST_NONE)
DEF_REDUCE(u8, uint8_t, uint64_t, LD_ID, ST_U8, SD_U8, 0, UINT8_MAX, 0, UADD, UMUL, FAST_NONE)
DEF_REDUCE(u16, uint16_t, uint64_t, LD_ID, ST_U16, SD_U16, 0, UINT16_MAX, 0, UADD, UMUL, FAST_NONE)
DEF_REDUCE(u32, uint32_t, uint64_t, LD_ID, ST_U32, SD_U32, 0, UINT32_MAX, 0, UADD, UMUL, FAST_NONE)
DEF_REDUCE(u64, uint64_t, uint64_t, LD_ID, ST_U64, SD_U64, 0, UINT64_MAX, 0, UADD, UMUL, FAST_NONE)

/* Item it of red_rows_f32: RED_BLOCK outputs (fewer at the end of a row)
 * of outer row it / nchunk. */
static inline __attribute__((always_inline)) void red_rows_body(const float *x, float *y, const struct red_geom *g,
                                                                enum red_kind k, int64_t it, int64_t nchunk) {
    const int64_t kin = g->kdims[g->nk - 1], rows = g->rdims[0], rst = g->rstr[0];
    const int64_t oo = it / nchunk, j0 = (it % nchunk) * RED_BLOCK;
    const int64_t m = kin - j0 < RED_BLOCK ? kin - j0 : RED_BLOCK;
    /* the first output of this chunk locates its input base */
    const int64_t base = red_base(g, oo * kin + j0);
    double acc[RED_BLOCK];
    int nan[RED_BLOCK];
    for (int64_t j = 0; j < m; j++) {
        acc[j] = k == RED_MAX ? -INFINITY : k == RED_MIN ? INFINITY : 0;
        nan[j] = 0;
    }
    for (int64_t r = 0; r < rows; r++) {
        const float *p = x + base + r * rst;
        switch (k) {
        case RED_MAX:
            for (int64_t j = 0; j < m; j++) {
                acc[j] = p[j] > acc[j] ? p[j] : acc[j];
                nan[j] |= p[j] != p[j];
            }
            break;
        case RED_MIN:
            for (int64_t j = 0; j < m; j++) {
                acc[j] = p[j] < acc[j] ? p[j] : acc[j];
                nan[j] |= p[j] != p[j];
            }
            break;
        case RED_SUMSQ: case RED_L2:
            _Pragma("omp simd") for (int64_t j = 0; j < m; j++) acc[j] += (double)p[j] * p[j];
            break;
        case RED_L1:
            _Pragma("omp simd") for (int64_t j = 0; j < m; j++) acc[j] += fabs((double)p[j]);
            break;
        default:
            _Pragma("omp simd") for (int64_t j = 0; j < m; j++) acc[j] += p[j];
            break;
        }
    }
    float *q = y + oo * kin + j0;
    for (int64_t j = 0; j < m; j++) {
        double v = acc[j];
        if (k == RED_MEAN) v /= (double)rows;
        else if (k == RED_L2) v = sqrt(v);
        q[j] = nan[j] ? NAN : (float)v;
    }
}

/* The body built per ISA: the double accumulators take 2 floats a vector
 * in the baseline's SSE, 8 with AVX-512 (EfficientNet's squeeze-excitation
 * means over channels-last maps, 16 of them, were 0.43 ms a run). */
DNNL_UTIL_ISA_CLONES(red_rows_item, red_rows_body,
                     (const float *x, float *y, const struct red_geom *g, enum red_kind k, int64_t it, int64_t nchunk),
                     (x, y, g, k, it, nchunk))

/* float data reduced across rows whose kept innermost run is contiguous
 * ([..., R, K] reduced over R, e.g. a sum over the batch or channels of
 * NHWC): accumulate whole rows of K at a time instead of walking each
 * output's column with a stride of K. Returns 0 if the layout or the
 * reduction does not fit. */
static int red_rows_f32(const float *x, float *y, const struct red_geom *g, enum red_kind k, int nt) {
    if (g->nr != 1 || g->nk < 1 || g->kstr[g->nk - 1] != 1) return 0;
    if (k == RED_PROD || k == RED_LOGSUM || k == RED_LOGSUMEXP) return 0;
    const int64_t kin = g->kdims[g->nk - 1], rows = g->rdims[0];
    if (kin < 4 || rows < 2) return 0;
    const int64_t nouter = g->nout / kin, nchunk = (kin + RED_BLOCK - 1) / RED_BLOCK;
    const int64_t items = nouter * nchunk;
    const int par = g->nout * rows >= EW_PAR_MIN && items > 1;
    PAR_FOR(par, nt, schedule(static),
        for (int64_t it = 0; it < items; it++) red_rows_item(x, y, g, k, it, nchunk););
    return 1;
}

/* A reduction as prepare decodes it: the kind (from the op type), the axes
 * (attribute or constant input) and the coalesced geometry. */
struct red_params {
    enum red_kind kind;
    struct red_geom g;
};

static int red_prepare(struct op_call *c, void **state, size_t *scratch) {
    int kind = red_kind_of(c->node);
    if (kind < 0) return op_error(c, "not a reduction");
    struct red_params *p = op_params_alloc(c, sizeof *p);
    if (!p) return STATUS_NOMEM;
    int rc = red_axes(c, c->in[0], &p->g);
    if (rc) {
        op_params_free(p);
        return rc;
    }
    p->kind = (enum red_kind)kind;
    /* X stored channels-last (kiln_layout 1 from models/passes_layout.c,
     * which marks a reduction over H and W only: ConvNeXt's head): the walk
     * follows the NHWC memory, and the kept N and C come out in the
     * output's order. */
    struct tensor xv = *c->in[0];
    if (layout_of(c->node) == 1) {
        int *r = p->g.red;
        if (xv.ndim != 4 || r[0] || r[1] || !r[2] || !r[3]) {
            op_params_free(p);
            return op_error(c, "kiln_layout 1 needs a 4-D input reduced over H and W only");
        }
        layout_nhwc_view(&xv, c->in[0]);
        r[1] = 1;
        r[3] = 0;
    }
    red_coalesce(&xv, &p->g);
    *state = p;
    return 0;
}

static int red_run(struct op_call *c) {
    const struct red_params *p = c->state;
    const struct tensor *x = c->in[0];
    struct tensor *o = c->out[0];
    const struct red_geom *g = &p->g;
    if (g->nout <= 0) return 0;
    if (tensor_numel(o) != g->nout) return op_error(c, "output has %lld elements, expected %lld",
                                                   (long long)tensor_numel(o), (long long)g->nout);
    enum red_kind k = p->kind;
    int nt = c->nthreads;
    switch (x->dtype) {
    case DT_FP32:
        if (!red_rows_f32(x->data, o->data, g, k, nt)) red_f32(x->data, o->data, g, k, nt);
        break;
    case DT_FP64: red_f64(x->data, o->data, g, k, nt); break;
    case DT_FP16: red_f16(x->data, o->data, g, k, nt); break;
    case DT_BF16: red_bf16(x->data, o->data, g, k, nt); break;
    case DT_INT8: red_i8(x->data, o->data, g, k, nt); break;
    case DT_INT16: red_i16(x->data, o->data, g, k, nt); break;
    case DT_INT32: red_i32(x->data, o->data, g, k, nt); break;
    case DT_INT64: red_i64(x->data, o->data, g, k, nt); break;
    case DT_UINT8: case DT_BOOL: red_u8(x->data, o->data, g, k, nt); break;
    case DT_UINT16: red_u16(x->data, o->data, g, k, nt); break;
    case DT_UINT32: red_u32(x->data, o->data, g, k, nt); break;
    case DT_UINT64: red_u64(x->data, o->data, g, k, nt); break;
    default:
        op_error(c, "dtype %s is not supported by this operator", dtype_name(x->dtype));
        return STATUS_UNSUPPORTED;
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * ArgMax / ArgMin: int64 indices along one axis; ties go to the first
 * occurrence unless select_last_index.
 * ------------------------------------------------------------------------ */

static int arg_geometry(struct op_call *c, const struct tensor *x, int *axis, int64_t *outer, int64_t *len,
                        int64_t *inner) {
    int ax = op_axis(c, node_attr_int(c->node, "axis", 0), x->ndim);
    if (ax < 0) return STATUS_INVALID;
    *axis = ax;
    *outer = *len = *inner = 1;
    for (int i = 0; i < x->ndim; i++) {
        if (i < ax) *outer *= x->dims[i];
        else if (i == ax) *len = x->dims[i];
        else *inner *= x->dims[i];
    }
    return 0;
}

static int arg_infer(struct op_call *c) {
    if (c->nin < 1 || !c->in[0]) return op_error(c, "input 0 (data) is required");
    if (c->nout < 1 || !c->out[0]) return op_error(c, "output 0 is required");
    const struct tensor *x = c->in[0];
    if (x->ndim < 0) return op_error(c, "input 0 has no known rank");
    if (!ew_is_number(x->dtype)) {
        op_error(c, "dtype %s is not supported by this operator", dtype_name(x->dtype));
        return STATUS_UNSUPPORTED;
    }
    int axis;
    int64_t outer, len, inner;
    int rc = arg_geometry(c, x, &axis, &outer, &len, &inner);
    if (rc) return rc;
    if (x->ndim > 0 && x->dims[axis] == 0) return op_error(c, "cannot take the arg of an empty axis");
    int keep = node_attr_int(c->node, "keepdims", 1) != 0;
    struct tensor *o = c->out[0];
    o->dtype = DT_INT64;
    o->ndim = 0;
    for (int i = 0; i < x->ndim; i++) {
        if (i != axis) o->dims[o->ndim++] = x->dims[i];
        else if (keep) o->dims[o->ndim++] = 1;
    }
    return 0;
}

#define DEF_ARG(suf, T, LD)                                                                                         \
    static void arg_##suf(const T *x, int64_t *y, int64_t outer, int64_t len, int64_t inner, int is_max,            \
                          int last) {                                                                               \
        for (int64_t o = 0; o < outer; o++)                                                                         \
            for (int64_t i = 0; i < inner; i++) {                                                                   \
                const T *p = x + o * len * inner + i;                                                               \
                int64_t best = 0;                                                                                   \
                __typeof__(+LD(p[0])) bv = LD(p[0]);                                                                \
                for (int64_t j = 1; j < len; j++) {                                                                 \
                    __typeof__(+LD(p[0])) v = LD(p[j * inner]);                                                     \
                    int better = is_max ? (last ? v >= bv : v > bv) : (last ? v <= bv : v < bv);                    \
                    if (better) {                                                                                   \
                        bv = v;                                                                                     \
                        best = j;                                                                                   \
                    }                                                                                               \
                }                                                                                                   \
                y[o * inner + i] = best;                                                                            \
            }                                                                                                       \
    }
#define LD_F16(v) fp16_to_fp32(v)
#define LD_BF16(v) bf16_to_fp32(v)
DEF_ARG(f32, float, LD_ID)
DEF_ARG(f64, double, LD_ID)
DEF_ARG(f16, uint16_t, LD_F16)
DEF_ARG(bf16, uint16_t, LD_BF16)
DEF_ARG(i8, int8_t, LD_ID)
DEF_ARG(i16, int16_t, LD_ID)
DEF_ARG(i32, int32_t, LD_ID)
DEF_ARG(i64, int64_t, LD_ID)
DEF_ARG(u8, uint8_t, LD_ID)
DEF_ARG(u16, uint16_t, LD_ID)
DEF_ARG(u32, uint32_t, LD_ID)
DEF_ARG(u64, uint64_t, LD_ID)

struct arg_params {
    int64_t outer, len, inner;
    int is_max, last;
};

static int arg_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct arg_params *p = op_params_alloc(c, sizeof *p);
    if (!p) return STATUS_NOMEM;
    int axis;
    int rc = arg_geometry(c, c->in[0], &axis, &p->outer, &p->len, &p->inner);
    if (rc) {
        op_params_free(p);
        return rc;
    }
    p->is_max = strcmp(c->node->op_type, "ArgMax") == 0;
    p->last = node_attr_int(c->node, "select_last_index", 0) != 0;
    *state = p;
    return 0;
}

static int arg_run(struct op_call *c) {
    const struct arg_params *p = c->state;
    const struct tensor *x = c->in[0];
    int64_t outer = p->outer, len = p->len, inner = p->inner;
    int is_max = p->is_max, last = p->last;
    if (outer * inner == 0) return 0;
    if (len <= 0) return op_error(c, "cannot take the arg of an empty axis");
    int64_t *y = c->out[0]->data;
    switch (x->dtype) {
    case DT_FP32: arg_f32(x->data, y, outer, len, inner, is_max, last); break;
    case DT_FP64: arg_f64(x->data, y, outer, len, inner, is_max, last); break;
    case DT_FP16: arg_f16(x->data, y, outer, len, inner, is_max, last); break;
    case DT_BF16: arg_bf16(x->data, y, outer, len, inner, is_max, last); break;
    case DT_INT8: arg_i8(x->data, y, outer, len, inner, is_max, last); break;
    case DT_INT16: arg_i16(x->data, y, outer, len, inner, is_max, last); break;
    case DT_INT32: arg_i32(x->data, y, outer, len, inner, is_max, last); break;
    case DT_INT64: arg_i64(x->data, y, outer, len, inner, is_max, last); break;
    case DT_UINT8: arg_u8(x->data, y, outer, len, inner, is_max, last); break;
    case DT_UINT16: arg_u16(x->data, y, outer, len, inner, is_max, last); break;
    case DT_UINT32: arg_u32(x->data, y, outer, len, inner, is_max, last); break;
    case DT_UINT64: arg_u64(x->data, y, outer, len, inner, is_max, last); break;
    default:
        op_error(c, "dtype %s is not supported by this operator", dtype_name(x->dtype));
        return STATUS_UNSUPPORTED;
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * Float element access for the ops below (float, double, half types).
 * ------------------------------------------------------------------------ */

static int flt_dtype(enum dtype dt) { return dt == DT_FP32 || dt == DT_FP64 || dt == DT_FP16 || dt == DT_BF16; }

static inline double fld(const void *p, enum dtype dt, int64_t i) {
    switch (dt) {
    case DT_FP32: return ((const float *)p)[i];
    case DT_FP64: return ((const double *)p)[i];
    case DT_FP16: return fp16_to_fp32(((const uint16_t *)p)[i]);
    default: return bf16_to_fp32(((const uint16_t *)p)[i]);
    }
}

static inline void fst(void *p, enum dtype dt, int64_t i, double v) {
    switch (dt) {
    case DT_FP32: ((float *)p)[i] = (float)v; break;
    case DT_FP64: ((double *)p)[i] = v; break;
    case DT_FP16: ((uint16_t *)p)[i] = fp32_to_fp16((float)v); break;
    default: ((uint16_t *)p)[i] = fp32_to_bf16((float)v); break;
    }
}

static int need_float(struct op_call *c, const struct tensor *t, const char *what) {
    if (t->ndim < 0) return op_error(c, "%s has no known rank", what);
    if (!flt_dtype(t->dtype)) {
        op_error(c, "%s has dtype %s; this operator takes float, double, float16 or bfloat16", what,
                 dtype_name(t->dtype));
        return STATUS_UNSUPPORTED;
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss, as ONNX's
 * reference computes them: input [N, C, d1...], target [N, d1...] of class
 * indices, optional per-class weight [C]; ignore_index entries weigh 0;
 * reduction "none", "sum" or "mean" (weighted mean when weights apply).
 * ------------------------------------------------------------------------ */

enum loss_red { LOSS_NONE, LOSS_SUM, LOSS_MEAN };

static int loss_reduction(struct op_call *c, enum loss_red *r) {
    const char *s = node_attr_str(c->node, "reduction", "mean");
    if (strcmp(s, "none") == 0) *r = LOSS_NONE;
    else if (strcmp(s, "sum") == 0) *r = LOSS_SUM;
    else if (strcmp(s, "mean") == 0) *r = LOSS_MEAN;
    else return op_error(c, "attribute 'reduction' must be \"none\", \"sum\" or \"mean\", got \"%s\"", s);
    return 0;
}

static int loss_infer(struct op_call *c, int softmax) {
    if (c->nin < 2 || !c->in[0] || !c->in[1]) return op_error(c, "inputs 0 (scores) and 1 (labels) are required");
    if (c->nout < 1 || !c->out[0]) return op_error(c, "output 0 is required");
    const struct tensor *x = c->in[0], *t = c->in[1], *w = in_opt(c, 2);
    int rc = need_float(c, x, "input 0");
    if (rc) return rc;
    if (t->dtype != DT_INT64 && t->dtype != DT_INT32)
        return op_error(c, "labels must be int32 or int64, got %s", dtype_name(t->dtype));
    if (x->ndim < 2) return op_error(c, "scores must have rank >= 2 ([N, C, ...]), got rank %d", x->ndim);
    if (t->ndim != x->ndim - 1 || t->dims[0] != x->dims[0])
        return op_error(c, "labels must have shape [N, d1...] matching scores [N, C, d1...]");
    for (int i = 2; i < x->ndim; i++)
        if (t->dims[i - 1] != x->dims[i])
            return op_error(c, "labels dim %d is %lld but scores dim %d is %lld", i - 1, (long long)t->dims[i - 1],
                            i, (long long)x->dims[i]);
    if (w && (w->dtype != x->dtype || w->ndim != 1 || w->dims[0] != x->dims[1]))
        return op_error(c, "weights must be a [C] tensor of the scores' dtype");
    enum loss_red red;
    if ((rc = loss_reduction(c, &red))) return rc;
    struct tensor *o = c->out[0];
    o->dtype = x->dtype;
    if (red == LOSS_NONE) {
        o->ndim = t->ndim;
        for (int i = 0; i < t->ndim; i++) o->dims[i] = t->dims[i];
    } else {
        o->ndim = 0;
    }
    struct tensor *lp = c->nout > 1 ? c->out[1] : NULL;
    if (lp) {
        if (!softmax) return op_error(c, "has one output");
        lp->dtype = x->dtype;
        lp->ndim = x->ndim;
        for (int i = 0; i < x->ndim; i++) lp->dims[i] = x->dims[i];
    }
    return 0;
}

struct loss_params {
    enum loss_red red;
    int has_ii;
    int64_t ii; /* ignore_index, when has_ii */
};

static int loss_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct loss_params *p = op_params_alloc(c, sizeof *p);
    if (!p) return STATUS_NOMEM;
    int rc = loss_reduction(c, &p->red);
    if (rc) {
        op_params_free(p);
        return rc;
    }
    const struct graph_attr *iia = node_attr(c->node, "ignore_index");
    p->has_ii = iia != NULL;
    p->ii = p->has_ii ? iia->i : 0;
    *state = p;
    return 0;
}

static int loss_run(struct op_call *c, int softmax) {
    const struct loss_params *p = c->state;
    const struct tensor *x = c->in[0], *t = c->in[1], *w = in_opt(c, 2);
    struct tensor *o = c->out[0], *lp = c->nout > 1 ? c->out[1] : NULL;
    const enum loss_red red = p->red;
    const int has_ii = p->has_ii;
    const int64_t ii = p->ii;
    /* ONNX's reference weighs the mean by the gathered weights when there
     * are weights, or (Softmax...) an ignore_index, or (NLL) an
     * ignore_index other than -1. */
    int weighted = w || (softmax ? has_ii : !(has_ii && ii == -1));
    const int64_t n = x->dims[0], nc = x->dims[1];
    int64_t d = 1;
    for (int i = 2; i < x->ndim; i++) d *= x->dims[i];
    enum dtype dt = x->dtype;
    double sum = 0, wsum = 0;
    for (int64_t b = 0; b < n; b++)
        for (int64_t k = 0; k < d; k++) {
            const int64_t base = b * nc * d + k; /* element (b, 0, k) of the scores */
            double m = 0, lse = 0;
            if (softmax && nc > 0) {
                m = fld(x->data, dt, base);
                for (int64_t j = 1; j < nc; j++) m = fmax(m, fld(x->data, dt, base + j * d));
                for (int64_t j = 0; j < nc; j++) lse += exp(fld(x->data, dt, base + j * d) - m);
                lse = log(lse);
                if (lp)
                    for (int64_t j = 0; j < nc; j++)
                        fst(lp->data, dt, base + j * d, fld(x->data, dt, base + j * d) - m - lse);
            }
            int64_t label = op_int_at(t, b * d + k);
            double loss = 0, wt = 1;
            if (has_ii && label == ii) {
                wt = 0;
            } else {
                if (label < 0 || label >= nc)
                    return op_error(c, "label %lld at position %lld is outside [0, %lld)", (long long)label,
                                    (long long)(b * d + k), (long long)nc);
                double v = fld(x->data, dt, base + label * d);
                if (softmax) v = v - m - lse;
                if (w) wt = fld(w->data, dt, label);
                loss = -v * wt;
            }
            if (red == LOSS_NONE) fst(o->data, dt, b * d + k, loss);
            sum += loss;
            wsum += wt;
        }
    if (red == LOSS_SUM) fst(o->data, dt, 0, sum);
    else if (red == LOSS_MEAN) fst(o->data, dt, 0, weighted ? sum / wsum : sum / (double)(n * d));
    return 0;
}

static int nll_infer(struct op_call *c) { return loss_infer(c, 0); }
static int nll_run(struct op_call *c) { return loss_run(c, 0); }
static int sce_infer(struct op_call *c) { return loss_infer(c, 1); }
static int sce_run(struct op_call *c) { return loss_run(c, 1); }

/* ------------------------------------------------------------------------
 * LpNormalization: x / ||x||_p along one axis (p 1 or 2); a zero norm
 * gives 0, as ONNX's reference does.
 * ------------------------------------------------------------------------ */

static int lpn_params(struct op_call *c, const struct tensor *x, int64_t *outer, int64_t *len, int64_t *inner,
                      int *p) {
    int ax = op_axis(c, node_attr_int(c->node, "axis", -1), x->ndim);
    if (ax < 0) return STATUS_INVALID;
    int64_t pv = node_attr_int(c->node, "p", 2);
    if (pv != 1 && pv != 2) return op_error(c, "attribute 'p' must be 1 or 2, got %lld", (long long)pv);
    *p = (int)pv;
    *outer = *len = *inner = 1;
    for (int i = 0; i < x->ndim; i++) {
        if (i < ax) *outer *= x->dims[i];
        else if (i == ax) *len = x->dims[i];
        else *inner *= x->dims[i];
    }
    return 0;
}

static int lpn_infer(struct op_call *c) {
    if (c->nin < 1 || !c->in[0]) return op_error(c, "input 0 is required");
    if (c->nout < 1 || !c->out[0]) return op_error(c, "output 0 is required");
    const struct tensor *x = c->in[0];
    int rc = need_float(c, x, "input");
    if (rc) return rc;
    int64_t o, l, i;
    int p;
    if ((rc = lpn_params(c, x, &o, &l, &i, &p))) return rc;
    *c->out[0] = (struct tensor){x->dtype, x->ndim, {0}, NULL};
    for (int k = 0; k < x->ndim; k++) c->out[0]->dims[k] = x->dims[k];
    return 0;
}

struct lpn_params {
    int64_t outer, len, inner;
    int p;
};

static int lpn_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct lpn_params *p = op_params_alloc(c, sizeof *p);
    if (!p) return STATUS_NOMEM;
    int rc = lpn_params(c, c->in[0], &p->outer, &p->len, &p->inner, &p->p);
    if (rc) {
        op_params_free(p);
        return rc;
    }
    *state = p;
    return 0;
}

static int lpn_run(struct op_call *c) {
    const struct lpn_params *lp = c->state;
    const struct tensor *x = c->in[0];
    const int64_t outer = lp->outer, len = lp->len, inner = lp->inner;
    const int p = lp->p;
    enum dtype dt = x->dtype;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            const int64_t base = o * len * inner + i;
            double norm = 0;
            for (int64_t j = 0; j < len; j++) {
                double v = fld(x->data, dt, base + j * inner);
                norm += p == 1 ? fabs(v) : v * v;
            }
            if (p == 2) norm = sqrt(norm);
            for (int64_t j = 0; j < len; j++)
                fst(c->out[0]->data, dt, base + j * inner, norm == 0 ? 0 : fld(x->data, dt, base + j * inner) / norm);
        }
    return 0;
}

/* ------------------------------------------------------------------------
 * MeanVarianceNormalization: (x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9)
 * over `axes` (default [0, 2, 3]).
 * ------------------------------------------------------------------------ */

static int mvn_geom(struct op_call *c, const struct tensor *x, struct red_geom *g) {
    const int64_t *a;
    int na = node_attr_ints(c->node, "axes", &a);
    static const int64_t def[] = {0, 2, 3};
    if (na < 0) {
        a = def;
        na = 3;
    }
    memset(g, 0, sizeof *g);
    for (int i = 0; i < na; i++) {
        int ax = op_axis(c, a[i], x->ndim);
        if (ax < 0) return STATUS_INVALID;
        g->red[ax] = 1;
    }
    red_coalesce(x, g);
    return 0;
}

static int mvn_infer(struct op_call *c) {
    if (c->nin < 1 || !c->in[0]) return op_error(c, "input 0 is required");
    if (c->nout < 1 || !c->out[0]) return op_error(c, "output 0 is required");
    const struct tensor *x = c->in[0];
    int rc = need_float(c, x, "input");
    if (rc) return rc;
    struct red_geom g;
    if ((rc = mvn_geom(c, x, &g))) return rc;
    *c->out[0] = (struct tensor){x->dtype, x->ndim, {0}, NULL};
    for (int k = 0; k < x->ndim; k++) c->out[0]->dims[k] = x->dims[k];
    return 0;
}

static int mvn_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct red_geom *g = op_params_alloc(c, sizeof *g);
    if (!g) return STATUS_NOMEM;
    int rc = mvn_geom(c, c->in[0], g);
    if (rc) {
        op_params_free(g);
        return rc;
    }
    *state = g;
    return 0;
}

static int mvn_run(struct op_call *c) {
    const struct tensor *x = c->in[0];
    const struct red_geom *g = c->state;
    if (g->nred <= 0) return 0;
    enum dtype dt = x->dtype;
    const void *xd = x->data;
    void *yd = c->out[0]->data;
    for (int64_t o = 0; o < g->nout; o++) {
        const int64_t base = red_base(g, o);
        double s = 0, s2 = 0;
        RED_WALK(g, base, {
            double v = fld(xd, dt, off);
            s += v;
            s2 += v * v;
        });
        double mean = s / (double)g->nred, var = s2 / (double)g->nred - mean * mean;
        double den = sqrt(var > 0 ? var : 0) + 1e-9;
        RED_WALK(g, base, fst(yd, dt, off, (fld(xd, dt, off) - mean) / den));
    }
    return 0;
}

const struct op_def op_defs_reduce[] = {
    {"ReduceSum", "", red_infer, red_prepare, red_run, op_params_free, 0},
    {"ReduceMean", "", red_infer, red_prepare, red_run, op_params_free, 0},
    {"ReduceMax", "", red_infer, red_prepare, red_run, op_params_free, 0},
    {"ReduceMin", "", red_infer, red_prepare, red_run, op_params_free, 0},
    {"ReduceProd", "", red_infer, red_prepare, red_run, op_params_free, 0},
    {"ReduceL1", "", red_infer, red_prepare, red_run, op_params_free, 0},
    {"ReduceL2", "", red_infer, red_prepare, red_run, op_params_free, 0},
    {"ReduceLogSum", "", red_infer, red_prepare, red_run, op_params_free, 0},
    {"ReduceLogSumExp", "", red_infer, red_prepare, red_run, op_params_free, 0},
    {"ReduceSumSquare", "", red_infer, red_prepare, red_run, op_params_free, 0},
    {"ArgMax", "", arg_infer, arg_prepare, arg_run, op_params_free, 0},
    {"ArgMin", "", arg_infer, arg_prepare, arg_run, op_params_free, 0},
    {"NegativeLogLikelihoodLoss", "", nll_infer, loss_prepare, nll_run, op_params_free, 0},
    {"SoftmaxCrossEntropyLoss", "", sce_infer, loss_prepare, sce_run, op_params_free, 0},
    {"LpNormalization", "", lpn_infer, lpn_prepare, lpn_run, op_params_free, 0},
    {"MeanVarianceNormalization", "", mvn_infer, mvn_prepare, mvn_run, op_params_free, 0},
    {0},
};
