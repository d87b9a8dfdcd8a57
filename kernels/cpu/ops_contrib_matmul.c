/* ops_contrib_matmul.c - onnxruntime's contrib matrix products (domain
 * com.microsoft): FusedMatMul (its optimizer's MatMul with folded
 * transposes and scale), MatMulNBits (the 2/4/8-bit blockwise weights of
 * onnxruntime.quantization's MatMulNBitsQuantizer), DynamicQuantizeMatMul
 * and MatMulIntegerToFloat (its dynamic quantization), and QGemm (Gemm in
 * its QOperator format).
 *
 * Float products run on the oneDNN matmul of ops_nn.c (matmul_util.h);
 * MatMulNBits dequantizes its constant weights once, at prepare, into a
 * float matrix that matmul then packs. The 8-bit products are exact int32
 * sums (matmul_util.h) scaled as onnxruntime scales them. */

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/elementwise_util.h"
#include "kernels/cpu/matmul_util.h"
#include "kernels/cpu/params_util.h"
#include "kernels/ops.h"

static const struct tensor *in_at(const struct op_call *c, int i) { return i < c->nin ? c->in[i] : NULL; }

static int need_f32(struct op_call *c, int i, const char *what, int required) {
    const struct tensor *t = in_at(c, i);
    if (!t) return required ? op_error(c, "input %d (%s) is required", i, what) : 0;
    if (t->dtype != DT_FP32) {
        op_error(c, "%s must be float32 (got %s)", what, dtype_name(t->dtype));
        return STATUS_UNSUPPORTED;
    }
    return 0;
}

/* Input i must be a constant (an initializer) when the plan is built. */
static int need_const(struct op_call *c, int i, const char *what) {
    const struct tensor *t = in_at(c, i);
    if (t && !t->data) {
        op_error(c, "%s must be a constant initializer (it is dequantized once when the plan is built)", what);
        return STATUS_UNSUPPORTED;
    }
    return 0;
}

/* Plain row-major strides of dims, with the last two swapped when trans
 * (the operand is stored transposed). */
static void strides_of(int r, const int64_t *dims, int trans, int64_t *st) {
    int64_t pd[TENSOR_MAX_DIMS];
    memcpy(pd, dims, sizeof(int64_t) * (size_t)r);
    if (trans) {
        pd[r - 1] = dims[r - 2];
        pd[r - 2] = dims[r - 1];
    }
    int64_t s = 1;
    for (int i = r - 1; i >= 0; i--) {
        st[i] = s;
        s *= pd[i];
    }
    if (trans) {
        int64_t t = st[r - 1];
        st[r - 1] = st[r - 2];
        st[r - 2] = t;
    }
}

/* ------------------------------------------------------------------------
 * FusedMatMul: alpha * op(A) x op(B), op a transpose of the last two dims
 * when transA / transB; batch dims broadcast as MatMul's do.
 * ------------------------------------------------------------------------ */

struct fmm_view {
    struct tensor a, b; /* the operands' logical (transposed) shapes */
    int ta, tb;
};

static int fmm_view(struct op_call *c, struct fmm_view *v) {
    int rc;
    if ((rc = need_f32(c, 0, "A", 1)) || (rc = need_f32(c, 1, "B", 1))) return rc;
    if (node_attr_int(c->node, "transBatchA", 0) || node_attr_int(c->node, "transBatchB", 0)) {
        op_error(c, "transBatchA and transBatchB are not supported");
        return STATUS_UNSUPPORTED;
    }
    v->a = *c->in[0];
    v->b = *c->in[1];
    v->ta = node_attr_int(c->node, "transA", 0) != 0 && v->a.ndim >= 2;
    v->tb = node_attr_int(c->node, "transB", 0) != 0 && v->b.ndim >= 2;
    struct tensor *t[2] = {&v->a, &v->b};
    int tr[2] = {v->ta, v->tb};
    for (int k = 0; k < 2; k++)
        if (tr[k]) {
            int64_t d = t[k]->dims[t[k]->ndim - 1];
            t[k]->dims[t[k]->ndim - 1] = t[k]->dims[t[k]->ndim - 2];
            t[k]->dims[t[k]->ndim - 2] = d;
        }
    return 0;
}

