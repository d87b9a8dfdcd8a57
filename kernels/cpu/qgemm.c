/* qgemm.c - the exact 8-bit matrix product of MatMulInteger and the
 * dynamic-quantization operators on oneDNN's int8 matmul, and the
 * vectorised DynamicQuantizeLinear of A.
 *
 * oneDNN 2.6 multiplies uint8 A by int8 B into int32 sums (VNNI where the
 * CPU has it). Everything else an ONNX product allows is brought to that
 * form once, algebraically, so the sums stay exact:
 *  - an int8 A is shifted by +128 into uint8 (its zero point too);
 *  - a uint8 B is shifted by -128 into int8 when the plan is built (its
 *    zero point too);
 *  - the zero points leave the product:
 *      sum_k (a - za)(b - zb[n]) = sum_k a b - za colsum(b)[n]
 *                                  - zb[n] rowsum(a)[m] + K za zb[n],
 *    with B's column sums computed when the plan is built.
 * Without VNNI oneDNN sums pairs of u8 x s8 products in int16 with
 * saturation (vpmaddubsw): there A runs as two 4-bit halves, whose pair
 * sums (at most 2 * 15 * 128) cannot saturate, and the two products are
 * joined as 16 hi + lo. Integer sums wrap like ONNX's int32 (unsigned
 * arithmetic below). */

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/elementwise_util.h"
#include "kernels/cpu/matmul_util.h"

/* Nothing here reads the floating-point exception flags; without this GCC
 * keeps the clamps of the quantization as branches, and its loop scalar. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math", "no-math-errno")
#endif

/* ---- constant B ---------------------------------------------------------- */

struct qgemm_make_args {
    const struct tensor *b;
    const dnnl_memory_desc_t *b_md, *w_md; /* B as int8 [K, N] row-major; the primitive's layout */
};

/* B - 128 as int8 (a uint8 B), then reordered into the primitive's layout. */
static void *qgemm_make_weights(struct op_call *c, void *arg) {
    const struct qgemm_make_args *m = arg;
    int64_t n = tensor_numel(m->b);
    const void *src = m->b->data;
    int8_t *shifted = NULL;
    if (m->b->dtype == DT_UINT8) {
        if (!(shifted = malloc((size_t)(n > 0 ? n : 1)))) return op_error(c, "out of memory"), NULL;
        const uint8_t *u = m->b->data;
        for (int64_t i = 0; i < n; i++) shifted[i] = (int8_t)(u[i] ^ 0x80);
        src = shifted;
    }
    void *buf = dnnl_util_reorder_alloc(c, m->b_md, src, m->w_md);
    free(shifted);
    return buf;
}

void cpu_qgemm_free(struct cpu_qgemm *q) {
    if (!q) return;
    dnnl_prim_free(q->prim);
    dnnl_util_weights_release(q->wbuf);
    free(q->colsum);
    free(q->zb);
    memset(q, 0, sizeof *q);
}

int cpu_qgemm_usable(const struct tensor *b, const struct tensor *zb) {
    if (!b || !b->data || !cpu_is_q8(b->dtype) || b->ndim != 2 || (zb && (!zb->data || !cpu_is_q8(zb->dtype))))
        return 0;
    return !zb || tensor_numel(zb) == 1 || tensor_numel(zb) == b->dims[1];
}

/* B is b [K, N] row-major, or (trans) b [N, K] row-major read as its
 * transpose: oneDNN takes it by strides, so no copy is made and the key of
 * the shared reordered weights is still b's own bytes. */
