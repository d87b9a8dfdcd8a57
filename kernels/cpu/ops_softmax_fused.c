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
#include "kernels/cpu/sigmoid_vec.h"
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
    float inv = 1.0f / exp_shift_sum(y, n, mx);
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

/* ---- kiln.HeadAttention: masked attention in the heads' own layout ---- */

/* Y[b,s,h,:] = sum over t of softmax_t(scale * Q[b,s,h,:] . K[b,t,h,:] +
 * Mask[b,h,s,t]) V[b,t,h,:], the softmax as MaskedSoftmax's (its rows of
 * NaN, or zeros with nan_to_zero). models/passes.c fuses BERT's attention
 * into it: the heads' Transposes on Q, K and V, the scores' MatMul,
 * MaskedSoftmax, the MatMul with V and the Transpose back. Q [B, S, H, D],
 * K [B, T, H, D] and V [B, T, H, Dv] are read where the projections wrote
 * them, Y [B, S, H, Dv] is written where the output projection reads it, and
 * the scores of four query rows at a time stay in the core's cache. Batch
 * and head axes of 1 broadcast; Mask broadcasts to [B, H, S, T]. For the
 * short texts of embedding models the products are small (48 x 48 x 32 a
 * head), oneDNN's batched matmul ran them at about 40% of an AVX2 core's
 * FMA peak, and the four Transposes and the scores' trips through memory
 * cost as much as the products: one MiniLM layer's attention (8 texts of
 * 48 tokens, 12 heads, one thread) took 1.06-1.50 ms fused against
 * 1.34-1.84 ms unfused (best and median of eight alternating runs). */

struct ha_params;
typedef void (*ha_fn)(const struct ha_params *p, const float *q, const float *k, const float *v, const float *m,
                      float *y, int64_t s0, int64_t s1, float *kt, float *vc, float *sc);

struct ha_params {
    struct msm_params sm;             /* a row's softmax: n = T, scale, nan_to_zero, the mask's stride along t */
    ha_fn run;                        /* the (b, h) kernel built for the CPU's vector width */
    int64_t B, S, T, H, D, Dv, Tp;    /* Tp: T rounded up to 16, the scores' row */
    int64_t qb, qh, qs, kb, kh, ks;   /* element strides of batch, head and row; 0 broadcast */
    int64_t vb, vh, vs, mb, mh, ms;
    int64_t SB;                       /* query rows a work item */
    int has_mask, nthreads;
};

/* Most query rows a block. Each width takes as many as its registers hold
 * accumulators for beside the second operand and a broadcast: AVX-512 8
 * rows of one 16-lane vector, AVX2 6 rows of two 8-lane ones, SSE 2 rows of
 * four 4-lane ones. With 4 rows of two 8-lane vectors everywhere, bert's
 * attention (64 tokens, 2 heads of 64) took 0.085 ms a run on an AVX-512
 * EPYC; 0.061 ms so (AVX2: 0.086 -> 0.063; SSE4.1: 1.41 -> 0.23, below). */
#define HA_ROWS 8

/* The sizes, and the element strides of Q, K, V and Mask (0 where an axis
 * of 1 broadcasts). */
