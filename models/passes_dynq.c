/* passes_dynq.c - onnxruntime's dynamic quantization (quantize_dynamic)
 * as one node per product.
 *
 * quantize_dynamic writes each MatMul of float x by constant weights as
 *
 *   x_q, x_scale, x_zp = DynamicQuantizeLinear(x)
 *   acc   = MatMulInteger(x_q, W_q, x_zp, w_zp)        (int32)
 *   s     = Mul(x_scale, w_scale)
 *   y     = Mul(Cast(acc, to=float), s) [+ Add(bias)]
 *
 * which becomes com.microsoft MatMulIntegerToFloat(x_q, W_q, x_scale,
 * w_scale, x_zp, w_zp, bias): the int32 sums on oneDNN's int8 matmul and
 * the float epilogue in the same kernel, with the same float operations
 * (so the same bits). When the DynamicQuantizeLinear serves this product
 * alone it goes too, into DynamicQuantizeMatMul(x, W_q, w_scale, w_zp,
 * bias); one that feeds several products (attention's Q, K and V) stays,
 * and x is quantized once.
 *
 * Each Conv it writes as the same chain around ConvInteger, the bias an
 * Add of [M, 1, 1] (over the output's channels), which becomes
 * kiln.ConvIntegerToFloat(x_q, W_q, x_scale, w_scale, x_zp, w_zp, bias)
 * with the Conv's attributes: the epilogue runs on each row of the 8-bit
 * GEMM's sums (or on each plane of the grouped loop's) instead of four
 * passes over the output in float (Cast, Mul, Add, and the Relu or Clip,
 * which the activation fusion after this pass moves into the node). */
#include "common/log.h"
#include "kernels/ops.h"
#include "models/passes.h"
#include "models/passes_util.h"

/* The other input of binary node n, which reads v, or -1. */
static int other_of(const struct graph_node *n, int v) {
    if (n->nin != 2) return -1;
    return n->in[0] == v ? n->in[1] : n->in[1] == v ? n->in[0] : -1;
}

/* A float32 constant of rank 0 or 1 holding 1 or n values (a scale) or,
 * 1-D, n (a bias): what broadcasts over the product's columns without
 * changing its shape. */
static int f32_const(const struct graph *g, int v, int64_t n, int bias) {
    const struct tensor *t = pass_const_of(g, v);
    if (!t || t->dtype != DT_FP32 || t->ndim > 1) return 0;
    return bias ? t->ndim == 1 && t->dims[0] == n : tensor_numel(t) == 1 || tensor_numel(t) == n;
}

/* The DynamicQuantizeLinear that made product node p's x_q (input 0) and
 * x_zp (input 2), or -1. */
static int dq_of(struct pass *ps, const struct graph_node *p) {
    const struct graph *g = ps->g;
    if (p->nin < 3 || p->nout != 1 || p->in[0] < 0) return -1;
    const int di = g->values[p->in[0]].producer;
    if (di < 0 || ps->dead[di]) return -1;
    const struct graph_node *d = &g->nodes[di];
    if (!pass_is_op(d, "DynamicQuantizeLinear") || d->nout != 3 || d->out[0] != p->in[0] || d->out[1] < 0 ||
        d->out[2] < 0 || p->in[2] != d->out[2])
        return -1;
    return di;
}

/* A float32 constant that broadcasts over an output of rank r along its
 * channel axis (1) only: m values shaped [m], [m, 1, ...] or [1, m, 1, ...]
 * right-aligned to that axis, or (one_ok) a single value. */
static int chan_const(const struct graph *g, int v, int64_t m, int r, int one_ok) {
    const struct tensor *t = pass_const_of(g, v);
    if (!t || t->dtype != DT_FP32 || t->ndim > r) return 0;
    if (one_ok && tensor_numel(t) == 1) return 1;
    if (tensor_numel(t) != m || t->ndim < r - 1) return 0;
    for (int i = 0; i < t->ndim; i++)
        if (t->dims[i] != (r - t->ndim + i == 1 ? m : 1)) return 0;
    return 1;
}

/* One product's match: the DynamicQuantizeLinear di of its x, W and w_zp,
 * then Cast to float, Mul by s = Mul(x_scale, w_scale), and an Add of the
 * bias if any. conv: the product is a ConvInteger, whose scale and bias
 * broadcast over its output's channels (rank r); else a MatMulInteger's,
 * over its N columns. */
struct dq_match {
    int di, wz, ci, ui, s, si, ws, bias, last;
};

static int dq_vec(const struct graph *g, int v, int64_t n, int conv, int r, int bias) {
    return conv ? chan_const(g, v, n, r, !bias) : f32_const(g, v, n, bias);
}