static int qgemm_build(struct op_call *c, struct cpu_qgemm *q, int64_t m, enum dtype a_dt, const struct tensor *b,
                       const struct tensor *zb, int trans, size_t *scratch_size) {
    memset(q, 0, sizeof *q);
    const int64_t k = b->dims[trans ? 1 : 0], n = b->dims[trans ? 0 : 1];
    q->m = m;
    q->k = k;
    q->n = n;
    q->a_s8 = a_dt == DT_INT8;
    q->split = !dnnl_util_isa_vnni();
    q->colsum = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
    q->zb = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
    if (!q->colsum || !q->zb) {
        cpu_qgemm_free(q);
        return op_error(c, "out of memory"), STATUS_NOMEM;
    }
    /* b' = b - 128 for uint8 B, its zero point likewise. */
    const int32_t shift = b->dtype == DT_UINT8 ? 128 : 0;
    for (int64_t j = 0; j < n; j++) {
        q->zb[j] = (int32_t)cpu_qparam_at(zb, j, 0) - shift;
        q->colsum[j] = 0;
    }
    for (int64_t t = 0; t < k; t++)
        for (int64_t j = 0; j < n; j++)
            q->colsum[j] += (int32_t)op_int_at(b, trans ? j * k + t : t * n + j) - shift;

    q->nthreads = c->nthreads;
    dnnl_util_set_threads(q->nthreads);
    if (!dnnl_util_engine()) {
        cpu_qgemm_free(q);
        return op_error(c, "oneDNN CPU engine unavailable"), STATUS_INTERNAL;
    }
    dnnl_dims_t ad = {m, k}, bd = {k, n}, yd = {m, n}, bt_strides = {1, k};
    dnnl_memory_desc_t a_md, b_md, b_any, y_md;
    dnnl_primitive_attr_t attr = dnnl_util_attr();
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t st = attr ? dnnl_success : dnnl_out_of_memory;
    if (st == dnnl_success) st = dnnl_memory_desc_init_by_tag(&a_md, 2, ad, dnnl_u8, dnnl_ab);
    if (st == dnnl_success)
        st = trans ? dnnl_memory_desc_init_by_strides(&b_md, 2, bd, dnnl_s8, bt_strides)
                   : dnnl_memory_desc_init_by_tag(&b_md, 2, bd, dnnl_s8, dnnl_ab);
    if (st == dnnl_success) st = dnnl_memory_desc_init_by_tag(&b_any, 2, bd, dnnl_s8, dnnl_format_tag_any);
    if (st == dnnl_success) st = dnnl_memory_desc_init_by_tag(&y_md, 2, yd, dnnl_s32, dnnl_ab);
    if (st == dnnl_success) st = dnnl_matmul_desc_init(&md, &a_md, &b_any, NULL, &y_md);
    if (st == dnnl_success) st = dnnl_primitive_desc_create(&pd, &md, attr, dnnl_util_engine(), NULL);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (st != dnnl_success) {
        cpu_qgemm_free(q);
        return dnnl_util_fail(c, "int8 matmul primitive descriptor", st);
    }
    int ids[3] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST};
    size_t dnnl_scratch = 0;
    q->prim = dnnl_prim_create(c, pd, 3, ids, &dnnl_scratch);
    int rc = q->prim ? 0 : STATUS_INTERNAL;
    if (!rc) {
        /* The key names B's own bytes: a uint8 B and an int8 B never share. */
        dnnl_memory_desc_t key = b_md;
        key.data_type = b->dtype == DT_UINT8 ? dnnl_u8 : dnnl_s8;
        const dnnl_memory_desc_t *w_md = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
        struct qgemm_make_args args = {b, &b_md, w_md};
        q->wbuf = dnnl_util_shared_acquire(c, &key, b->data, w_md, qgemm_make_weights, &args);
        if (!q->wbuf) rc = STATUS_INTERNAL;
        else dnnl_prim_bind(q->prim, 1, q->wbuf);
    }
    dnnl_primitive_desc_destroy(pd);
    if (rc) {
        cpu_qgemm_free(q);
        return rc;
    }
    q->dnnl_scratch = dnnl_util_align(dnnl_scratch);
    *scratch_size = cpu_qgemm_scratch(q);
    return 0;
}

int cpu_qgemm_build(struct op_call *c, struct cpu_qgemm *q, int64_t m, enum dtype a_dt, const struct tensor *b,
                    const struct tensor *zb, size_t *scratch_size) {
    return qgemm_build(c, q, m, a_dt, b, zb, 0, scratch_size);
}

int cpu_qgemm_build_bt(struct op_call *c, struct cpu_qgemm *q, int64_t m, enum dtype a_dt, const struct tensor *bt,
                       const struct tensor *zb, size_t *scratch_size) {
    return qgemm_build(c, q, m, a_dt, bt, zb, 1, scratch_size);
}

/* oneDNN's scratchpad, then A shifted (int8 A) or its two halves and the
 * low half's sums (no VNNI). */
size_t cpu_qgemm_scratch(const struct cpu_qgemm *q) {
    size_t mk = dnnl_util_align((size_t)(q->m * q->k)), mn = dnnl_util_align(sizeof(int32_t) * (size_t)(q->m * q->n));
    return q->dnnl_scratch + (q->split ? 2 * mk + mn : q->a_s8 ? mk : 0);
}

/* ---- running ------------------------------------------------------------- */

/* Which build of a loop runs: 0 the baseline, 1 AVX2, 2 AVX-512, as
 * oneDNN's effective ISA allows (dnnl_util_isa_level). */
static int isa_slot(void) {
    int level = dnnl_util_isa_level();
    return level >= 4 ? 2 : level == 3 ? 1 : 0;
}

/* One row of the result after oneDNN's sums: the halves joined (no
 * VNNI), the zero points' terms added, and with an epilogue the float
 * scaling, bias and activation, in place (int32 and float32 have one
 * size), while the row is in cache. The loops say "omp simd": -O2
 * vectorises only loops whose trip count is a multiple of the vector
 * width. Built for AVX-512, AVX2 and the baseline (no FMA contraction:
 * the same bits on each). */