static int ha_geometry(struct op_call *c, struct ha_params *p) {
    const struct tensor *q = c->in[0], *k = c->in[1], *v = c->in[2], *m = in_opt(c, 3);
    static const char *const names[3] = {"Q", "K", "V"};
    const struct tensor *t3[3] = {q, k, v};
    for (int i = 0; i < 3; i++)
        if (!t3[i] || t3[i]->dtype != DT_FP32 || t3[i]->ndim != 4)
            return op_error(c, "%s must be a float tensor of rank 4 [batch, rows, heads, width]", names[i]);
    if (m && (m->dtype != DT_FP32 || m->ndim > 4)) return op_error(c, "Mask must be a float tensor of rank 4 or less");
    p->S = q->dims[1], p->T = k->dims[1], p->D = q->dims[3], p->Dv = v->dims[3];
    if (k->dims[3] != p->D || v->dims[1] != p->T)
        return op_error(c, "Q [.., %lld, .., %lld], K [.., %lld, .., %lld] and V [.., %lld, .., %lld] do not chain",
                        (long long)p->S, (long long)p->D, (long long)p->T, (long long)k->dims[3],
                        (long long)v->dims[1], (long long)p->Dv);
    /* The mask may widen the scores (as it would MaskedSoftmax's output):
     * its batch, head and query axes broadcast with Q's, K's and V's. */
    int64_t md[4] = {1, 1, 1, 1};
    for (int i = 0; m && i < m->ndim; i++) md[4 - m->ndim + i] = m->dims[i];
    p->B = md[0], p->H = md[1];
    for (int i = 0; i < 4; i++) {
        int64_t b = i < 3 ? t3[i]->dims[0] : md[0], h = i < 3 ? t3[i]->dims[2] : md[1];
        if ((b != 1 && p->B != 1 && b != p->B) || (h != 1 && p->H != 1 && h != p->H))
            return op_error(c, "the batch and head axes of Q, K, V and Mask do not broadcast");
        if (b != 1) p->B = b;
        if (h != 1) p->H = h;
    }
    if (md[2] != 1 && p->S != 1 && md[2] != p->S)
        return op_error(c, "Mask's query axis is %lld; Q's is %lld", (long long)md[2], (long long)p->S);
    int64_t qrows = p->S;
    if (md[2] != 1) p->S = md[2];
    p->qs = q->dims[2] * p->D, p->qh = q->dims[2] == 1 ? 0 : p->D, p->qb = q->dims[0] == 1 ? 0 : qrows * p->qs;
    if (qrows == 1) p->qs = 0; /* one query row, broadcast over the mask's */
    p->ks = k->dims[2] * p->D, p->kh = k->dims[2] == 1 ? 0 : p->D, p->kb = k->dims[0] == 1 ? 0 : p->T * p->ks;
    p->vs = v->dims[2] * p->Dv, p->vh = v->dims[2] == 1 ? 0 : p->Dv, p->vb = v->dims[0] == 1 ? 0 : p->T * p->vs;
    p->has_mask = m != NULL;
    p->mb = p->mh = p->ms = 0;
    p->sm.mcs = 0;
    if (m) {
        int64_t want[4] = {p->B, p->H, p->S, p->T}, st = 1, str[4];
        for (int i = 3; i >= 0; i--) {
            if (md[i] != 1 && md[i] != want[i])
                return op_error(c, "Mask's axis %d is %lld; the scores' is %lld", i, (long long)md[i],
                                (long long)want[i]);
            str[i] = md[i] == 1 ? 0 : st;
            st *= md[i];
        }
        p->mb = str[0], p->mh = str[1], p->ms = str[2], p->sm.mcs = str[3] ? 1 : 0;
    }
    p->Tp = (p->T + 15) / 16 * 16;
    p->sm.n = p->T;
    p->sm.xcs = 1;
    p->sm.has_mask = p->has_mask;
    return 0;
}

static int ha_infer(struct op_call *c) {
    for (int i = 0; i < 3; i++) {
        int rc = need_input(c, i, i == 0 ? "Q" : i == 1 ? "K" : "V");
        if (rc) return rc;
    }
    struct ha_params p;
    memset(&p, 0, sizeof p);
    int rc = ha_geometry(c, &p);
    if (rc) return rc;
    int64_t dims[4] = {p.B, p.S, p.H, p.Dv};
    return set_shape(c, c->out[0], DT_FP32, 4, dims);
}

/* Eight floats (and their comparisons); an unaligned, aliasing view for
 * loads and stores. */
typedef float ha_v8 __attribute__((vector_size(32)));
typedef float ha_v4 __attribute__((vector_size(16)));
typedef int32_t ha_v8i __attribute__((vector_size(32)));
typedef float ha_v8u __attribute__((vector_size(32), aligned(4), may_alias));
typedef float ha_v16 __attribute__((vector_size(64)));
#define HA_LD(x) (*(const ha_v8u *)(const void *)(x))
#define HA_ST(x, v) (*(ha_v8u *)(void *)(x) = (v))

/* The products' multiply-adds as FMAs (ISO C leaves them apart). The
 * scores are scaled as they are stored and the mask added after, each
 * rounded as MaskedSoftmax rounds them. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=fast")
#endif

/* m ? a : b, lane by lane. */
#define HA_SEL(m, a, b) ((ha_v8)(((m) & (ha_v8i)(a)) | (~(m) & (ha_v8i)(b))))

