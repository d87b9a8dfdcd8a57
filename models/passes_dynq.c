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
 * and x is quantized once. */
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

/* Matched at the MatMulInteger. */
static int dynq_node(struct pass *ps, int mi) {
    struct graph *g = ps->g;
    const struct graph_node *m = &g->nodes[mi];
    if (ps->dead[mi] || !pass_is_op(m, "MatMulInteger") || m->nin < 2 || m->nout != 1 || m->in[0] < 0) return 0;
    /* x_q and x_zp from one DynamicQuantizeLinear */
    const int di = g->values[m->in[0]].producer;
    if (di < 0 || ps->dead[di]) return 0;
    const struct graph_node *d = &g->nodes[di];
    if (!pass_is_op(d, "DynamicQuantizeLinear") || d->nout != 3 || d->out[0] != m->in[0] || d->out[1] < 0 ||
        d->out[2] < 0 || m->nin < 3 || m->in[2] != d->out[2])
        return 0;
    /* constant 2-D weights: N columns */
    const struct tensor *w = pass_const_of(g, m->in[1]);
    const int wz = m->nin > 3 ? m->in[3] : -1;
    if (!w || w->ndim != 2 || (wz >= 0 && !pass_const_of(g, wz))) return 0;
    const int64_t n = w->dims[1];
    /* Cast to float, then Mul by x_scale * w_scale */
    const int ci = pass_next_op(ps, mi, "Cast");
    if (ci < 0 || node_attr_int(&g->nodes[ci], "to", 0) != DT_FP32) return 0;
    const int ui = pass_next_op(ps, ci, "Mul");
    if (ui < 0) return 0;
    const int s = other_of(&g->nodes[ui], g->nodes[ci].out[0]);
    const int si = s >= 0 ? g->values[s].producer : -1;
    if (si < 0 || ps->dead[si] || !pass_is_op(&g->nodes[si], "Mul") || g->nodes[si].nout != 1) return 0;
    const int ws = other_of(&g->nodes[si], d->out[1]);
    if (ws < 0 || !f32_const(g, ws, n, 0)) return 0;
    /* an Add of a [N] bias, if any */
    int last = ui, bias = -1;
    const int ai = pass_next_op(ps, ui, "Add");
    if (ai >= 0) {
        const int b = other_of(&g->nodes[ai], g->nodes[ui].out[0]);
        if (b >= 0 && f32_const(g, b, n, 1)) {
            bias = b;
            last = ai;
        }
    }
    /* The DynamicQuantizeLinear goes too when only this product (and its
     * scale's Mul) reads it. */
    const int alone = ps->nuse[d->out[0]] == 1 && ps->nuse[d->out[2]] == 1 && ps->nuse[d->out[1]] == 1 &&
                      ps->nuse[s] == 1 && !ps->is_out[d->out[0]] && !ps->is_out[d->out[1]] &&
                      !ps->is_out[d->out[2]] && !ps->is_out[s] && d->in[0] >= 0;
    const char *name = g->nodes[mi].name;
    int rc;
    if (alone) {
        const int in[5] = {d->in[0], m->in[1], ws, wz, bias};
        rc = pass_become(ps, mi, "com.microsoft", "DynamicQuantizeMatMul", in, 5, 0);
        if (rc > 0) ps->dead[di] = ps->dead[si] = 1;
    } else {
        const int in[7] = {m->in[0], m->in[1], d->out[1], ws, m->in[2], wz, bias};
        rc = pass_become(ps, mi, "com.microsoft", "MatMulIntegerToFloat", in, 7, 0);
    }
    if (rc <= 0) return rc;
    ps->dead[ci] = 1;
    if (last != ui) ps->dead[ui] = 1;
    pass_take_output(ps, mi, last);
    /* float32, for the passes after (GELU and activation fusion) */
    struct tensor *yt = &g->values[g->nodes[mi].out[0]].t;
    if (yt->dtype == DT_UNDEFINED) yt->dtype = DT_FP32;
    log_debug("dynamic quantization: '%s' runs as %s%s", name, g->nodes[mi].op_type, bias >= 0 ? " with its bias" : "");
    return 1;
}

static const struct pass_def dynq_pass = {"fusing dynamically quantized products", dynq_node, 0};

int passes_fuse_dynq(struct graph *g, int *nfused, char *err, size_t err_len) {
    return pass_run(&dynq_pass, g, NULL, nfused, err, err_len);
}