struct qgemm_rows {
    const uint8_t *a;
    int64_t k, n;
    uint8_t flip;        /* 0x80: an int8 A, shifted by +128 */
    uint32_t uza, kza;   /* za and K za, wrapping */
    const uint32_t *zb, *cs;
    const int32_t *lo;   /* the low halves' sums, or NULL */
    const struct cpu_qgemm_epi *epi;
};

static inline __attribute__((always_inline)) void qgemm_row_body(const struct qgemm_rows *r, int64_t i, int32_t *y) {
    const int64_t k = r->k, n = r->n;
    const uint8_t *ar = r->a + i * k, flip = r->flip;
    uint32_t rs = 0;
#pragma omp simd reduction(+ : rs)
    for (int64_t t = 0; t < k; t++) rs += (uint8_t)(ar[t] ^ flip);
    /* + K za zb[n] - zb[n] rowsum - za colsum[n] */
    const uint32_t kr = r->kza - rs, uza = r->uza, *restrict zb = r->zb, *restrict cs = r->cs;
    uint32_t *restrict yr = (uint32_t *)(y + i * n);
    if (r->lo) {
        const uint32_t *restrict lo = (const uint32_t *)(r->lo + i * n);
#pragma omp simd
        for (int64_t j = 0; j < n; j++) yr[j] = (yr[j] << 4) + lo[j];
    }
    const struct cpu_qgemm_epi *e = r->epi;
    if (!e) {
#pragma omp simd
        for (int64_t j = 0; j < n; j++) yr[j] += kr * zb[j] - uza * cs[j];
        return;
    }
    float *yf = (float *)yr;
    const float as = e->a_scale, *restrict bs = e->b_scale, *restrict bias = e->bias;
    if (e->b_scale_per) {
#pragma omp simd
        for (int64_t j = 0; j < n; j++) yf[j] = (float)(int32_t)(yr[j] + kr * zb[j] - uza * cs[j]) * (as * bs[j]);
    } else {
        const float mult = as * bs[0];
#pragma omp simd
        for (int64_t j = 0; j < n; j++) yf[j] = (float)(int32_t)(yr[j] + kr * zb[j] - uza * cs[j]) * mult;
    }
    if (bias) {
#pragma omp simd
        for (int64_t j = 0; j < n; j++) yf[j] += bias[j];
    }
    ew_act_f32(yf, n, e->act, e->act_a, e->act_b);
}

typedef void (*qgemm_rows_fn)(const struct qgemm_rows *r, int64_t i0, int64_t i1, int32_t *y);
#define QGEMM_ROWS(SUF, ATTR)                                                                                       \
    ATTR static void qgemm_rows_##SUF(const struct qgemm_rows *r, int64_t i0, int64_t i1, int32_t *y) {             \
        for (int64_t i = i0; i < i1; i++) qgemm_row_body(r, i, y);                                                   \
    }
#if defined(__x86_64__) && defined(__GNUC__)
QGEMM_ROWS(v4, __attribute__((target("arch=x86-64-v4"))))
QGEMM_ROWS(v3, __attribute__((target("arch=x86-64-v3"))))
#endif
QGEMM_ROWS(v2, )

#if defined(__x86_64__) && defined(__GNUC__)
static const qgemm_rows_fn qgemm_rows_fns[3] = {qgemm_rows_v2, qgemm_rows_v3, qgemm_rows_v4};
#else
static const qgemm_rows_fn qgemm_rows_fns[3] = {qgemm_rows_v2, qgemm_rows_v2, qgemm_rows_v2};
#endif

