/* ops_softmax_fused.c - the masked softmax of exported attention as one
 * pass: Y = softmax(scale * X + Mask) over the last axis, with the rows
 * whose softmax is NaN made zeros on request. models/passes.c rewrites
 *   X -> [Mul/Div by a scalar] -> [Add(Mask)] -> Softmax(last axis)
 *   -> [Where(IsNaN(p), 0, p)]
 * into it. Unfused, the scores ([batch, heads, queries, keys], the largest
 * tensor of a transformer) go through memory once per op; here once.
 *
 * Node kiln.MaskedSoftmax: inputs X, optional Mask (numpy broadcast with
 * X); attributes scale (float, 1) and nan_to_zero (int, 0). The output has
 * the broadcast shape of X and Mask. */
/* The exponential's clamps are comparisons: without trapping math
 * GCC turns them into selects and vectorizes the loops (the results are the
 * same; only floating-point exception flags could differ). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <omp.h>

#include "kernels/cpu/dnnl_util.h"
#include "kernels/cpu/elementwise_util.h"
#include "kernels/cpu/params_util.h"
#include "kernels/cpu/shape_util.h"
#include "kernels/ops.h"

struct msm_params;
typedef void (*msm_row_fn)(const struct msm_params *p, const float *x, const float *m, float *y);

struct msm_params {
    msm_row_fn row;                  /* msm_row built for the CPU's vector width */
    int nd;                          /* axes of the output before the last */
    int64_t dims[TENSOR_MAX_DIMS];
    int64_t xstr[TENSOR_MAX_DIMS];   /* X's element stride per such axis, 0 broadcast */
    int64_t mstr[TENSOR_MAX_DIMS];   /* Mask's */
    int64_t rows, n;                 /* output rows and row length */
    int64_t xcs, mcs;                /* X's and Mask's stride along the row: 1, or 0 broadcast */
    int has_mask;
    float scale;
    int nan_to_zero;
};

/* Output shape of X and Mask broadcast; fills the walk. */
static int msm_geometry(struct op_call *c, struct msm_params *p, int64_t *out_dims, int *out_nd) {
    const struct tensor *x = c->in[0], *m = in_opt(c, 1);
    int rm = m ? m->ndim : 0, r = x->ndim > rm ? x->ndim : rm;
    if (r < 1) return op_error(c, "X must have rank 1 or more");
    int64_t xs = 1, ms = 1, xst[TENSOR_MAX_DIMS], mst[TENSOR_MAX_DIMS];
    for (int i = r - 1; i >= 0; i--) {
        int ix = x->ndim - r + i, im = m ? m->ndim - r + i : -1;
        int64_t dx = ix >= 0 ? x->dims[ix] : 1, dm = im >= 0 ? m->dims[im] : 1;
        if (dx != dm && dx != 1 && dm != 1)
            return op_error(c, "X and Mask do not broadcast: axis %d is %lld and %lld", i, (long long)dx, (long long)dm);
        out_dims[i] = dx == 1 ? dm : dx;
        xst[i] = dx == 1 ? 0 : xs;
        mst[i] = dm == 1 ? 0 : ms;
        xs *= dx;
        ms *= dm;
    }
    *out_nd = r;
    p->nd = r - 1;
    p->rows = 1;
    for (int i = 0; i < r - 1; i++) {
        p->dims[i] = out_dims[i];
        p->xstr[i] = xst[i];
        p->mstr[i] = mst[i];
        p->rows *= out_dims[i];
    }
    p->n = out_dims[r - 1];
    p->xcs = xst[r - 1] ? 1 : 0;
    p->mcs = mst[r - 1] ? 1 : 0;
    p->has_mask = m != NULL;
    return 0;
}

static int msm_infer(struct op_call *c) {
    int rc = need_input(c, 0, "X");
    if (rc) return rc;
    for (int i = 0; i < c->nin && i < 2; i++)
        if (c->in[i] && c->in[i]->dtype != DT_FP32)
            return op_error(c, "input %d has dtype %s; this fused operator runs float", i, dtype_name(c->in[i]->dtype));
    struct msm_params p;
    int64_t dims[TENSOR_MAX_DIMS];
    int nd;
    memset(&p, 0, sizeof p);
    if ((rc = msm_geometry(c, &p, dims, &nd))) return rc;
    return set_shape(c, c->out[0], DT_FP32, nd, dims);
}

static msm_row_fn msm_row_for_cpu(void);