static int fmm_infer(struct op_call *c) {
    struct fmm_view v;
    struct cpu_mm_shape sh;
    int rc = fmm_view(c, &v);
    return rc ? rc : cpu_mm_shapes(c, &v.a, &v.b, &sh, c->out[0]);
}

static int fmm_prepare(struct op_call *c, void **state, size_t *scratch_size) {
    struct fmm_view v;
    struct cpu_mm_shape sh;
    int rc = fmm_view(c, &v);
    if (rc || (rc = cpu_mm_shapes(c, &v.a, &v.b, &sh, NULL))) return rc;
    struct cpu_mm_state *s = calloc(1, sizeof *s);
    if (!s) return op_error(c, "out of memory"), STATUS_NOMEM;
    dnnl_dims_t ad = {0}, bd = {0}, as = {0}, bs = {0};
    memcpy(ad, sh.a, sizeof(int64_t) * (size_t)sh.r);
    memcpy(bd, sh.b, sizeof(int64_t) * (size_t)sh.r);
    strides_of(sh.r, sh.a, v.ta, as);
    strides_of(sh.r, sh.b, v.tb, bs);
    dnnl_memory_desc_t a_md, b_md, y_md;
    dnnl_memory_desc_init_by_strides(&a_md, sh.r, ad, dnnl_f32, as);
    dnnl_memory_desc_init_by_strides(&b_md, sh.r, bd, dnnl_f32, bs);
    dnnl_util_plain_md(&y_md, sh.r, sh.y);
    int b_batch = 0;
    for (int i = 0; i < sh.r - 2; i++) b_batch |= sh.b[i] != 1;
    const void *b_const = c->in[1]->data && !b_batch ? c->in[1]->data : NULL;
    rc = cpu_mm_build(c, s, &a_md, &b_md, b_const, NULL, &y_md, node_attr_float(c->node, "alpha", 1.0f), 0,
                      scratch_size);
    if (rc) {
        cpu_mm_release(s);
        return rc;
    }
    *state = s;
    return 0;
}

static int fmm_run(struct op_call *c) {
    struct cpu_mm_state *s = c->state;
    if (tensor_numel(c->out[0]) == 0) return 0;
    void *args[3] = {c->in[0]->data, c->in[1]->data, c->out[0]->data};
    return dnnl_prim_exec(c, s->prim, args, c->scratch);
}

/* ------------------------------------------------------------------------
 * MatMulNBits: A [..., K] x dequantized B^T + bias -> [..., N].
 *   B [N, blocks, block_size * bits / 8] uint8: column n's K values in
 *   blocks, packed low bits first; scales [N * blocks]; zero_points either
 *   packed like B ([N * ceil(blocks * bits / 8)] uint8) or float [N *
 *   blocks], default 2^(bits - 1); g_idx (input 4) unsupported; bias
 *   (input 5) [N].
 * ------------------------------------------------------------------------ */

struct nbits_geom {
    int64_t k, n, bits, block, blocks, blob, zp_row; /* zp_row: packed zero point bytes per column */
};

static int nbits_geom(struct op_call *c, struct nbits_geom *g) {
    g->k = node_attr_int(c->node, "K", 0);
    g->n = node_attr_int(c->node, "N", 0);
    g->bits = node_attr_int(c->node, "bits", 4);
    g->block = node_attr_int(c->node, "block_size", 0);
    if (g->k <= 0 || g->n <= 0) return op_error(c, "attributes K and N are required and must be positive");
    if (g->bits != 2 && g->bits != 4 && g->bits != 8) {
        op_error(c, "bits=%lld is not supported (2, 4 and 8 are)", (long long)g->bits);
        return STATUS_UNSUPPORTED;
    }
    if (g->block < 16 || (g->block & (g->block - 1)))
        return op_error(c, "block_size=%lld must be a power of two >= 16", (long long)g->block);
    g->blocks = (g->k + g->block - 1) / g->block;
    g->blob = g->block * g->bits / 8;
    g->zp_row = (g->blocks * g->bits + 7) / 8;
    return 0;
}