int cpu_qgemm_run(struct op_call *c, const struct cpu_qgemm *q, const void *a, enum dtype a_dt, int32_t za,
                  int32_t *y, const struct cpu_qgemm_epi *epi) {
    const int64_t m = q->m, k = q->k, n = q->n;
    if (c->scratch_size < cpu_qgemm_scratch(q)) return op_error(c, "internal: scratch too small");
    if ((a_dt == DT_INT8) != q->a_s8) return op_error(c, "internal: A's type differs from the plan's");
    char *scratch = c->scratch, *ws = scratch + q->dnnl_scratch;
    const size_t mk = dnnl_util_align((size_t)(m * k));
    const uint8_t *a8 = a, flip = q->a_s8 ? 0x80 : 0;
    za += q->a_s8 ? 128 : 0;
    dnnl_util_set_threads(q->nthreads);
    int rc;
    const int32_t *lo = NULL;
    if (!q->split) {
        const uint8_t *au = a8;
        if (q->a_s8) {
            uint8_t *sh = (uint8_t *)ws;
#pragma omp simd
            for (int64_t i = 0; i < m * k; i++) sh[i] = a8[i] ^ 0x80;
            au = sh;
        }
        void *args[3] = {(void *)au, NULL, y};
        if ((rc = dnnl_prim_exec(c, q->prim, args, scratch))) return rc;
    } else {
        uint8_t *hi = (uint8_t *)ws, *lo8 = hi + mk;
        int32_t *ylo = (int32_t *)(lo8 + mk);
#pragma omp simd
        for (int64_t i = 0; i < m * k; i++) {
            uint8_t v = a8[i] ^ flip;
            hi[i] = v >> 4;
            lo8[i] = v & 15;
        }
        void *args_hi[3] = {hi, NULL, y}, *args_lo[3] = {lo8, NULL, ylo};
        if ((rc = dnnl_prim_exec(c, q->prim, args_hi, scratch)) || (rc = dnnl_prim_exec(c, q->prim, args_lo, scratch)))
            return rc;
        lo = ylo;
    }
    const struct qgemm_rows r = {a8, k, n, flip, (uint32_t)za, (uint32_t)k * (uint32_t)za,
                                 (const uint32_t *)q->zb, (const uint32_t *)q->colsum, lo, epi};
    qgemm_rows_fn rows = qgemm_rows_fns[isa_slot()];
    const int nt = m * n > 65536 ? q->nthreads : 1;
    if (nt == 1) {
        rows(&r, 0, m, y);
        return 0;
    }
#pragma omp parallel for num_threads(nt)
    for (int64_t i = 0; i < m; i++) rows(&r, i, i + 1, y);
    return 0;
}

/* ---- DynamicQuantizeLinear ----------------------------------------------- */

/* DynamicQuantizeLinear. min and max (with 0) in 16 lanes, so that the
 * vector min/max chains run side by side: "x < m ? x : m" keeps m on NaN
 * and never picks -0, so the lanes' order does not matter. Then round(x /
 * scale) half to even, plus zp, saturated to [0, 255]; NaN gives 0. An
 * integer-valued float plus zp rounds only beyond 2^24, far outside [0,
 * 255], so this is the double arithmetic of ONNX's reference. The division
 * (not a product by 1 / scale, which rounds differently) bounds it: built
 * for AVX-512, AVX2 and the baseline, the CPU's pick. */
static inline __attribute__((always_inline)) float dynquant_body(const float *x, int64_t n, uint8_t *y,
                                                                 uint8_t *zp_out) {
    float mn16[16] = {0}, mx16[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
#pragma omp simd
        for (int j = 0; j < 16; j++) {
            mn16[j] = x[i + j] < mn16[j] ? x[i + j] : mn16[j];
            mx16[j] = x[i + j] > mx16[j] ? x[i + j] : mx16[j];
        }
    }
    float mn = 0, mx = 0;
    for (int j = 0; j < 16; j++) {
        mn = mn16[j] < mn ? mn16[j] : mn;
        mx = mx16[j] > mx ? mx16[j] : mx;
    }
    for (; i < n; i++) {
        mn = x[i] < mn ? x[i] : mn;
        mx = x[i] > mx ? x[i] : mx;
    }
    const float scale = (mx - mn) / 255.0f;
    double zpd = scale > 0 ? nearbyint(0.0 - (double)(mn / scale)) : 0;
    const uint8_t zp = (uint8_t)(zpd < 0 ? 0 : zpd > 255 ? 255 : zpd);
    const float zf = (float)zp;
    if (!(scale > 0)) memset(y, 0, (size_t)n);
    else {
#pragma omp simd
        for (int64_t t = 0; t < n; t++) {
            float v = nearbyintf(x[t] / scale) + zf;
            v = v > 0 ? v : 0;
            v = v < 255 ? v : 255;
            y[t] = (uint8_t)(int32_t)v;
        }
    }
    *zp_out = zp;
    return scale;
}

typedef float (*dynquant_fn)(const float *x, int64_t n, uint8_t *y, uint8_t *zp);
#define DYNQUANT(SUF, ATTR)                                                                                         \
    ATTR static float dynquant_##SUF(const float *x, int64_t n, uint8_t *y, uint8_t *zp) {                          \
        return dynquant_body(x, n, y, zp);                                                                          \
    }
DYNQUANT(v2, )
#if defined(__x86_64__) && defined(__GNUC__)
DYNQUANT(v4, __attribute__((target("arch=x86-64-v4"))))
DYNQUANT(v3, __attribute__((target("arch=x86-64-v3"))))
static const dynquant_fn dynquant_fns[3] = {dynquant_v2, dynquant_v3, dynquant_v4};
#else
static const dynquant_fn dynquant_fns[3] = {dynquant_v2, dynquant_v2, dynquant_v2};
#endif

float cpu_dynquant_u8(const float *x, int64_t n, uint8_t *y, uint8_t *zp) { return dynquant_fns[isa_slot()](x, n, y, zp); }
