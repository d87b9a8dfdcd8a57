/* passes_hardswish.c - HardSwish written out, as one HardSwish node.
 *
 * Paddle2ONNX (PP-OCR, PicoDet layout models) and torch's exports before
 * opset 14 write hard-swish as
 *
 *   y = Div(Mul(x, Clip(Add(x, 3), 0, 6)), 6)      (or Mul by 1/6)
 *   y = Mul(x, HardSigmoid(x, alpha=1/6, beta=0.5))
 *
 * three or four passes over every activation of the network, each its own
 * node: a PicoDet layout model spent 35% of its time there. Either becomes
 * one HardSwish (opset 14: x * max(0, min(1, x / 6 + 0.5))), which the
 * activation pass then fuses into x's producer (oneDNN's hardswish
 * post-op on the Conv). The same function, within float32 rounding:
 * (x + 3) / 6 and x / 6 + 0.5 differ in the last bit at most. */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "kernels/ops.h"
#include "models/passes.h"
#include "models/passes_util.h"

/* 1 if value v is a float32 scalar constant within 1e-4 of want. */
static int const_f32_near(const struct graph *g, const struct graph_node *n, int v, double want) {
    const int o = pass_other_input(g, n, v, want);
    const struct tensor *t = o >= 0 ? pass_const_of(g, o) : NULL;
    return t && t->dtype == DT_FP32;
}

/* Mul(x, s) -> y, where s is the node's other input: y's node becomes
 * HardSwish(x), and the nodes dead[] lists go. */
static int become_hardswish(struct pass *ps, int yi, int x) {
    const int rc = pass_become(ps, yi, "", "HardSwish", &x, 1, 0);
    if (rc > 0) ps->g->nodes[yi].opset = 14;
    return rc;
}

/* Matched at the Clip: Div(Mul(x, Clip(Add(x, 3), 0, 6)), 6). */
static int hardswish_clip(struct pass *ps, int ci) {
    struct graph *g = ps->g;
    const struct graph_node *c = &g->nodes[ci];
    enum act_kind kind;
    float lo, hi;
    if (c->nout != 1 || !passes_activation_of(g, c, &kind, &lo, &hi) || kind != ACT_CLIP || lo != 0.0f || hi != 6.0f)
        return 0;
    const int ai = pass_sole_producer(ps, c->in[0], "Add");
    if (ai < 0 || g->nodes[ai].nin != 2) return 0;
    int x = -1;
    for (int k = 0; k < 2 && x < 0; k++)
        if (const_f32_near(g, &g->nodes[ai], g->nodes[ai].in[k], 3.0)) x = g->nodes[ai].in[k];
    const int mi = x >= 0 ? pass_next_op(ps, ci, "Mul") : -1;
    if (mi < 0 || g->nodes[mi].nin != 2) return 0;
    const struct graph_node *m = &g->nodes[mi];
    if (pass_other_of(m, c->out[0]) != x) return 0;
    int yi = pass_next_op(ps, mi, "Div");
    if (yi >= 0 && (g->nodes[yi].in[0] != m->out[0] || !const_f32_near(g, &g->nodes[yi], m->out[0], 6.0))) yi = -1;
    if (yi < 0 && (yi = pass_next_op(ps, mi, "Mul")) >= 0 && !const_f32_near(g, &g->nodes[yi], m->out[0], 1.0 / 6.0))
        yi = -1;
    if (yi < 0) return 0;
    const int rc = become_hardswish(ps, yi, x);
    if (rc <= 0) return rc;
    ps->dead[ai] = ps->dead[ci] = ps->dead[mi] = 1;
    log_debug("HardSwish from '%s' (Clip) and its parts: one node", g->nodes[ci].name);
    return 1;
}

/* Matched at the HardSigmoid: Mul(x, HardSigmoid(x, 1/6, 0.5)). */
static int hardswish_sigmoid(struct pass *ps, int hi) {
    struct graph *g = ps->g;
    const struct graph_node *h = &g->nodes[hi];
    enum act_kind kind;
    float alpha, beta;
    if (h->nout != 1 || !passes_activation_of(g, h, &kind, &alpha, &beta) || kind != ACT_HARD_SIGMOID ||
        alpha != 1.0f / 6.0f || beta != 0.5f)
        return 0;
    const int x = h->in[0], mi = pass_next_op(ps, hi, "Mul");
    if (mi < 0 || g->nodes[mi].nin != 2) return 0;
    const struct graph_node *m = &g->nodes[mi];
    if (pass_other_of(m, h->out[0]) != x) return 0;
    const int rc = become_hardswish(ps, mi, x);
    if (rc <= 0) return rc;
    ps->dead[hi] = 1;
    log_debug("HardSwish from '%s' (HardSigmoid) and its Mul: one node", g->nodes[hi].name);
    return 1;
}

static int hardswish_node(struct pass *ps, int i) {
    const struct graph_node *n = &ps->g->nodes[i];
    if (ps->dead[i] || n->nin < 1 || n->in[0] < 0) return 0;
    if (pass_is_op(n, "Clip")) return hardswish_clip(ps, i);
    if (pass_is_op(n, "HardSigmoid")) return hardswish_sigmoid(ps, i);
    return 0;
}

static const struct pass_def hardswish_pass = {"fusing HardSwish", hardswish_node, 0};

int passes_fuse_hardswish(struct graph *g, int *nfused, char *err, size_t err_len) {
    return pass_run(&hardswish_pass, g, NULL, nfused, err, err_len);
}