static int nbits_check(struct op_call *c, struct nbits_geom *g) {
    int rc;
    if ((rc = nbits_geom(c, g)) || (rc = need_f32(c, 0, "A", 1)) || (rc = need_f32(c, 2, "scales", 1))) return rc;
    const struct tensor *a = c->in[0], *b = in_at(c, 1), *zp = in_at(c, 3), *bias = in_at(c, 5);
    if (!b || b->dtype != DT_UINT8 || tensor_numel(b) != g->n * g->blocks * g->blob)
        return op_error(c, "B must be uint8 [N=%lld, %lld blocks, %lld bytes]", (long long)g->n, (long long)g->blocks,
                        (long long)g->blob);
    if (a->ndim < 1 || a->dims[a->ndim - 1] != g->k)
        return op_error(c, "the last dim of A must be K=%lld", (long long)g->k);
    if (tensor_numel(c->in[2]) != g->n * g->blocks)
        return op_error(c, "scales must hold N * blocks = %lld values", (long long)(g->n * g->blocks));
    if (zp && !((zp->dtype == DT_UINT8 && tensor_numel(zp) == g->n * g->zp_row) ||
                (zp->dtype == DT_FP32 && tensor_numel(zp) == g->n * g->blocks)))
        return op_error(c, "zero_points must be uint8 packed like B (%lld values) or float (%lld values)",
                        (long long)(g->n * g->zp_row), (long long)(g->n * g->blocks));
    if (in_at(c, 4)) {
        op_error(c, "g_idx (act-order quantization) is not supported");
        return STATUS_UNSUPPORTED;
    }
    if (bias && ((rc = need_f32(c, 5, "bias", 1)) || tensor_numel(bias) != g->n))
        return rc ? rc : op_error(c, "bias must hold N=%lld values", (long long)g->n);
    return 0;
}

static int nbits_infer(struct op_call *c) {
    struct nbits_geom g;
    int rc = nbits_check(c, &g);
    if (rc) return rc;
    struct tensor *y = c->out[0];
    *y = *c->in[0];
    y->data = NULL;
    y->dims[y->ndim - 1] = g.n;
    return 0;
}

struct nbits_state {
    struct cpu_mm_state mm;
    float *w;   /* dequantized B^T, [N, K] (B's own layout), shared by the plans of the model */
    int bias;
};

static void nbits_release(void *st) {
    struct nbits_state *s = st;
    if (!s) return;
    dnnl_prim_free(s->mm.prim);
    dnnl_util_weights_release(s->mm.wbuf);
    dnnl_util_weights_release(s->w);
    free(s);
}

/* Column n's packed value j (bits wide, low bits first). */
static inline int nbits_at(const uint8_t *p, int64_t j, int64_t bits) {
    int64_t bit = j * bits;
    return (p[bit / 8] >> (bit % 8)) & ((1 << bits) - 1);
}

static void nbits_dequantize(const struct op_call *c, const struct nbits_geom *g, float *w) {
    const uint8_t *b = c->in[1]->data;
    const float *sc = c->in[2]->data;
    const struct tensor *zp = in_at(c, 3);
    const float def = (float)(1 << (g->bits - 1));
    for (int64_t n = 0; n < g->n; n++)
        for (int64_t blk = 0; blk < g->blocks; blk++) {
            int64_t i = n * g->blocks + blk;
            float z = !zp ? def
                      : zp->dtype == DT_FP32 ? ((const float *)zp->data)[i]
                                             : (float)nbits_at((const uint8_t *)zp->data + n * g->zp_row, blk, g->bits);
            const uint8_t *blob = b + i * g->blob;
            for (int64_t j = 0; j < g->block && blk * g->block + j < g->k; j++)
                w[n * g->k + blk * g->block + j] = ((float)nbits_at(blob, j, g->bits) - z) * sc[i];
        }
}