static int msm_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct msm_params p;
    int64_t dims[TENSOR_MAX_DIMS];
    int nd;
    memset(&p, 0, sizeof p);
    int rc = msm_geometry(c, &p, dims, &nd);
    if (rc) return rc;
    p.scale = node_attr_float(c->node, "scale", 1.0f);
    p.nan_to_zero = node_attr_int(c->node, "nan_to_zero", 0) != 0;
    p.row = msm_row_for_cpu();
    return params_keep(c, &p, sizeof p, state);
}

/* One row: y = softmax(scale * x + m). A row holding NaN or +inf, or only
 * -inf, is NaN as the unfused ops make it, or zeros with nan_to_zero. Built
 * three times below, for AVX-512, AVX2 and the baseline: the exponential is
 * most of the work, and oneDNN's own softmax runs at the CPU's width. */
static inline __attribute__((always_inline)) void msm_row(const struct msm_params *p, const float *x, const float *m,
                                                          float *y) {
    int64_t n = p->n;
    float sc = p->scale;
    if (p->xcs && m && p->mcs) {
        _Pragma("omp simd") for (int64_t j = 0; j < n; j++) y[j] = sc * x[j] + m[j];
    } else {
        for (int64_t j = 0; j < n; j++) y[j] = sc * x[j * p->xcs] + (m ? m[j * p->mcs] : 0.0f);
    }
    float mx = -INFINITY;
    int nan = 0;
    _Pragma("omp simd reduction(max : mx) reduction(| : nan)") for (int64_t j = 0; j < n; j++) {
        mx = y[j] > mx ? y[j] : mx;
        nan |= y[j] != y[j];
    }
    if (nan || !(mx > -INFINITY) || mx == INFINITY) {
        float f = p->nan_to_zero ? 0.0f : NAN;
        for (int64_t j = 0; j < n; j++) y[j] = f;
        return;
    }
    float sum = 0;
    _Pragma("omp simd reduction(+ : sum)") for (int64_t j = 0; j < n; j++) {
        float e = ew_exp_neg_f(y[j] - mx);
        y[j] = e;
        sum += e;
    }
    float inv = 1.0f / sum;
    _Pragma("omp simd") for (int64_t j = 0; j < n; j++) y[j] *= inv;
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("arch=x86-64-v4"))) static void msm_row_v4(const struct msm_params *p, const float *x,
                                                                 const float *m, float *y) {
    msm_row(p, x, m, y);
}
__attribute__((target("arch=x86-64-v3"))) static void msm_row_v3(const struct msm_params *p, const float *x,
                                                                 const float *m, float *y) {
    msm_row(p, x, m, y);
}
#endif
static void msm_row_v2(const struct msm_params *p, const float *x, const float *m, float *y) { msm_row(p, x, m, y); }

static msm_row_fn msm_row_for_cpu(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    int level = dnnl_util_isa_level();
    if (level >= 4) return msm_row_v4;
    if (level == 3) return msm_row_v3;
#endif
    return msm_row_v2;
}

static void msm_rows(const struct msm_params *p, const float *x, const float *m, float *y, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
        int64_t xo = 0, mo = 0, rest = r;
        for (int i = p->nd - 1; i >= 0; i--) {
            int64_t ix = rest % p->dims[i];
            rest /= p->dims[i];
            xo += ix * p->xstr[i];
            mo += ix * p->mstr[i];
        }
        p->row(p, x + xo, m ? m + mo : NULL, y + r * p->n);
    }
}

static int msm_run(struct op_call *c) {
    const struct msm_params *p = c->state;
    if (p->rows <= 0 || p->n <= 0) return 0;
    const float *x = c->in[0]->data, *m = p->has_mask ? c->in[1]->data : NULL;
    float *y = c->out[0]->data;
    int nt = c->nthreads;
    if (p->rows * p->n < EW_PAR_MIN || nt <= 1 || p->rows < 2) {
        msm_rows(p, x, m, y, 0, p->rows);
        return 0;
    }
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), k = omp_get_num_threads();
        msm_rows(p, x, m, y, p->rows * t / k, p->rows * (t + 1) / k);
    }
    return 0;
}

const struct op_def op_defs_softmax_fused[] = {
    {"MaskedSoftmax", "kiln", msm_infer, msm_prepare, msm_run, op_params_free, 0},
    {NULL, NULL, NULL, NULL, NULL, NULL, 0},
};