/* One row of scaled scores: x = softmax(x + m) in place, as msm_row (a
 * row holding NaN or +inf, or only -inf, is NaN, or zeros with
 * nan_to_zero), the sum and the largest value eight lanes at a time with
 * the reductions in registers: attention's rows are short (one per query
 * and head, one score per key), and msm_row's loops spent more on
 * finishing their reductions than on the exponentials (exp_shift_sum's). */
static inline __attribute__((always_inline)) void ha_softmax(const struct msm_params *p, float *x, const float *m) {
    const int64_t n = p->n, n8 = n & ~(int64_t)7;
    ha_v8 vmax = {0};
    vmax -= __builtin_inff();
    ha_v8i vnan = {0};
    for (int64_t j = 0; j < n8; j += 8) {
        ha_v8 v = HA_LD(x + j);
        if (m && p->mcs) v += HA_LD(m + j);
        else if (m) v += m[0];
        HA_ST(x + j, v);
        vmax = HA_SEL(v > vmax, v, vmax);
        vnan |= v != v;
    }
    float lanes[8], mx = -__builtin_inff();
    int32_t nans[8], nan = 0;
    HA_ST(lanes, vmax);
    memcpy(nans, &vnan, sizeof nans);
    for (int k = 0; k < 8; k++) {
        mx = lanes[k] > mx ? lanes[k] : mx;
        nan |= nans[k];
    }
    for (int64_t j = n8; j < n; j++) {
        float v = x[j] + (m ? m[j * p->mcs] : 0.0f);
        x[j] = v;
        mx = v > mx ? v : mx;
        nan |= v != v;
    }
    if (nan || !(mx > -__builtin_inff()) || mx == __builtin_inff()) {
        float f = p->nan_to_zero ? 0.0f : __builtin_nanf("");
        for (int64_t j = 0; j < n; j++) x[j] = f;
        return;
    }
    float inv = 1.0f / exp_shift_sum(x, n, mx);
    for (int64_t j = 0; j < n8; j += 8) HA_ST(x + j, HA_LD(x + j) * inv);
    for (int64_t j = n8; j < n; j++) x[j] *= inv;
}

/* out[r][0..16) = mul * sum over i < n of a[r][i] * b[i * ldb + 0..16), for
 * the R rows of a (R <= HA_ROWS, a constant where inlined), stored for the
 * first nout: both of attention's products, R rows of 16 columns held in
 * registers as NV vectors of type VT (16 / NV lanes). One definition per
 * width: eight lanes for AVX2; sixteen for AVX-512 (one register a row);
 * four for SSE, where GCC splits eight-lane vectors but builds a scalar's
 * broadcast to eight lanes through the stack (a store-forwarding stall on
 * every multiply-add; HeadAttention ran 17x slower than with AVX2). */
#define HA_ROWS16(NAME, VT, NV)                                                                              \
    static inline __attribute__((always_inline)) void NAME(const float *const *a, const float *b, int64_t ldb, \
                                                           int64_t n, float mul, float *const *out, int nout,   \
                                                           const int R) {                                       \
        typedef VT __attribute__((aligned(4), may_alias)) vu_;                                                 \
        VT acc[HA_ROWS][NV];                                                                                    \
        memset(acc, 0, sizeof acc);                                                                             \
        for (int64_t i = 0; i < n; i++) {                                                                       \
            VT bv[NV];                                                                                          \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) bv[v] =                                        \
                *(const vu_ *)(const void *)(b + i * ldb + v * (16 / NV));                                      \
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                               \
                const float ar = a[r][i];                                                                       \
                _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[r][v] += ar * bv[v];                   \
            }                                                                                                   \
        }                                                                                                       \
        for (int r = 0; r < nout; r++)                                                                          \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)                                                \
                *(vu_ *)(void *)(out[r] + v * (16 / NV)) = acc[r][v] * mul;                                     \
    }
HA_ROWS16(ha_rows16, ha_v8, 2)
HA_ROWS16(ha_rows16_x16, ha_v16, 1)
HA_ROWS16(ha_rows16_x4, ha_v4, 4)