struct nbits_make_args {
    const struct nbits_geom *g;
};

/* The dequantized weights, made once for all the plans that share B. */
static void *nbits_make(struct op_call *c, void *arg) {
    const struct nbits_geom *g = ((struct nbits_make_args *)arg)->g;
    float *w = aligned_alloc(64, dnnl_util_align(sizeof(float) * (size_t)(g->n * g->k)));
    if (!w) {
        op_error(c, "out of memory for the dequantized weights");
        return NULL;
    }
    nbits_dequantize(c, g, w);
    return w;
}

static int nbits_prepare(struct op_call *c, void **state, size_t *scratch_size) {
    struct nbits_geom g;
    int rc = nbits_check(c, &g);
    if (rc || (rc = need_const(c, 1, "B")) || (rc = need_const(c, 2, "scales")) ||
        (rc = need_const(c, 3, "zero_points")))
        return rc;
    struct nbits_state *s = calloc(1, sizeof *s);
    if (!s) return op_error(c, "out of memory"), STATUS_NOMEM;
    /* keyed by B's bytes and both shapes: one copy however many plans */
    dnnl_memory_desc_t key_b, key_w;
    dnnl_dims_t kb = {g.n, g.blocks, g.blob}, kw = {g.n, g.k};
    dnnl_memory_desc_init_by_tag(&key_b, 3, kb, dnnl_u8, dnnl_abc);
    dnnl_memory_desc_init_by_tag(&key_w, 2, kw, dnnl_f32, dnnl_ab);
    struct nbits_make_args args = {&g};
    s->w = dnnl_util_shared_acquire(c, &key_b, c->in[1]->data, &key_w, nbits_make, &args);
    if (!s->w) {
        free(s);
        return STATUS_NOMEM;
    }
    int64_t m = tensor_numel(c->in[0]) / g.k;
    dnnl_dims_t ad = {m, g.k}, bd = {g.k, g.n}, yd = {m, g.n}, biasd = {1, g.n};
    dnnl_dims_t bst = {1, g.k};
    dnnl_memory_desc_t a_md, b_md, y_md, bias_md;
    dnnl_memory_desc_init_by_tag(&a_md, 2, ad, dnnl_f32, dnnl_ab);
    dnnl_memory_desc_init_by_strides(&b_md, 2, bd, dnnl_f32, bst);
    dnnl_memory_desc_init_by_tag(&y_md, 2, yd, dnnl_f32, dnnl_ab);
    dnnl_memory_desc_init_by_tag(&bias_md, 2, biasd, dnnl_f32, dnnl_ab);
    s->bias = in_at(c, 5) != NULL;
    rc = cpu_mm_build(c, &s->mm, &a_md, &b_md, s->w, s->bias ? &bias_md : NULL, &y_md, 1.0f, 0, scratch_size);
    if (rc) {
        nbits_release(s);
        return rc;
    }
    *state = s;
    return 0;
}

static int nbits_run(struct op_call *c) {
    struct nbits_state *s = c->state;
    if (tensor_numel(c->out[0]) == 0) return 0;
    void *args[4] = {c->in[0]->data, s->w, c->out[0]->data, s->bias ? c->in[5]->data : NULL};
    return dnnl_prim_exec(c, s->mm.prim, args, c->scratch);
}

/* ------------------------------------------------------------------------
 * DynamicQuantizeMatMul (A float, B, b_scale, b_zero_point?, bias?) and
 * MatMulIntegerToFloat (A, B, a_scale, b_scale, a_zero_point?,
 * b_zero_point?, bias?): int32 sums of the zero-point-shifted 8-bit
 * operands times a_scale * b_scale[n], plus bias. DynamicQuantizeMatMul
 * first quantizes A to uint8 with DynamicQuantizeLinear's scale and zero
 * point over the whole tensor, as onnxruntime does.
 * ------------------------------------------------------------------------ */