static int dq_match(struct pass *ps, int pi, int conv, struct dq_match *mt) {
    struct graph *g = ps->g;
    const struct graph_node *p = &g->nodes[pi];
    if (ps->dead[pi] || !pass_is_op(p, conv ? "ConvInteger" : "MatMulInteger") || (mt->di = dq_of(ps, p)) < 0) return 0;
    /* constant weights: MatMulInteger's [K, N], ConvInteger's [M, C / group, kernel...] */
    const struct tensor *w = pass_const_of(g, p->in[1]);
    mt->wz = p->nin > 3 ? p->in[3] : -1;
    if (!w || (conv ? w->ndim < 3 : w->ndim != 2) || (mt->wz >= 0 && !pass_const_of(g, mt->wz))) return 0;
    const int64_t n = w->dims[conv ? 0 : 1];
    const int r = w->ndim;
    mt->ci = pass_next_op(ps, pi, "Cast");
    if (mt->ci < 0 || node_attr_int(&g->nodes[mt->ci], "to", 0) != DT_FP32) return 0;
    mt->ui = pass_next_op(ps, mt->ci, "Mul");
    if (mt->ui < 0) return 0;
    mt->s = other_of(&g->nodes[mt->ui], g->nodes[mt->ci].out[0]);
    mt->si = mt->s >= 0 ? g->values[mt->s].producer : -1;
    if (mt->si < 0 || ps->dead[mt->si] || !pass_is_op(&g->nodes[mt->si], "Mul") || g->nodes[mt->si].nout != 1) return 0;
    mt->ws = other_of(&g->nodes[mt->si], g->nodes[mt->di].out[1]);
    if (mt->ws < 0 || !dq_vec(g, mt->ws, n, conv, r, 0)) return 0;
    mt->bias = -1;
    mt->last = mt->ui;
    const int ai = pass_next_op(ps, mt->ui, "Add");
    if (ai >= 0) {
        const int b = other_of(&g->nodes[ai], g->nodes[mt->ui].out[0]);
        if (b >= 0 && dq_vec(g, b, n, conv, r, 1)) {
            mt->bias = b;
            mt->last = ai;
        }
    }
    return 1;
}

/* After pass_become made the product node ni one node: the chain goes, ni
 * writes its end in float32 (for the passes after: GELU, activations). */
static int dq_done(struct pass *ps, int ni, const struct dq_match *mt, const char *name) {
    struct graph *g = ps->g;
    ps->dead[mt->ci] = 1;
    if (mt->last != mt->ui) ps->dead[mt->ui] = 1;
    pass_take_output(ps, ni, mt->last);
    struct tensor *yt = &g->values[g->nodes[ni].out[0]].t;
    if (yt->dtype == DT_UNDEFINED || yt->dtype == DT_INT32) yt->dtype = DT_FP32;
    log_debug("dynamic quantization: '%s' runs as %s%s", name, g->nodes[ni].op_type,
              mt->bias >= 0 ? " with its bias" : "");
    return 1;
}

/* At a MatMulInteger or a ConvInteger. */
static int dynq_node(struct pass *ps, int i) {
    struct graph *g = ps->g;
    struct dq_match mt;
    const int conv = pass_is_op(&g->nodes[i], "ConvInteger");
    if (!dq_match(ps, i, conv, &mt)) return 0;
    const struct graph_node *p = &g->nodes[i], *d = &g->nodes[mt.di];
    const char *name = p->name;
    int rc;
    if (conv) {
        const int in[7] = {p->in[0], p->in[1], d->out[1], mt.ws, p->in[2], mt.wz, mt.bias};
        rc = pass_become(ps, i, "kiln", "ConvIntegerToFloat", in, 7, 1);
        return rc <= 0 ? rc : dq_done(ps, i, &mt, name);
    }
    /* The DynamicQuantizeLinear goes too when only this product (and its
     * scale's Mul) reads it. */
    const int alone = ps->nuse[d->out[0]] == 1 && ps->nuse[d->out[2]] == 1 && ps->nuse[d->out[1]] == 1 &&
                      ps->nuse[mt.s] == 1 && !ps->is_out[d->out[0]] && !ps->is_out[d->out[1]] &&
                      !ps->is_out[d->out[2]] && !ps->is_out[mt.s] && d->in[0] >= 0;
    if (alone) {
        const int in[5] = {d->in[0], p->in[1], mt.ws, mt.wz, mt.bias};
        rc = pass_become(ps, i, "com.microsoft", "DynamicQuantizeMatMul", in, 5, 0);
        if (rc > 0) ps->dead[mt.di] = ps->dead[mt.si] = 1;
    } else {
        const int in[7] = {p->in[0], p->in[1], d->out[1], mt.ws, p->in[2], mt.wz, mt.bias};
        rc = pass_become(ps, i, "com.microsoft", "MatMulIntegerToFloat", in, 7, 0);
    }
    return rc <= 0 ? rc : dq_done(ps, i, &mt, name);
}

static const struct pass_def dynq_pass = {"fusing dynamically quantized products", dynq_node, 0};

int passes_fuse_dynq(struct graph *g, int *nfused, char *err, size_t err_len) {
    return pass_run(&dynq_pass, g, NULL, nfused, err, err_len);
}