/* Query rows [s0, s1) of one (batch, head): q, k, v, m and y there. K is
 * read once into kt, transposed ([D][Tp], zeros past T), and V into vc
 * ([T][Dv]): both are read again for every R query rows, and in
 * place their rows lie a whole row of heads apart, where the L1 cache
 * keeps few of them (each maps to one of a few sets). sc: the scores of
 * R rows (R <= HA_ROWS); the products in vectors of `lanes` floats (4, 8 or 16). */
static inline __attribute__((always_inline)) void ha_body(const struct ha_params *p, const float *q, const float *k,
                                                          const float *v, const float *m, float *y, int64_t s0,
                                                          int64_t s1, float *kt, float *vc, float *sc, const int R,
                                                          const int lanes) {
    const int64_t T = p->T, Tp = p->Tp, D = p->D, Dv = p->Dv, ys = p->H * Dv;
    const float scale = p->sm.scale;
    for (int64_t t = 0; t < T; t++) {
        const float *kr = k + t * p->ks;
        const float *vr = v + t * p->vs;
        for (int64_t d = 0; d < D; d++) kt[d * Tp + t] = kr[d];
        int64_t c = 0;
        for (; c + 8 <= Dv; c += 8) HA_ST(vc + t * Dv + c, HA_LD(vr + c));
        for (; c < Dv; c++) vc[t * Dv + c] = vr[c];
    }
    for (int64_t d = 0; d < D; d++)
        for (int64_t t = T; t < Tp; t++) kt[d * Tp + t] = 0.0f;
    for (int64_t r0 = s0; r0 < s1; r0 += R) {
        int nr = s1 - r0 < R ? (int)(s1 - r0) : R;
        const float *qr[HA_ROWS];
        for (int r = 0; r < R; r++) qr[r] = q + (r0 + (r < nr ? r : 0)) * p->qs;
        const float *sr[HA_ROWS];
        float *out[HA_ROWS];
        for (int r = 0; r < R; r++) sr[r] = sc + r * Tp;
        for (int64_t t0 = 0; t0 < Tp; t0 += 16) { /* scaled as MaskedSoftmax scales, before the mask */
            for (int r = 0; r < R; r++) out[r] = sc + r * Tp + t0;
            if (lanes == 16) ha_rows16_x16(qr, kt + t0, Tp, D, scale, out, R, R);
            else if (lanes == 4) ha_rows16_x4(qr, kt + t0, Tp, D, scale, out, R, R);
            else ha_rows16(qr, kt + t0, Tp, D, scale, out, R, R);
        }
        for (int r = 0; r < nr; r++) ha_softmax(&p->sm, sc + r * Tp, m ? m + (r0 + r) * p->ms : NULL);
        float *yr = y + r0 * ys;
        int64_t c0 = 0;
        for (; c0 + 16 <= Dv; c0 += 16) {
            for (int r = 0; r < nr; r++) out[r] = yr + r * ys + c0;
            if (lanes == 16) ha_rows16_x16(sr, vc + c0, Dv, T, 1.0f, out, nr, R);
            else if (lanes == 4) ha_rows16_x4(sr, vc + c0, Dv, T, 1.0f, out, nr, R);
            else ha_rows16(sr, vc + c0, Dv, T, 1.0f, out, nr, R);
        }
        for (; c0 < Dv; c0++)
            for (int r = 0; r < nr; r++) {
                float acc = 0.0f;
                for (int64_t t = 0; t < T; t++) acc += sc[r * Tp + t] * vc[t * Dv + c0];
                yr[r * ys + c0] = acc;
            }
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("arch=x86-64-v4"))) static void ha_run_v4(const struct ha_params *p, const float *q,
                                                                const float *k, const float *v, const float *m,
                                                                float *y, int64_t s0, int64_t s1, float *kt,
                                                                float *vc, float *sc) {
    ha_body(p, q, k, v, m, y, s0, s1, kt, vc, sc, 8, 16);
}
__attribute__((target("arch=x86-64-v3"))) static void ha_run_v3(const struct ha_params *p, const float *q,
                                                                const float *k, const float *v, const float *m,
                                                                float *y, int64_t s0, int64_t s1, float *kt,
                                                                float *vc, float *sc) {
    ha_body(p, q, k, v, m, y, s0, s1, kt, vc, sc, 6, 8);
}
#endif
static void ha_run_v2(const struct ha_params *p, const float *q, const float *k, const float *v, const float *m,
                      float *y, int64_t s0, int64_t s1, float *kt, float *vc, float *sc) {
    ha_body(p, q, k, v, m, y, s0, s1, kt, vc, sc, 2, 4);
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

/* Per thread: K transposed, V, and the scores of HA_ROWS rows. */
static size_t ha_thread_bytes(const struct ha_params *p) {
    size_t tp = (size_t)(p->Tp > 0 ? p->Tp : 1);
    return dnnl_util_align(sizeof(float) * (size_t)p->D * tp) +
           dnnl_util_align(sizeof(float) * (size_t)p->T * (size_t)p->Dv) + dnnl_util_align(sizeof(float) * HA_ROWS * tp);
}

static int ha_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct ha_params p;
    memset(&p, 0, sizeof p);
    int rc = ha_geometry(c, &p);
    if (rc) return rc;
    p.sm.scale = node_attr_float(c->node, "scale", 1.0f);
    p.sm.nan_to_zero = node_attr_int(c->node, "nan_to_zero", 0) != 0;
    p.sm.row = msm_row_for_cpu();
    p.run = ha_run_v2;
#if defined(__x86_64__) && defined(__GNUC__)
    int level = dnnl_util_isa_level();
    if (level >= 4) p.run = ha_run_v4;
    else if (level == 3) p.run = ha_run_v3;
#endif
    p.nthreads = c->nthreads > 0 ? c->nthreads : 1;
    /* Work items of 64 query rows, fewer where that leaves threads idle. */
    p.SB = 64;
    while (p.SB > 16 && p.B * p.H * ((p.S + p.SB - 1) / p.SB) < p.nthreads) p.SB /= 2;
    *scratch = ha_thread_bytes(&p) * (size_t)p.nthreads;
    return params_keep(c, &p, sizeof p, state);
}