enum { IQ_DYNAMIC, IQ_TO_FLOAT };

struct iq_layout {
    int a_scale, b_scale, a_zp, b_zp, bias; /* input indices, -1: none */
};

static struct iq_layout iq_layout(int kind) {
    return kind == IQ_DYNAMIC ? (struct iq_layout){-1, 2, -1, 3, 4} : (struct iq_layout){2, 3, 4, 5, 6};
}

static int iq_kind(const struct op_call *c) {
    return strcmp(c->node->op_type, "DynamicQuantizeMatMul") == 0 ? IQ_DYNAMIC : IQ_TO_FLOAT;
}

static const struct tensor *in_idx(const struct op_call *c, int i) { return i >= 0 ? in_at(c, i) : NULL; }

static int iq_infer(struct op_call *c) {
    int kind = iq_kind(c), rc;
    struct iq_layout l = iq_layout(kind);
    const struct tensor *a = in_at(c, 0), *b = in_at(c, 1);
    if (kind == IQ_DYNAMIC ? (rc = need_f32(c, 0, "A", 1)) : (rc = cpu_need_q8(c, a, "A"))) return rc;
    if ((rc = cpu_need_q8(c, b, "B"))) return rc;
    struct cpu_mm_shape sh;
    if ((rc = cpu_mm_shapes(c, a, b, &sh, c->out[0]))) return rc;
    int64_t n = sh.b[sh.r - 1];
    if (!in_idx(c, l.b_scale) || (l.a_scale >= 0 && !in_idx(c, l.a_scale)))
        return op_error(c, "the scales are required");
    if ((rc = need_f32(c, l.b_scale, "b_scale", 1)) || (rc = cpu_qparam_ok(c, in_idx(c, l.b_scale), n, "b_scale")) ||
        (rc = cpu_qparam_ok(c, in_idx(c, l.b_zp), n, "b_zero_point")) ||
        (rc = need_f32(c, l.bias, "bias", 0)))
        return rc;
    if (l.a_scale >= 0 && ((rc = need_f32(c, l.a_scale, "a_scale", 1)) ||
                           (rc = cpu_qparam_ok(c, in_idx(c, l.a_scale), 1, "a_scale")) ||
                           (rc = cpu_qparam_ok(c, in_idx(c, l.a_zp), 1, "a_zero_point"))))
        return rc;
    const struct tensor *bias = in_idx(c, l.bias);
    if (bias && tensor_numel(bias) != n) return op_error(c, "bias must hold N=%lld values", (long long)n);
    return 0;
}

/* A constant 2-D B runs on oneDNN's int8 matmul (struct cpu_qgemm, the
 * int32 sums written into y and scaled there); anything else on the exact
 * loops of matmul_util.h (state NULL). Scratch: A as uint8
 * (DynamicQuantizeMatMul), then the product's. */
static void iq_release(void *st) {
    cpu_qgemm_free(st);
    free(st);
}

static size_t iq_qa_bytes(struct op_call *c) {
    return iq_kind(c) == IQ_DYNAMIC ? dnnl_util_align((size_t)tensor_numel(c->in[0])) : 0;
}

static int iq_prepare(struct op_call *c, void **state, size_t *scratch_size) {
    struct iq_layout l = iq_layout(iq_kind(c));
    struct cpu_mm_shape sh;
    int rc = cpu_mm_shapes(c, c->in[0], c->in[1], &sh, NULL);
    if (rc) return rc;
    *state = NULL;
    const struct tensor *a = c->in[0], *b = c->in[1];
    if (cpu_qgemm_usable(b, in_idx(c, l.b_zp)) && tensor_numel(a) > 0 && b->dims[1] > 0) {
        struct cpu_qgemm *q = calloc(1, sizeof *q);
        if (!q) return op_error(c, "out of memory"), STATUS_NOMEM;
        enum dtype a_dt = iq_kind(c) == IQ_DYNAMIC ? DT_UINT8 : a->dtype;
        if (!cpu_qgemm_build(c, q, tensor_numel(a) / b->dims[0], a_dt, b, in_idx(c, l.b_zp), scratch_size)) {
            *scratch_size += iq_qa_bytes(c);
            *state = q;
            return 0;
        }
        free(q);
    }
    *scratch_size = cpu_imm_scratch(c->in[0], c->in[1], c->out[0], 1) + iq_qa_bytes(c);
    return 0;
}

/* The exact loop's sums through the epilogue (struct cpu_qgemm_epi) that
 * the oneDNN path runs per row: the same float operations. */
static void iq_scale(const int32_t *acc, float *y, int64_t m, int64_t n, const struct cpu_qgemm_epi *e) {
    for (int64_t i = 0; i < m; i++) {
        const int32_t *ar = acc + i * n;
        float *yr = y + i * n;
        for (int64_t j = 0; j < n; j++) {
            yr[j] = (float)ar[j] * (e->a_scale * e->b_scale[e->b_scale_per ? j : 0]);
            if (e->bias) yr[j] += e->bias[j];
        }
        ew_act_f32(yr, n, e->act, e->act_a, e->act_b);
    }
}

static int iq_run(struct op_call *c) {
    int kind = iq_kind(c);
    struct iq_layout l = iq_layout(kind);
    struct cpu_mm_shape sh;
    int rc = cpu_mm_shapes(c, c->in[0], c->in[1], &sh, NULL);
    if (rc) return rc;
    struct tensor a = *c->in[0], azp = {DT_UINT8, 0, {0}, NULL};
    uint8_t zp8 = 0;
    float a_scale;
    struct op_call sub = *c;
    const size_t qa = iq_qa_bytes(c);
    if (c->scratch_size < qa) return op_error(c, "internal: scratch too small");
    if (kind == IQ_DYNAMIC) {
        a_scale = cpu_dynquant_u8(c->in[0]->data, tensor_numel(&a), c->scratch, &zp8);
        a.dtype = DT_UINT8;
        a.data = c->scratch;
        azp.data = &zp8;
    } else {
        a_scale = (float)cpu_qparam_at(in_idx(c, l.a_scale), 0, 1.0);
    }
    sub.scratch = (char *)c->scratch + qa;
    sub.scratch_size -= qa;
    const struct tensor *za = kind == IQ_DYNAMIC ? &azp : in_idx(c, l.a_zp);
    const int64_t n = sh.b[sh.r - 1], m = tensor_numel(c->out[0]) / (n > 0 ? n : 1);
    const struct tensor *bs = in_idx(c, l.b_scale), *bias = in_idx(c, l.bias);
    const struct cpu_qgemm_epi epi = {a_scale, bs->data, tensor_numel(bs) != 1, bias ? bias->data : NULL,
                                      c->node->act, c->node->act_alpha, c->node->act_beta};
    if (c->state) /* the epilogue in the product's pass over each row */
        return cpu_qgemm_run(&sub, c->state, a.data, a.dtype, (int32_t)cpu_qparam_at(za, 0, 0), c->out[0]->data, &epi);
    int32_t *a32, *b32, *acc;
    if ((rc = cpu_imm_widened(&sub, &sh, &a, za, c->in[1], in_idx(c, l.b_zp), &a32, &b32, &acc))) return rc;
    cpu_imm_run(&sh, a32, b32, acc, c->nthreads);
    iq_scale(acc, c->out[0]->data, m, n, &epi);
    return 0;
}

/* ------------------------------------------------------------------------
 * QGemm: A, a_scale, a_zero_point, B, b_scale, b_zero_point, C? (int32),
 * y_scale?, y_zero_point?; alpha, transA, transB. The int32 sums plus C,
 * times alpha * a_scale * b_scale[n] (/ y_scale), are requantized to
 * y_zero_point's type when it is given, float otherwise.
 * ------------------------------------------------------------------------ */