static int ha_run(struct op_call *c) {
    const struct ha_params *p = c->state;
    const float *q = c->in[0]->data, *k = c->in[1]->data, *v = c->in[2]->data;
    const float *m = p->has_mask ? c->in[3]->data : NULL;
    float *y = c->out[0]->data;
    int64_t nsb = (p->S + p->SB - 1) / p->SB, items = p->B * p->H * nsb;
    if (items == 0 || p->Dv == 0) return 0;
    size_t per = ha_thread_bytes(p), tp = (size_t)(p->Tp > 0 ? p->Tp : 1);
    size_t kt_bytes = dnnl_util_align(sizeof(float) * (size_t)p->D * tp);
    size_t vc_bytes = dnnl_util_align(sizeof(float) * (size_t)p->T * (size_t)p->Dv);
    int nt = p->nthreads < c->nthreads || c->nthreads < 1 ? p->nthreads : c->nthreads;
    if (items < nt) nt = (int)items;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t w = 0; w < items; w++) {
        int64_t b = w / (p->H * nsb), h = w / nsb % p->H, s0 = w % nsb * p->SB;
        int64_t s1 = s0 + p->SB < p->S ? s0 + p->SB : p->S;
        char *mine = (char *)c->scratch + per * (size_t)omp_get_thread_num();
        p->run(p, q + b * p->qb + h * p->qh, k + b * p->kb + h * p->kh, v + b * p->vb + h * p->vh,
               m ? m + b * p->mb + h * p->mh : NULL, y + b * p->S * p->H * p->Dv + h * p->Dv, s0, s1,
               (float *)(void *)mine, (float *)(void *)(mine + kt_bytes),
               (float *)(void *)(mine + kt_bytes + vc_bytes));
    }
    return 0;
}

const struct op_def op_defs_softmax_fused[] = {
    {"MaskedSoftmax", "kiln", msm_infer, msm_prepare, msm_run, op_params_free, 0},
    {"HeadAttention", "kiln", ha_infer, ha_prepare, ha_run, op_params_free, 0},
    {NULL, NULL, NULL, NULL, NULL, NULL, 0},
};