enum { QG_A, QG_AS, QG_AZ, QG_B, QG_BS, QG_BZ, QG_C, QG_YS, QG_YZ };

struct qgemm_params {
    int64_t m, k, n;
    int ta, tb;
    float alpha;
};

static int qgemm_geom(struct op_call *c, struct qgemm_params *p) {
    const struct tensor *a = in_at(c, QG_A), *b = in_at(c, QG_B);
    int rc;
    if ((rc = cpu_need_q8(c, a, "A")) || (rc = cpu_need_q8(c, b, "B"))) return rc;
    if (a->ndim != 2 || b->ndim != 2) return op_error(c, "A and B must be 2-D (ranks %d and %d)", a->ndim, b->ndim);
    p->ta = node_attr_int(c->node, "transA", 0) != 0;
    p->tb = node_attr_int(c->node, "transB", 0) != 0;
    p->alpha = node_attr_float(c->node, "alpha", 1.0f);
    p->m = a->dims[p->ta ? 1 : 0];
    p->k = a->dims[p->ta ? 0 : 1];
    p->n = b->dims[p->tb ? 0 : 1];
    if (b->dims[p->tb ? 1 : 0] != p->k)
        return op_error(c, "inner dims differ: %lld (A) vs %lld (B)", (long long)p->k, (long long)b->dims[p->tb ? 1 : 0]);
    return 0;
}

static int qgemm_infer(struct op_call *c) {
    struct qgemm_params p;
    int rc = qgemm_geom(c, &p);
    if (rc) return rc;
    if (!in_at(c, QG_AS) || !in_at(c, QG_BS)) return op_error(c, "a_scale and b_scale are required");
    if ((rc = cpu_qparam_ok(c, in_at(c, QG_AS), 1, "a_scale")) || (rc = cpu_qparam_ok(c, in_at(c, QG_AZ), 1, "a_zero_point")) ||
        (rc = cpu_qparam_ok(c, in_at(c, QG_BS), p.n, "b_scale")) || (rc = cpu_qparam_ok(c, in_at(c, QG_BZ), p.n, "b_zero_point")) ||
        (rc = cpu_qparam_ok(c, in_at(c, QG_YS), 1, "y_scale")) || (rc = cpu_qparam_ok(c, in_at(c, QG_YZ), 1, "y_zero_point")))
        return rc;
    const struct tensor *cb = in_at(c, QG_C), *yz = in_at(c, QG_YZ);
    if (cb) {
        int64_t cn = tensor_numel(cb);
        if (cb->dtype != DT_INT32) return op_error(c, "C must be int32 (got %s)", dtype_name(cb->dtype));
        if (cb->ndim > 2 || !(cn == 1 || cn == p.n * (cb->ndim == 2 && cb->dims[0] == p.m ? p.m : 1) ||
                              (cb->ndim == 2 && cb->dims[0] == p.m && cb->dims[1] == 1)))
            return op_error(c, "C must broadcast to [%lld, %lld]", (long long)p.m, (long long)p.n);
    }
    if (yz && !cpu_is_q8(yz->dtype)) return op_error(c, "y_zero_point must be uint8 or int8"), STATUS_UNSUPPORTED;
    *c->out[0] = (struct tensor){yz ? yz->dtype : DT_FP32, 2, {p.m, p.n}, NULL};
    return 0;
}

static int qgemm_prepare(struct op_call *c, void **state, size_t *scratch_size) {
    struct qgemm_params p;
    int rc = qgemm_geom(c, &p);
    if (rc) return rc;
    *scratch_size = sizeof(int32_t) * (size_t)(dnnl_util_align((size_t)(p.m * p.k)) + dnnl_util_align((size_t)(p.k * p.n)) +
                                               (size_t)(p.m * p.n));
    return params_keep(c, &p, sizeof p, state);
}

/* The element of C (broadcast to [m, n]) for row i, column j. */
static int32_t qgemm_c_at(const struct tensor *cb, int64_t i, int64_t j) {
    if (!cb) return 0;
    const int32_t *v = cb->data;
    int64_t cn = tensor_numel(cb);
    if (cn == 1) return v[0];
    if (cb->ndim == 2 && cb->dims[1] == 1) return v[i];
    if (cb->ndim == 2 && cb->dims[0] != 1) return v[i * cb->dims[1] + j];
    return v[j];
}

/* Element i of an 8-bit tensor (uint8 or int8). */
static inline int32_t q8_at(const struct tensor *t, int64_t i) {
    return t->dtype == DT_UINT8 ? ((const uint8_t *)t->data)[i] : ((const int8_t *)t->data)[i];
}

static int qgemm_run(struct op_call *c) {
    const struct qgemm_params *p = c->state;
    const int64_t m = p->m, k = p->k, n = p->n;
    int32_t *a32 = c->scratch, *b32 = a32 + dnnl_util_align((size_t)(m * k)), *acc = b32 + dnnl_util_align((size_t)(k * n));
    const struct tensor *a = c->in[QG_A], *b = c->in[QG_B];
    /* widened minus the zero points, as [m, k] and [k, n] */
    const int32_t az = (int32_t)cpu_qparam_at(in_at(c, QG_AZ), 0, 0);
    for (int64_t i = 0; i < m; i++)
        for (int64_t t = 0; t < k; t++) a32[i * k + t] = q8_at(a, p->ta ? t * m + i : i * k + t) - az;
    const struct tensor *bz = in_at(c, QG_BZ);
    const int bz_per = bz && tensor_numel(bz) > 1;
    for (int64_t j = 0; j < n; j++) {
        const int32_t zj = (int32_t)cpu_qparam_at(bz, bz_per ? j : 0, 0);
        for (int64_t t = 0; t < k; t++) b32[t * n + j] = q8_at(b, p->tb ? j * k + t : t * n + j) - zj;
    }
    struct cpu_mm_shape sh = {2, {m, k}, {k, n}, {m, n}};
    cpu_imm_run(&sh, a32, b32, acc, c->nthreads);
    const struct tensor *cb = in_at(c, QG_C), *ys = in_at(c, QG_YS), *yz = in_at(c, QG_YZ);
    const float as = (float)cpu_qparam_at(in_at(c, QG_AS), 0, 1.0), yscale = (float)cpu_qparam_at(ys, 0, 1.0);
    struct tensor *y = c->out[0];
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            float mult = p->alpha * as * (float)cpu_qparam_at(in_at(c, QG_BS), j, 1.0);
            if (ys) mult /= yscale;
            float v = (float)(acc[i * n + j] + qgemm_c_at(cb, i, j)) * mult;
            if (yz) cpu_q8_store(y->data, y->dtype, i * n + j, (double)v + cpu_qparam_at(yz, 0, 0));
            else ((float *)y->data)[i * n + j] = v;
        }
    return 0;
}

/* ------------------------------------------------------------------------
 * The table
 * ------------------------------------------------------------------------ */

#define MS "com.microsoft"

const struct op_def op_defs_contrib_matmul[] = {
    {"FusedMatMul", MS, fmm_infer, fmm_prepare, fmm_run, cpu_mm_release, 0},
    {"MatMulNBits", MS, nbits_infer, nbits_prepare, nbits_run, nbits_release, 0},
    {"DynamicQuantizeMatMul", MS, iq_infer, iq_prepare, iq_run, iq_release, OP_FUSE_ACT},
    {"MatMulIntegerToFloat", MS, iq_infer, iq_prepare, iq_run, iq_release, OP_FUSE_ACT},
    {"QGemm", MS, qgemm_infer, qgemm_prepare, qgemm_run, op_params_free, 0},
    {0},
};
