/* passes.c - load-time graph rewrites: constant folding, dead-node
 * elimination, Conv+BatchNormalization folding, bias and activation fusion.
 * Each pass is a rewrite of one node, run over the graph by pass_run, which
 * owns what every pass needs around it (read counts, the removed nodes). */
#include "models/passes.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"
#include "kernels/cpu/dnnl_util.h"
#include "kernels/ops.h"
#include "models/eval.h"
#include "models/passes_util.h"

/* ---- helpers ----------------------------------------------------------------- */

static void node_free(struct graph_node *n) {
    free(n->name);
    free(n->op_type);
    free(n->domain);
    free(n->in);
    free(n->out);
    for (int a = 0; a < n->nattr; a++) graph_attr_clear(&n->attrs[a]);
    free(n->attrs);
}

/* Removes the nodes marked in dead[] (order of the others is kept, so the
 * graph stays topologically sorted) and recomputes every producer. */
static void drop_nodes(struct graph *g, const unsigned char *dead) {
    int w = 0;
    for (int i = 0; i < g->nnodes; i++) {
        if (dead[i]) node_free(&g->nodes[i]);
        else g->nodes[w++] = g->nodes[i];
    }
    g->nnodes = w;
    for (int v = 0; v < g->nvalues; v++) g->values[v].producer = -1;
    for (int i = 0; i < g->nnodes; i++)
        for (int k = 0; k < g->nodes[i].nout; k++)
            if (g->nodes[i].out[k] >= 0) g->values[g->nodes[i].out[k]].producer = i;
}

/* Readers of each value; graph outputs count as readers too (is_out[]
 * tells them apart). */
static int *count_uses(const struct graph *g, unsigned char **is_out) {
    int *nuse = calloc((size_t)(g->nvalues > 0 ? g->nvalues : 1), sizeof *nuse);
    *is_out = calloc((size_t)(g->nvalues > 0 ? g->nvalues : 1), 1);
    if (!nuse || !*is_out) {
        free(nuse);
        free(*is_out);
        *is_out = NULL;
        return NULL;
    }
    for (int i = 0; i < g->nnodes; i++)
        for (int k = 0; k < g->nodes[i].nin; k++)
            if (g->nodes[i].in[k] >= 0) nuse[g->nodes[i].in[k]]++;
    for (int o = 0; o < g->noutputs; o++) {
        nuse[g->outputs[o]]++;
        (*is_out)[g->outputs[o]] = 1;
    }
    return nuse;
}

/* The single live reader of value v, or -1. */
static int sole_reader(const struct graph *g, const unsigned char *dead, int v, int after) {
    int r = -1;
    for (int i = after + 1; i < g->nnodes; i++) {
        if (dead[i]) continue;
        for (int k = 0; k < g->nodes[i].nin; k++)
            if (g->nodes[i].in[k] == v) {
                if (r >= 0 && r != i) return -1;
                r = i;
            }
    }
    return r;
}

static int is_op(const struct graph_node *n, const char *op_type) {
    return (!n->domain[0] || strcmp(n->domain, "ai.onnx") == 0) && strcmp(n->op_type, op_type) == 0;
}

static const struct tensor *const_of(const struct graph *g, int v) {
    return v >= 0 && g->values[v].t.data ? &g->values[v].t : NULL;
}

/* 1 if node n has no output other than out[0] that anything reads. */
static int only_first_output_used(const struct graph *g, const struct graph_node *n, const int *nuse) {
    for (int k = 1; k < n->nout; k++)
        if (n->out[k] >= 0 && nuse[n->out[k]] > 0) return 0;
    return n->nout >= 1 && n->out[0] >= 0;
}

/* Makes a new constant value named after base with a unique suffix; takes
 * ownership of t->data. Returns its index or -1 (t->data freed). */
static int new_const(struct graph *g, const char *base, const char *suffix, struct tensor *t) {
    char name[512];
    snprintf(name, sizeof name, "%s%s", base, suffix);
    for (int k = 1; graph_find_value(g, name) >= 0 && k < 1000; k++)
        snprintf(name, sizeof name, "%s%s_%d", base, suffix, k);
    int v = graph_find_value(g, name) >= 0 ? -1 : graph_intern_value(g, name);
    if (v < 0) {
        tensor_free_data(t);
        return -1;
    }
    g->values[v].t = *t;
    g->values[v].producer = -1;
    return v;
}

static int set_nin(struct graph_node *n, int nin) {
    if (nin <= n->nin) return 0;
    int *in = realloc(n->in, (size_t)nin * sizeof *in);
    if (!in) return -1;
    for (int k = n->nin; k < nin; k++) in[k] = -1;
    n->in = in;
    n->nin = nin;
    return 0;
}

/* ---- the pass runner ------------------------------------------------------------- */

/* The runner and the functions that passes in files of their own take
 * (passes_util.h). */
int pass_nomem(struct pass *ps) {
    return status_set(ps->err, ps->err_len, STATUS_NOMEM, "out of memory %s", ps->what);
}

int pass_run(const struct pass_def *def, struct graph *g, void *ctx, int *ndone, char *err, size_t err_len) {
    struct pass ps = {.g = g, .ctx = ctx, .what = def->what, .err = err, .err_len = err_len};
    if (ndone) *ndone = 0;
    ps.nuse = count_uses(g, &ps.is_out);
    ps.dead = calloc((size_t)(g->nnodes > 0 ? g->nnodes : 1), 1);
    int rc = 0, done = 0;
    if (!ps.nuse || !ps.dead) rc = pass_nomem(&ps);
    for (int j = 0; j < g->nnodes && rc >= 0; j++) {
        rc = def->rewrite(&ps, def->backwards ? g->nnodes - 1 - j : j);
        if (rc > 0) done++;
    }
    if (rc >= 0 && done) drop_nodes(g, ps.dead);
    free(ps.nuse);
    free(ps.is_out);
    free(ps.dead);
    if (rc < 0) return rc;
    if (ndone) *ndone = done;
    return 0;
}

/* Node pi takes over output 0 of node ai, its output's one reader, and ai
 * goes when the pass ends. */
static void take_output(struct pass *ps, int pi, int ai) {
    struct graph *g = ps->g;
    int v = g->nodes[ai].out[0];
    g->nodes[pi].out[0] = v;
    g->values[v].producer = pi;
    ps->dead[ai] = 1;
}

void pass_take_output(struct pass *ps, int pi, int ai) { take_output(ps, pi, ai); }
int pass_is_op(const struct graph_node *n, const char *op_type) { return is_op(n, op_type); }
const struct tensor *pass_const_of(const struct graph *g, int v) { return const_of(g, v); }

/* ---- constant folding ------------------------------------------------------------ */

static int is_random(const char *op_type) {
    return strncmp(op_type, "Random", 6) == 0 || strcmp(op_type, "Bernoulli") == 0 ||
           strcmp(op_type, "Multinomial") == 0;
}

/* Folds node i when its inputs are all constants and its kernel agrees. */
static int fold_constant_node(struct pass *ps, int i) {
    struct graph *g = ps->g;
    struct graph_node *n = &g->nodes[i];
    if (!n->op || !n->op->run || is_random(n->op_type) || n->nin > OP_MAX_IO || n->nout > OP_MAX_IO) return 0;
    const struct tensor *in[OP_MAX_IO];
    for (int k = 0; k < n->nin; k++) {
        int v = n->in[k];
        in[k] = v >= 0 ? &g->values[v].t : NULL;
        if (v >= 0 && (!g->values[v].t.data || g->values[v].t.dtype == DT_STRING)) return 0;
    }
    /* Outputs that are also graph inputs cannot be replaced. */
    for (int k = 0; k < n->nout; k++)
        if (n->out[k] >= 0 && (g->values[n->out[k]].flags & VALUE_INPUT)) return 0;
    struct tensor res[OP_MAX_IO];
    char why[512] = "";
    int rc = eval_node(n, in, n->nin, res, n->nout, EVAL_FOLD_MAX_BYTES, why, sizeof why);
    if (rc) {
        log_debug("not folding node '%s' (%s): %s", n->name, n->op_type,
                  rc == EVAL_TOO_LARGE ? "its outputs are too large to keep as constants" : why);
        return 0;
    }
    int strings = 0;
    for (int k = 0; k < n->nout; k++)
        if (res[k].dtype == DT_STRING) strings = 1;
    if (strings) {
        for (int k = 0; k < n->nout; k++) tensor_free_data(&res[k]);
        return 0;
    }
    for (int k = 0; k < n->nout; k++) {
        int v = n->out[k];
        if (v < 0) {
            free(res[k].data);
            continue;
        }
        tensor_free_data(&g->values[v].t);
        g->values[v].t = res[k];
        g->values[v].producer = -1;
    }
    ps->dead[i] = 1;
    log_debug("folded node '%s' (%s) into constants", n->name, n->op_type);
    return 1;
}

static const struct pass_def fold_constants_pass = {"folding constants", fold_constant_node, 0};

int passes_fold_constants(struct graph *g, int *nfolded, char *err, size_t err_len) {
    int folded = 0, rc = pass_run(&fold_constants_pass, g, NULL, &folded, err, err_len);
    if (rc) return rc;
    if (folded) log_debug("constant folding: %d nodes folded", folded);
    if (nfolded) *nfolded = folded;
    return 0;
}

/* ---- If with a constant condition --------------------------------------------- */

/* Replaces If node ni, whose condition is a constant, by the taken branch:
 * its nodes (attributes and nested subgraphs moved over), its constants and
 * values renamed apart under the node's name, its captured inputs mapped to
 * the node's inputs, and one Identity per output (a view in plans) writing
 * the If's own output values. The If is marked in dead[]. */
static int inline_branch(struct graph *g, int ni, unsigned char **dead, char *err, size_t err_len) {
    struct graph_node *n = &g->nodes[ni];
    const struct tensor *cond = &g->values[n->in[0]].t;
    int take = tensor_numel(cond) > 0 && op_int_at(cond, 0) != 0;
    struct graph *b = (struct graph *)node_attr_graph(n, take ? "then_branch" : "else_branch");
    if (!b || b->noutputs != n->nout || graph_nformal(b) != 0) return 0;
    char prefix[256];
    snprintf(prefix, sizeof prefix, "%s", n->name);
    int nout = n->nout, rc = STATUS_NOMEM;
    int *map = malloc((size_t)(b->nvalues > 0 ? b->nvalues : 1) * sizeof *map);
    int *nin_map = malloc((size_t)(n->nin > 0 ? n->nin : 1) * sizeof *nin_map);
    int *outs = malloc((size_t)(nout > 0 ? nout : 1) * sizeof *outs);
    if (!map || !nin_map || !outs) goto out;
    memcpy(nin_map, n->in, (size_t)n->nin * sizeof *nin_map);
    memcpy(outs, n->out, (size_t)nout * sizeof *outs);
    for (int v = 0; v < b->nvalues; v++) map[v] = -1;
    for (int j = 0; j < b->ncaptured; j++) map[b->inputs[graph_nformal(b) + j]] = nin_map[b->capture_in[j]];
    char name[512];
    for (int v = 0; v < b->nvalues; v++) {
        if (map[v] >= 0 || (b->values[v].flags & VALUE_INPUT)) continue;
        snprintf(name, sizeof name, "%s/%s", prefix, b->values[v].name);
        int nv = graph_new_value(g, name);
        if (nv < 0) goto out;
        struct graph_value *src = &b->values[v], *dst = &g->values[nv];
        dst->t = src->t; /* the branch's constants move over; others are shapes to infer */
        src->t.data = NULL;
        if (!dst->t.data) {
            dst->t.dtype = DT_UNDEFINED;
            dst->t.ndim = -1;
        }
        map[v] = nv;
    }
    int first = g->nnodes;
    for (int i = 0; i < b->nnodes; i++) {
        struct graph_node *bn = &b->nodes[i];
        int in[OP_MAX_IO], out[OP_MAX_IO];
        if (bn->nin > OP_MAX_IO || bn->nout > OP_MAX_IO) goto out;
        for (int k = 0; k < bn->nin; k++) in[k] = bn->in[k] >= 0 ? map[bn->in[k]] : -1;
        for (int k = 0; k < bn->nout; k++) out[k] = bn->out[k] >= 0 ? map[bn->out[k]] : -1;
        snprintf(name, sizeof name, "%s/%s", prefix, bn->name);
        int idx = graph_add_node(g, name, bn->op_type, bn->domain, in, bn->nin, out, bn->nout);
        if (idx < 0) goto out;
        struct graph_node *nn = &g->nodes[idx];
        nn->opset = bn->opset;
        nn->op = bn->op;
        nn->act = bn->act;
        nn->act_alpha = bn->act_alpha;
        nn->act_beta = bn->act_beta;
        nn->act_affine = bn->act_affine;
        nn->act_scale = bn->act_scale;
        nn->act_shift = bn->act_shift;
        nn->attrs = bn->attrs; /* nested subgraphs keep their capture maps: node input positions */
        nn->nattr = bn->nattr;
        bn->attrs = NULL;
        bn->nattr = 0;
    }
    const struct op_def *identity = op_find("", "Identity");
    for (int o = 0; o < nout; o++) {
        if (outs[o] < 0) continue;
        int src = map[b->outputs[o]];
        snprintf(name, sizeof name, "%s/output%d", prefix, o);
        int idx = identity ? graph_add_node(g, name, "Identity", "", &src, 1, &outs[o], 1) : -1;
        if (idx < 0) goto out;
        g->nodes[idx].op = identity;
        g->nodes[idx].opset = (int)g->opset_default;
    }
    unsigned char *d = realloc(*dead, (size_t)g->nnodes);
    if (!d) goto out;
    memset(d + first, 0, (size_t)(g->nnodes - first));
    *dead = d;
    d[ni] = 1;
    log_debug("If '%s': its condition is a constant; the %s branch (%d nodes) replaces it", prefix,
              take ? "then" : "else", b->nnodes);
    rc = 1;
out:
    free(map);
    free(nin_map);
    free(outs);
    if (rc < 0) status_set(err, err_len, rc, "out of memory inlining If '%s'", prefix);
    return rc;
}

int passes_inline_if(struct graph *g, int *ninlined, char *err, size_t err_len) {
    int done = 0, rc = 0;
    if (ninlined) *ninlined = 0;
    unsigned char *dead = calloc((size_t)(g->nnodes > 0 ? g->nnodes : 1), 1);
    if (!dead) return status_set(err, err_len, STATUS_NOMEM, "out of memory inlining If nodes");
    for (int i = 0, n0 = g->nnodes; i < n0 && rc >= 0; i++) {
        const struct graph_node *n = &g->nodes[i];
        if (!is_op(n, "If") || n->nin < 1 || n->in[0] < 0 || !g->values[n->in[0]].t.data) continue;
        rc = inline_branch(g, i, &dead, err, err_len);
        if (rc > 0) done++;
    }
    if (rc >= 0 && done) {
        drop_nodes(g, dead);
        rc = graph_toposort(g, err, err_len);
    }
    free(dead);
    if (rc < 0) return rc;
    if (ninlined) *ninlined = done;
    return 0;
}

/* ---- dead nodes ------------------------------------------------------------------- */

/* Marks node i dead when none of its outputs is live (ctx: live values,
 * graph outputs first; the pass runs backwards), else makes its inputs live. */
static int dead_node(struct pass *ps, int i) {
    unsigned char *live = ps->ctx;
    const struct graph_node *n = &ps->g->nodes[i];
    int used = 0;
    for (int k = 0; k < n->nout; k++)
        if (n->out[k] >= 0 && live[n->out[k]]) used = 1;
    if (!used) {
        ps->dead[i] = 1;
        log_debug("removing node '%s' (%s): its outputs are never used", n->name, n->op_type);
        return 1;
    }
    for (int k = 0; k < n->nin; k++)
        if (n->in[k] >= 0) live[n->in[k]] = 1;
    return 0;
}

static const struct pass_def eliminate_dead_pass = {"removing dead nodes", dead_node, 1};

int passes_eliminate_dead(struct graph *g, int *nremoved) {
    int removed = 0;
    if (nremoved) *nremoved = 0;
    unsigned char *live = calloc((size_t)(g->nvalues > 0 ? g->nvalues : 1), 1);
    if (!live) return STATUS_NOMEM;
    for (int o = 0; o < g->noutputs; o++) live[g->outputs[o]] = 1;
    int rc = pass_run(&eliminate_dead_pass, g, live, &removed, NULL, 0);
    if (rc) {
        free(live);
        return rc;
    }
    /* Constants nothing reads any more (weights replaced by folding) go. */
    size_t freed = 0;
    for (int v = 0; v < g->nvalues; v++) {
        struct graph_value *val = &g->values[v];
        if (!live[v] && val->t.data && !(val->flags & (VALUE_INPUT | VALUE_OUTPUT))) {
            freed += tensor_nbytes(&val->t);
            tensor_free_data(&val->t);
        }
    }
    if (removed || freed) log_debug("dead code: %d nodes removed, %zu bytes of unused constants freed", removed, freed);
    free(live);
    if (nremoved) *nremoved = removed;
    return 0;
}

/* ---- Conv + BatchNormalization ------------------------------------------------------ */

static int fp32_vec(const struct tensor *t, int64_t n) {
    return t && t->dtype == DT_FP32 && tensor_numel(t) == n;
}

/* Folds BatchNormalization node bi into the Conv that feeds it alone. */
static int conv_bn_node(struct pass *ps, int bi) {
    struct graph *g = ps->g;
    struct graph_node *b = &g->nodes[bi];
    if (!is_op(b, "BatchNormalization") || b->nin < 5 || b->in[0] < 0) return 0;
    if (node_attr_int(b, "training_mode", 0) != 0 || !only_first_output_used(g, b, ps->nuse)) return 0;
    int x = b->in[0];
    int ci = g->values[x].producer;
    if (ci < 0 || ps->dead[ci] || ps->nuse[x] != 1 || ps->is_out[x]) return 0;
    struct graph_node *c = &g->nodes[ci];
    if (!is_op(c, "Conv") || c->nout != 1 || c->act != ACT_NONE || c->nin < 2) return 0;
    const struct tensor *w = const_of(g, c->in[1]);
    if (!w || w->dtype != DT_FP32 || w->ndim < 3) return 0;
    int64_t m = w->dims[0];
    const struct tensor *bias = c->nin >= 3 ? const_of(g, c->in[2]) : NULL;
    if (c->nin >= 3 && c->in[2] >= 0 && !fp32_vec(bias, m)) return 0;
    const struct tensor *scale = const_of(g, b->in[1]), *beta = const_of(g, b->in[2]),
                        *mean = const_of(g, b->in[3]), *var = const_of(g, b->in[4]);
    if (!fp32_vec(scale, m) || !fp32_vec(beta, m) || !fp32_vec(mean, m) || !fp32_vec(var, m)) return 0;
    float eps = node_attr_float(b, "epsilon", 1e-5f);

    int64_t wn = tensor_numel(w), per = wn / m;
    struct tensor nw = *w, nb = {.dtype = DT_FP32, .ndim = 1, .dims = {m}};
    nw.data = malloc((size_t)wn * sizeof(float));
    nb.data = malloc((size_t)m * sizeof(float));
    if (!nw.data || !nb.data) {
        free(nw.data);
        free(nb.data);
        return pass_nomem(ps);
    }
    const float *wd = w->data, *sd = scale->data, *bd = beta->data, *md = mean->data, *vd = var->data;
    const float *cb = bias ? bias->data : NULL;
    float *nwd = nw.data, *nbd = nb.data;
    for (int64_t o = 0; o < m; o++) {
        /* Double precision so the fold adds no error of its own. */
        double s = (double)sd[o] / sqrt((double)vd[o] + (double)eps);
        for (int64_t j = 0; j < per; j++) nwd[o * per + j] = (float)(wd[o * per + j] * s);
        nbd[o] = (float)(((cb ? cb[o] : 0.0) - md[o]) * s + bd[o]);
    }
    char cname[256];
    snprintf(cname, sizeof cname, "%s", c->name);
    int wv = new_const(g, cname, ".bn_weight", &nw);
    int bv = wv >= 0 ? new_const(g, cname, ".bn_bias", &nb) : (free(nb.data), -1);
    /* graph_intern_value may have moved values; nodes did not move. */
    c = &g->nodes[ci];
    b = &g->nodes[bi];
    if (wv < 0 || bv < 0 || set_nin(c, 3)) return pass_nomem(ps);
    c->in[1] = wv;
    c->in[2] = bv;
    take_output(ps, ci, bi);
    log_debug("folded BatchNormalization '%s' into Conv '%s'", b->name, c->name);
    return 1;
}

static const struct pass_def conv_bn_pass = {"folding BatchNormalization", conv_bn_node, 0};

int passes_fold_conv_bn(struct graph *g, int *nfolded, char *err, size_t err_len) {
    return pass_run(&conv_bn_pass, g, NULL, nfolded, err, err_len);
}

/* Rank of value v when the file does not say it but it follows through
 * rank-preserving ops from one that does; -1 if unknown. */
static int known_rank(const struct graph *g, int v, int depth) {
    if (v < 0) return -1;
    if (g->values[v].t.ndim >= 0 && (g->values[v].t.data || (g->values[v].flags & VALUE_INPUT) || depth == 0))
        return g->values[v].t.ndim;
    int pi = g->values[v].producer;
    if (pi < 0 || depth > 64) return -1;
    const struct graph_node *n = &g->nodes[pi];
    static const char *const same[] = {"Cast", "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Clip", "Identity", "Softmax",
                                       "LogSoftmax", "Neg", "Abs", "Exp", "Log", "Sqrt", "Erf", "Gelu", "HardSigmoid",
                                       "HardSwish", "Dropout", "BatchNormalization", "LayerNormalization", "IsNaN",
                                       "IsInf", "Not", NULL};
    for (int i = 0; same[i]; i++)
        if (is_op(n, same[i])) return n->nin > 0 ? known_rank(g, n->in[0], depth + 1) : -1;
    static const char *const bcast[] = {"Add", "Sub", "Mul", "Div", "Pow", NULL};
    for (int i = 0; bcast[i]; i++)
        if (is_op(n, bcast[i]) && n->nin == 2) {
            int a = known_rank(g, n->in[0], depth + 1), b = known_rank(g, n->in[1], depth + 1);
            return a < 0 || b < 0 ? -1 : (a > b ? a : b);
        }
    if (is_op(n, "MatMul") && n->nin >= 2) {
        int a = known_rank(g, n->in[0], depth + 1), b = known_rank(g, n->in[1], depth + 1);
        return a >= 2 && b >= 2 ? (a > b ? a : b) : -1;
    }
    if (is_op(n, "Gemm")) return 2;
    if (is_op(n, "Where") && n->nin == 3) {
        int r = -1;
        for (int k = 0; k < 3; k++) {
            int rk = known_rank(g, n->in[k], depth + 1);
            if (rk < 0) return -1;
            if (rk > r) r = rk;
        }
        return r;
    }
    if (is_op(n, "Transpose")) {
        const int64_t *perm;
        int np = node_attr_ints(n, "perm", &perm);
        return np >= 0 ? np : (n->nin > 0 ? known_rank(g, n->in[0], depth + 1) : -1);
    }
    if (is_op(n, "Reshape") && n->nin >= 2) { /* a constant shape gives the rank */
        const struct tensor *sh = const_of(g, n->in[1]);
        return sh && sh->ndim == 1 ? (int)sh->dims[0] : -1;
    }
    if (is_op(n, "Conv") && n->nin >= 2) {
        const struct tensor *w = const_of(g, n->in[1]);
        return w ? w->ndim : -1;
    }
    static const char *const pool[] = {"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LRN",
                                       "Concat", NULL};
    for (int i = 0; pool[i]; i++)
        if (is_op(n, pool[i]))
            for (int k = 0; k < n->nin; k++) {
                int r = known_rank(g, n->in[k], depth + 1);
                if (r >= 0) return r;
            }
    static const char *const variadic[] = {"Sum", "Max", "Min", "Mean", NULL};
    for (int i = 0; variadic[i]; i++)
        if (is_op(n, variadic[i])) { /* they broadcast: the largest rank, all known */
            int best = -1;
            for (int k = 0; k < n->nin; k++) {
                int r = known_rank(g, n->in[k], depth + 1);
                if (r < 0) return -1;
                if (r > best) best = r;
            }
            return best;
        }
    return -1;
}

/* ---- per-channel affine after Conv or BatchNormalization ------------------------ */

/* Conv or BatchNormalization -> Mul/Add/Sub/Div by a constant that is a
 * scalar or one value per channel (axis 1): folded into the Conv's weights
 * and bias or the BN's scale and bias (caffe2 exports write BN, Mul, Add). */

/* One such fold, as affine_match finds it. */
struct affine {
    int pi;                    /* the Conv or BN */
    int mul, add, sub, div;    /* the operation */
    int conv;                  /* 1 for a Conv, 0 for a BN */
    int64_t m;                 /* channels */
    const struct tensor *cst;  /* the constant operand */
    const struct tensor *w, *bias;     /* Conv: weights, bias (NULL when none) */
    const struct tensor *scale, *beta; /* BN */
};

/* The Conv's or BN's constants, channel count and output rank (-1 if
 * unknown) into af; 0 if they cannot take the fold. */
static int affine_producer(const struct graph *g, const struct graph_node *p, struct affine *af, int *rank) {
    if (af->conv) {
        af->w = p->nin >= 2 ? const_of(g, p->in[1]) : NULL;
        if (!af->w || af->w->dtype != DT_FP32 || af->w->ndim < 3 || p->nout != 1) return 0;
        af->m = af->w->dims[0];
        *rank = af->w->ndim;
        af->bias = p->nin >= 3 ? const_of(g, p->in[2]) : NULL;
        return !(p->nin >= 3 && p->in[2] >= 0 && !fp32_vec(af->bias, af->m));
    }
    if (p->nin < 5 || node_attr_int(p, "training_mode", 0) != 0) return 0;
    af->scale = const_of(g, p->in[1]);
    af->beta = const_of(g, p->in[2]);
    if (!af->scale || af->scale->dtype != DT_FP32) return 0;
    af->m = tensor_numel(af->scale);
    if (!fp32_vec(af->beta, af->m) || !fp32_vec(const_of(g, p->in[3]), af->m) ||
        !fp32_vec(const_of(g, p->in[4]), af->m))
        return 0;
    *rank = known_rank(g, p->in[0], 0);
    return 1;
}

/* 1 if node ai is an operation the fold takes, with what it needs in af. */
static int affine_match(struct pass *ps, int ai, struct affine *af) {
    const struct graph *g = ps->g;
    const struct graph_node *a = &g->nodes[ai];
    *af = (struct affine){.mul = is_op(a, "Mul"), .add = is_op(a, "Add"), .sub = is_op(a, "Sub"), .div = is_op(a, "Div")};
    if ((!af->mul && !af->add && !af->sub && !af->div) || a->nin != 2 || a->nout != 1 || a->out[0] < 0 ||
        a->act != ACT_NONE)
        return 0;
    int k = -1; /* which input comes from a Conv/BN */
    for (int j = 0; j < 2 && k < 0; j++) {
        int v = a->in[j];
        if (v < 0 || g->values[v].producer < 0 || (j == 1 && (af->sub || af->div))) continue;
        const struct graph_node *pn = &g->nodes[g->values[v].producer];
        if (is_op(pn, "Conv") || is_op(pn, "BatchNormalization")) k = j;
    }
    if (k < 0) return 0;
    int x = a->in[k];
    af->pi = g->values[x].producer;
    af->cst = const_of(g, a->in[1 - k]);
    if (ps->dead[af->pi] || ps->nuse[x] != 1 || ps->is_out[x] || !af->cst || af->cst->dtype != DT_FP32) return 0;
    const struct graph_node *p = &g->nodes[af->pi];
    if (p->act != ACT_NONE || !only_first_output_used(g, p, ps->nuse)) return 0;
    af->conv = is_op(p, "Conv");
    int rank;
    if (!affine_producer(g, p, af, &rank)) return 0;
    /* The constant: a scalar, or M values on the channel axis. */
    const struct tensor *cst = af->cst;
    int64_t cn = tensor_numel(cst);
    if (cn == 1) {
        if (cst->ndim > (rank >= 0 ? rank : 1)) return 0;
    } else {
        int ch = rank >= 0 ? cst->ndim - (rank - 1) : -1;
        if (rank < 0 || cst->ndim > rank || ch < 0 || cst->dims[ch] != af->m || cn != af->m) return 0;
    }
    const float *cv = cst->data;
    for (int64_t o = 0; o < cn; o++) /* x * 0 or x / 0 do not fold exactly (NaN, inf) */
        if (!isfinite(cv[o]) || ((af->mul || af->div) && cv[o] == 0.0f)) return 0;
    return 1;
}

/* Folds node ai into the Conv or BN af names: new weights (Conv) or scale
 * (BN) when it scales, a new bias always; ai goes. */
static int affine_apply(struct pass *ps, int ai, const struct affine *af) {
    struct graph *g = ps->g;
    int64_t m = af->m, cn = tensor_numel(af->cst);
    int conv = af->conv, mul = af->mul, div = af->div, add = af->add, scales = mul || div;
    const struct tensor *w = af->w, *scale = af->scale;
    /* New per-channel multiplier and addend for this step. */
    int64_t per = conv ? tensor_numel(w) / m : 0;
    struct tensor nw = {0}, nb = {.dtype = DT_FP32, .ndim = 1, .dims = {m}}, ns = nb;
    nb.data = malloc((size_t)m * sizeof(float));
    if (scales) {
        if (conv) {
            nw = *w;
            nw.data = malloc((size_t)tensor_numel(w) * sizeof(float));
        } else {
            ns.data = malloc((size_t)m * sizeof(float));
        }
    }
    if (!nb.data || (scales && !nw.data && !ns.data)) {
        free(nb.data);
        free(nw.data);
        free(ns.data);
        return pass_nomem(ps);
    }
    const float *cv = af->cst->data, *bd = conv ? (af->bias ? af->bias->data : NULL) : af->beta->data;
    for (int64_t o = 0; o < m; o++) {
        float c = cv[cn == 1 ? 0 : o], b0 = bd ? bd[o] : 0.0f;
        if (mul) ((float *)nb.data)[o] = b0 * c;
        else if (div) ((float *)nb.data)[o] = b0 / c;
        else if (add) ((float *)nb.data)[o] = b0 + c;
        else ((float *)nb.data)[o] = b0 - c;
        if (scales && conv)
            for (int64_t j = 0; j < per; j++)
                ((float *)nw.data)[o * per + j] = mul ? ((const float *)w->data)[o * per + j] * c
                                                      : ((const float *)w->data)[o * per + j] / c;
        if (scales && !conv)
            ((float *)ns.data)[o] = mul ? ((const float *)scale->data)[o] * c : ((const float *)scale->data)[o] / c;
    }
    char pname[256];
    snprintf(pname, sizeof pname, "%s", g->nodes[af->pi].name);
    int wv = -1, sv = -1;
    if (scales && conv && (wv = new_const(g, pname, ".affine_weight", &nw)) < 0) {
        free(nb.data);
        return pass_nomem(ps);
    }
    if (scales && !conv && (sv = new_const(g, pname, ".affine_scale", &ns)) < 0) {
        free(nb.data);
        return pass_nomem(ps);
    }
    int bv = new_const(g, pname, ".affine_bias", &nb);
    /* new_const may have moved values (w, scale...); nodes did not move. */
    struct graph_node *p = &g->nodes[af->pi], *a = &g->nodes[ai];
    if (bv < 0 || (conv && set_nin(p, 3))) return pass_nomem(ps);
    if (conv) {
        if (wv >= 0) p->in[1] = wv;
        p->in[2] = bv;
    } else {
        if (sv >= 0) p->in[1] = sv;
        p->in[2] = bv;
    }
    take_output(ps, af->pi, ai);
    log_debug("folded %s '%s' into %s '%s'", a->op_type, a->name, p->op_type, p->name);
    return 1;
}

static int affine_node(struct pass *ps, int ai) {
    struct affine af;
    return affine_match(ps, ai, &af) ? affine_apply(ps, ai, &af) : 0;
}

static const struct pass_def fold_affine_pass = {"folding per-channel constants", affine_node, 0};

int passes_fold_affine(struct graph *g, int *nfolded, char *err, size_t err_len) {
    return pass_run(&fold_affine_pass, g, NULL, nfolded, err, err_len);
}

/* ---- bias fusion ---------------------------------------------------------------------- */

/* Fuses into node pi, as its bias, the constant Add that alone reads its
 * output. */
static int bias_node(struct pass *ps, int pi) {
    struct graph *g = ps->g;
    struct graph_node *p = &g->nodes[pi];
    int matmul = is_op(p, "MatMul") && p->op && (p->op->flags & OP_BIAS_INPUT) && p->nin == 2;
    int gemm = is_op(p, "Gemm") && (p->nin == 2 || (p->nin == 3 && p->in[2] < 0)) &&
               node_attr_float(p, "beta", 1.0f) == 1.0f;
    int conv = is_op(p, "Conv") && (p->nin == 2 || (p->nin == 3 && p->in[2] < 0));
    if ((!matmul && !gemm && !conv) || p->nout != 1 || p->act != ACT_NONE || ps->dead[pi]) return 0;
    int x = p->out[0];
    if (x < 0 || ps->nuse[x] != 1 || ps->is_out[x]) return 0;
    int ai = sole_reader(g, ps->dead, x, pi);
    if (ai < 0) return 0;
    struct graph_node *a = &g->nodes[ai];
    if (!is_op(a, "Add") || a->nin != 2 || a->nout != 1 || a->out[0] < 0) return 0;
    int bv = a->in[0] == x ? a->in[1] : a->in[0];
    const struct tensor *bias = const_of(g, bv), *wt = const_of(g, p->in[1]);
    if (!bias || bias->dtype != DT_FP32 || !wt || wt->dtype != DT_FP32 || wt->ndim < 2 || bias->ndim < 1) return 0;
    int64_t n;
    if (conv) {
        /* Conv's output is [N, M, spatial...] with the rank of W: a bias
         * is M values on axis 1, ones elsewhere, right-aligned. */
        int r = bias->ndim, ch = r - (wt->ndim - 1);
        n = wt->dims[0];
        if (wt->ndim < 3 || r > wt->ndim || ch < 0 || bias->dims[ch] != n || tensor_numel(bias) != n) return 0;
    } else if (matmul) n = wt->dims[wt->ndim - 1];
    else {
        if (wt->ndim != 2) return 0;
        n = node_attr_int(p, "transB", 0) ? wt->dims[0] : wt->dims[1];
    }
    /* The Add must not change the MatMul's shape: bias is [N] or [1,..,1,N]
     * of a rank that cannot exceed the product's. */
    if (!conv && (bias->dims[bias->ndim - 1] != n || tensor_numel(bias) != n)) return 0;
    if (matmul && bias->ndim > 1) {
        /* The product's rank: max of both when A is a matrix or more,
         * one less than B's when A is a vector, B's at least if unknown. */
        int ra = p->in[0] >= 0 ? known_rank(g, p->in[0], 0) : -1;
        int rank = ra >= 2 ? (ra > wt->ndim ? ra : wt->ndim) : wt->ndim - 1;
        if (bias->ndim > rank) return 0;
    }
    if (gemm && bias->ndim > 2) return 0;
    int use = bv;
    if ((matmul || conv) && bias->ndim != 1) {
        struct tensor t = {.dtype = DT_FP32, .ndim = 1, .dims = {n}};
        t.data = malloc((size_t)n * sizeof(float));
        if (!t.data) return pass_nomem(ps);
        memcpy(t.data, bias->data, (size_t)n * sizeof(float));
        char pname[256];
        snprintf(pname, sizeof pname, "%s", p->name);
        use = new_const(g, pname, ".bias", &t);
        if (use < 0) return pass_nomem(ps);
        p = &g->nodes[pi];
        a = &g->nodes[ai];
    }
    if (set_nin(p, 3)) return pass_nomem(ps);
    p->in[2] = use;
    take_output(ps, pi, ai);
    log_debug("fused Add '%s' into %s '%s' as its bias", a->name, p->op_type, p->name);
    return 1;
}

static const struct pass_def fuse_bias_pass = {"fusing bias", bias_node, 0};

int passes_fuse_bias(struct graph *g, int *nfused, char *err, size_t err_len) {
    return pass_run(&fuse_bias_pass, g, NULL, nfused, err, err_len);
}

/* ---- activation fusion ------------------------------------------------------------------ */

/* Reads a scalar bound of Clip (opset 11+ inputs); 0 if not a constant. */
static int clip_bound(const struct graph *g, const struct graph_node *a, int k, float *out) {
    if (a->nin <= k || a->in[k] < 0) return 1; /* absent: keep the default */
    const struct tensor *t = const_of(g, a->in[k]);
    if (!t || tensor_numel(t) != 1 || (t->dtype != DT_FP32 && t->dtype != DT_FP64)) return 0;
    *out = (float)op_double_at(t, 0);
    return 1;
}

/* Maps an activation node to a fused activation; 0 if it is not one kiln
 * can fuse exactly. */
int passes_activation_of(const struct graph *g, const struct graph_node *a, enum act_kind *kind, float *alpha,
                         float *beta) {
    *alpha = 0;
    *beta = 0;
    if (a->nout != 1 || a->out[0] < 0 || a->nin < 1) return 0;
    if (is_op(a, "Relu")) *kind = ACT_RELU;
    else if (is_op(a, "LeakyRelu")) {
        *kind = ACT_LEAKY_RELU;
        *alpha = node_attr_float(a, "alpha", 0.01f);
    } else if (is_op(a, "Sigmoid")) *kind = ACT_SIGMOID;
    else if (is_op(a, "Tanh")) *kind = ACT_TANH;
    else if (is_op(a, "HardSigmoid")) {
        *kind = ACT_HARD_SIGMOID;
        *alpha = node_attr_float(a, "alpha", 0.2f);
        *beta = node_attr_float(a, "beta", 0.5f);
    } else if (is_op(a, "HardSwish")) *kind = ACT_HARD_SWISH;
    else if (is_op(a, "Gelu")) {
        if (strcmp(node_attr_str(a, "approximate", "none"), "none") != 0) return 0;
        *kind = ACT_GELU;
    } else if (is_op(a, "Clip")) {
        *kind = ACT_CLIP;
        *alpha = -FLT_MAX;
        *beta = FLT_MAX;
        if (a->opset < 11) {
            *alpha = node_attr_float(a, "min", -FLT_MAX);
            *beta = node_attr_float(a, "max", FLT_MAX);
        } else if (!clip_bound(g, a, 1, alpha) || !clip_bound(g, a, 2, beta)) {
            return 0;
        }
    } else {
        return 0;
    }
    return 1;
}

/* Datatype of value v when the file does not say it but it follows from
 * constants and inputs through ops whose output type is their first
 * input's; DT_UNDEFINED if unknown. */
static enum dtype known_dtype(const struct graph *g, int v, int depth) {
    if (v < 0) return DT_UNDEFINED;
    const struct graph_value *val = &g->values[v];
    if (val->t.dtype != DT_UNDEFINED) return val->t.dtype;
    if (val->producer < 0 || depth > 64) return DT_UNDEFINED;
    const struct graph_node *n = &g->nodes[val->producer];
    if (is_op(n, "Cast")) return (enum dtype)node_attr_int(n, "to", DT_UNDEFINED);
    if (is_op(n, "Where") && n->nin == 3) { /* the type of its two choices */
        enum dtype dt = known_dtype(g, n->in[1], depth + 1);
        return dt != DT_UNDEFINED ? dt : known_dtype(g, n->in[2], depth + 1);
    }
    static const char *const same[] = {"Conv", "Gemm", "MatMul", "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Clip",
                                       "Identity", "Softmax", "LogSoftmax", "Neg", "Abs", "Exp", "Log", "Sqrt", "Erf",
                                       "Gelu", "HardSigmoid", "HardSwish", "Dropout", "BatchNormalization",
                                       "LayerNormalization", "Add", "Sub", "Mul", "Div", "Sum", "Max", "Min", "Mean",
                                       "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LRN",
                                       "Concat", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Pad",
                                       "Slice", "Gather", "Split", "Expand", "Tile", NULL};
    for (int i = 0; same[i]; i++)
        if (is_op(n, same[i])) {
            for (int k = 0; k < n->nin; k++) { /* the first input whose type is known decides */
                enum dtype dt = known_dtype(g, n->in[k], depth + 1);
                if (dt != DT_UNDEFINED) return dt;
                if (!is_op(n, "Add") && !is_op(n, "Sub") && !is_op(n, "Mul") && !is_op(n, "Div") && !is_op(n, "Sum") &&
                    !is_op(n, "Max") && !is_op(n, "Min") && !is_op(n, "Mean") && !is_op(n, "Concat") &&
                    !is_op(n, "Conv") && !is_op(n, "Gemm") && !is_op(n, "MatMul"))
                    break;
            }
            return DT_UNDEFINED;
        }
    return DT_UNDEFINED;
}

enum dtype pass_known_dtype(const struct graph *g, int v) { return known_dtype(g, v, 0); }

int pass_set_attrs(struct graph_node *n, const struct graph_attr *src, int nat) {
    struct graph_attr *at = calloc((size_t)nat, sizeof *at);
    int ok = at != NULL;
    for (int k = 0; ok && k < nat; k++) {
        at[k] = (struct graph_attr){.name = strdup(src[k].name), .type = src[k].type, .i = src[k].i, .f = src[k].f};
        if (src[k].s && (at[k].s = malloc(src[k].s_len + 1))) {
            memcpy(at[k].s, src[k].s, src[k].s_len + 1);
            at[k].s_len = src[k].s_len;
        }
        ok = at[k].name && (!src[k].s || at[k].s);
    }
    if (!ok) {
        for (int k = 0; at && k < nat; k++) graph_attr_clear(&at[k]);
        free(at);
        return -1;
    }
    for (int k = 0; k < n->nattr; k++) graph_attr_clear(&n->attrs[k]);
    free(n->attrs);
    n->attrs = at;
    n->nattr = nat;
    return 0;
}

/* 1 if p's output is known to be FP32 (the activation math is float). */
static int produces_fp32(const struct graph *g, const struct graph_node *p) {
    return p->nout >= 1 && known_dtype(g, p->out[0], 0) == DT_FP32;
}

/* ---- GELU from its parts ---------------------------------------------------------------- */

/* 1 if value v is a scalar FP32/FP64 constant within 1e-4 of want. */
static int const_near(const struct graph *g, int v, double want) {
    const struct tensor *t = const_of(g, v);
    return t && tensor_numel(t) == 1 && (t->dtype == DT_FP32 || t->dtype == DT_FP64) &&
           fabs(op_double_at(t, 0) - want) < 1e-4;
}

/* For a binary node n reading v: its other input when that is a scalar
 * constant near want (either order), else -1 (-2: n does not read v). */
static int other_input(const struct graph *g, const struct graph_node *n, int v, double want) {
    if (n->nin != 2) return -2;
    int k = n->in[0] == v ? 1 : (n->in[1] == v ? 0 : -1);
    if (k < 0) return -2;
    return const_near(g, n->in[k], want) ? n->in[k] : -1;
}

/* The sole live reader of node i's output 0 that is op, or -1. */
static int next_op(struct pass *ps, int i, const char *op) {
    int v = ps->g->nodes[i].out[0];
    if (v < 0 || ps->nuse[v] != 1 || ps->is_out[v]) return -1;
    int r = sole_reader(ps->g, ps->dead, v, i);
    return r >= 0 && is_op(&ps->g->nodes[r], op) ? r : -1;
}

int pass_next_op(struct pass *ps, int i, const char *op) { return next_op(ps, i, op); }
int pass_other_input(const struct graph *g, const struct graph_node *n, int v, double want) {
    return other_input(g, n, v, want);
}

/* Exact GELU as exporters write it, x * 0.5 * (1 + erf(x / sqrt(2))), in
 * either order of the products (Div by sqrt(2) or Mul by 1/sqrt(2)),
 * becomes one Gelu node, which the activation pass then fuses into x's
 * producer (a MatMul with its bias): five passes over the tensor become a
 * post-op. Matched at the Erf. */
static int gelu_node(struct pass *ps, int ei) {
    struct graph *g = ps->g;
    struct graph_node *e = &g->nodes[ei];
    if (ps->dead[ei] || !is_op(e, "Erf") || e->nin != 1 || e->in[0] < 0) return 0;
    int di = g->values[e->in[0]].producer;
    if (di < 0 || ps->dead[di] || ps->nuse[e->in[0]] != 1) return 0;
    struct graph_node *d = &g->nodes[di];
    int x = d->nin == 2 ? d->in[0] : -1;
    if (x < 0 || !(is_op(d, "Div") ? const_near(g, d->in[1], 1.4142135623730951)
                                   : is_op(d, "Mul") && const_near(g, d->in[1], 0.7071067811865476)))
        return 0;
    if (known_dtype(g, x, 0) != DT_FP32) return 0;
    int ai = next_op(ps, ei, "Add");
    if (ai < 0 || other_input(g, &g->nodes[ai], e->out[0], 1.0) < 0) return 0;
    int m1 = next_op(ps, ai, "Mul");
    if (m1 < 0) return 0;
    const struct graph_node *mn = &g->nodes[m1];
    int a_out = g->nodes[ai].out[0], half = -1, last = -1;
    int other = mn->nin == 2 ? (mn->in[0] == a_out ? mn->in[1] : mn->in[0]) : -1;
    if (other == x) { /* (x * a) * 0.5 */
        last = next_op(ps, m1, "Mul");
        if (last < 0 || other_input(g, &g->nodes[last], mn->out[0], 0.5) < 0) return 0;
    } else if (other >= 0 && (half = g->values[other].producer) >= 0 && !ps->dead[half] && ps->nuse[other] == 1 &&
               is_op(&g->nodes[half], "Mul") && other_input(g, &g->nodes[half], x, 0.5) >= 0) {
        last = m1; /* (x * 0.5) * a */
    } else {
        return 0;
    }
    struct graph_node *y = &g->nodes[last];
    char *gelu = strdup("Gelu");
    if (!gelu) return pass_nomem(ps);
    free(y->op_type);
    y->op_type = gelu;
    y->domain[0] = 0;
    y->opset = 20;
    y->op = op_find("", "Gelu");
    y->in[0] = x;
    y->nin = 1;
    for (int k = 0; k < y->nattr; k++) graph_attr_clear(&y->attrs[k]);
    y->nattr = 0;
    ps->dead[di] = ps->dead[ei] = ps->dead[ai] = 1;
    if (last != m1) ps->dead[m1] = 1;
    if (half >= 0) ps->dead[half] = 1;
    log_debug("GELU from '%s' (Erf) and its parts: one Gelu node", e->name);
    return 1;
}

static const struct pass_def gelu_pass = {"fusing GELU", gelu_node, 0};

int passes_fuse_gelu(struct graph *g, int *nfused, char *err, size_t err_len) {
    return pass_run(&gelu_pass, g, NULL, nfused, err, err_len);
}

/* Fuses into node pi the activation that alone reads its output. */
static int activation_node(struct pass *ps, int pi) {
    struct graph *g = ps->g;
    struct graph_node *p = &g->nodes[pi];
    if (ps->dead[pi] || !p->op || !(p->op->flags & OP_FUSE_ACT) || p->act != ACT_NONE || p->nout != 1) return 0;
    int x = p->out[0];
    if (x < 0 || ps->nuse[x] != 1 || ps->is_out[x] || !produces_fp32(g, p)) return 0;
    int ai = sole_reader(g, ps->dead, x, pi);
    if (ai < 0) return 0;
    struct graph_node *a = &g->nodes[ai];
    enum act_kind kind;
    float alpha, beta;
    if (a->in[0] != x || !passes_activation_of(g, a, &kind, &alpha, &beta)) return 0;
    p->act = kind;
    p->act_alpha = alpha;
    p->act_beta = beta;
    take_output(ps, pi, ai);
    log_debug("fused %s '%s' into %s '%s'", a->op_type, a->name, p->op_type, p->name);
    return 1;
}

static const struct pass_def fuse_activations_pass = {"fusing activations", activation_node, 0};

int passes_fuse_activations(struct graph *g, int *nfused, char *err, size_t err_len) {
    return pass_run(&fuse_activations_pass, g, NULL, nfused, err, err_len);
}

/* The scalar float32 constant that binary node n (a Mul or an Add) applies
 * to v, in *f: 1, or 0 when n is not that (rank 0 or 1, so that the
 * result keeps v's shape). */
static int scalar_operand(const struct graph *g, const struct graph_node *n, int v, float *f) {
    if (n->nin != 2 || (n->in[0] == v) == (n->in[1] == v)) return 0;
    const struct tensor *t = const_of(g, n->in[n->in[0] == v ? 1 : 0]);
    if (!t || t->dtype != DT_FP32 || t->ndim > 1 || tensor_numel(t) != 1) return 0;
    *f = ((const float *)t->data)[0];
    return 1;
}

/* Conv -> activation (fused) -> Mul(scalar) [-> Add(scalar)], or -> Add(scalar):
 * the Mul and the Add become the Conv's act_scale and act_shift, applied
 * after the activation (a linear post-op in oneDNN, or in op_apply_act).
 * Activations whose oneDNN form is a linear post-op already are left
 * alone (oneDNN 2.6 applies a second one with the first one's alpha). */
static int post_affine_node(struct pass *ps, int pi) {
    struct graph *g = ps->g;
    struct graph_node *p = &g->nodes[pi];
    if (ps->dead[pi] || !is_op(p, "Conv") || p->act_affine || p->nout != 1 || !produces_fp32(g, p)) return 0;
    switch (p->act) {
    case ACT_RELU: case ACT_LEAKY_RELU: case ACT_CLIP: case ACT_SIGMOID: case ACT_TANH: case ACT_GELU:
    case ACT_HARD_SWISH: case ACT_SILU: break;
    default: return 0;
    }
    int mi = next_op(ps, pi, "Mul"), ai = -1;
    float scale = 1.0f, shift = 0.0f;
    if (mi >= 0 && !scalar_operand(g, &g->nodes[mi], p->out[0], &scale)) mi = -1;
    int from = mi >= 0 ? mi : pi;
    ai = next_op(ps, from, "Add");
    if (ai >= 0 && !scalar_operand(g, &g->nodes[ai], g->nodes[from].out[0], &shift)) ai = -1;
    if (mi < 0 && ai < 0) return 0;
    p->act_affine = 1;
    p->act_scale = scale;
    p->act_shift = shift;
    if (mi >= 0) take_output(ps, pi, mi);
    if (ai >= 0) take_output(ps, pi, ai);
    log_debug("fused %s%s%s after the activation into Conv '%s'", mi >= 0 ? "Mul" : "", mi >= 0 && ai >= 0 ? " and " : "",
              ai >= 0 ? "Add" : "", p->name);
    return 1;
}

static const struct pass_def post_affine_pass = {"fusing a scale and shift after activations", post_affine_node, 0};

int passes_fuse_post_affine(struct graph *g, int *nfused, char *err, size_t err_len) {
    return pass_run(&post_affine_pass, g, NULL, nfused, err, err_len);
}

/* ---- SiLU (CPU) ---------------------------------------------------------------------------- */

/* x * Sigmoid(x), SiLU as exporters write it, where x is the output of
 * node pi (OP_FUSE_ACT) that the Sigmoid and the Mul alone read: pi takes
 * the activation (oneDNN's swish post-op on a Conv) and the Mul's output.
 * EfficientNet's convolutions all end so. */
static int silu_node(struct pass *ps, int pi) {
    struct graph *g = ps->g;
    struct graph_node *p = &g->nodes[pi];
    if (ps->dead[pi] || !p->op || !(p->op->flags & OP_FUSE_ACT) || p->act != ACT_NONE || p->nout != 1) return 0;
    int x = p->out[0];
    if (x < 0 || ps->nuse[x] != 2 || ps->is_out[x] || !produces_fp32(g, p)) return 0;
    int si = -1, mi = -1;
    for (int i = pi + 1; i < g->nnodes; i++) {
        const struct graph_node *n = &g->nodes[i];
        if (ps->dead[i]) continue;
        for (int k = 0; k < n->nin; k++)
            if (n->in[k] == x) {
                if (is_op(n, "Sigmoid") && si < 0) si = i;
                else if (is_op(n, "Mul") && n->nin == 2 && mi < 0) mi = i;
                else return 0;
                break;
            }
    }
    if (si < 0 || mi < 0) return 0;
    const struct graph_node *s = &g->nodes[si], *m = &g->nodes[mi];
    int sv = s->nout == 1 ? s->out[0] : -1;
    if (sv < 0 || ps->nuse[sv] != 1 || ps->is_out[sv] || m->nout != 1 || m->out[0] < 0) return 0;
    if (!((m->in[0] == x && m->in[1] == sv) || (m->in[0] == sv && m->in[1] == x))) return 0;
    p->act = ACT_SILU;
    p->act_alpha = p->act_beta = 0;
    take_output(ps, pi, mi);
    ps->dead[si] = 1;
    log_debug("fused SiLU ('%s', '%s') into %s '%s'", s->name, m->name, p->op_type, p->name);
    return 1;
}

static const struct pass_def fuse_silu_pass = {"fusing SiLU", silu_node, 0};

int passes_fuse_silu(struct graph *g, int *nfused, char *err, size_t err_len) {
    return pass_run(&fuse_silu_pass, g, NULL, nfused, err, err_len);
}

/* ---- masked softmax (CPU) ------------------------------------------------------------------ */

/* The producer of v when it is an op node whose output only one reader
 * (and no graph output) takes, or -1. */
int pass_sole_producer(struct pass *ps, int v, const char *op) {
    if (v < 0 || ps->nuse[v] != 1 || ps->is_out[v]) return -1;
    int pi = ps->g->values[v].producer;
    return pi >= 0 && !ps->dead[pi] && is_op(&ps->g->nodes[pi], op) && ps->g->nodes[pi].nout == 1 ? pi : -1;
}

/* When value v is made by a Mul or Div by a scalar constant that nothing
 * else reads: that node (in *node), its factor (in *f) and its other
 * operand; else -1. */
static int scalar_factor(struct pass *ps, int v, int *node, float *f) {
    struct graph *g = ps->g;
    int si = pass_sole_producer(ps, v, "Mul");
    if (si < 0) si = pass_sole_producer(ps, v, "Div");
    if (si < 0 || g->nodes[si].nin != 2) return -1;
    const struct graph_node *m = &g->nodes[si];
    int div = is_op(m, "Div"), k = div ? 1 : (const_of(g, m->in[1]) ? 1 : 0);
    const struct tensor *c = const_of(g, m->in[k]);
    if (!c || tensor_numel(c) != 1 || (c->dtype != DT_FP32 && c->dtype != DT_FP64) || m->in[1 - k] < 0 ||
        (div && op_double_at(c, 0) == 0))
        return -1;
    double d = op_double_at(c, 0);
    *f = (float)(div ? 1.0 / d : d);
    *node = si;
    return m->in[1 - k];
}

/* What feeds a softmax in exported attention: its scores, the factors on
 * the way (a Mul/Div by a scalar after the product, or on either operand
 * of the MatMul that makes the scores), and a mask added last. */
struct softmax_feed {
    int x;          /* the scores (the MatMul's output, or what the factors scale) */
    int addi, mask; /* the Add and its mask, or -1 */
    int scale_node[3];
    float scale;    /* every factor's product */
    int mm;         /* the MatMul whose operands' factors are taken, or -1 */
    int mm_in[2];   /* its operands without them */
};

static void softmax_feed(struct pass *ps, int x, struct softmax_feed *f) {
    struct graph *g = ps->g;
    *f = (struct softmax_feed){.x = x, .addi = -1, .mask = -1, .scale_node = {-1, -1, -1}, .scale = 1.0f, .mm = -1};
    int ai = pass_sole_producer(ps, x, "Add");
    if (ai >= 0 && g->nodes[ai].nin == 2) {
        const struct graph_node *a = &g->nodes[ai];
        /* The scores are the operand that a Mul/Div by a scalar or a MatMul
         * makes; the other is the mask. Otherwise in[0]. */
        int k = 0;
        for (int t = 0; t < 2; t++)
            if (pass_sole_producer(ps, a->in[t], "Mul") >= 0 || pass_sole_producer(ps, a->in[t], "Div") >= 0 ||
                pass_sole_producer(ps, a->in[t], "MatMul") >= 0)
                k = t;
        if (a->in[k] >= 0 && a->in[1 - k] >= 0 && known_dtype(g, a->in[1 - k], 0) == DT_FP32) {
            f->addi = ai;
            f->mask = a->in[1 - k];
            f->x = a->in[k];
        }
    }
    float c;
    int v = scalar_factor(ps, f->x, &f->scale_node[0], &c);
    if (v >= 0) {
        f->scale *= c;
        f->x = v;
    }
    int mi = pass_sole_producer(ps, f->x, "MatMul");
    if (mi < 0 || g->nodes[mi].nin != 2 || g->nodes[mi].act != ACT_NONE) return;
    for (int k = 0; k < 2; k++) {
        int in = g->nodes[mi].in[k], w = in >= 0 ? scalar_factor(ps, in, &f->scale_node[1 + k], &c) : -1;
        f->mm_in[k] = w >= 0 ? w : in;
        if (w >= 0) {
            f->scale *= c;
            f->mm = mi;
        }
    }
}

/* Makes n the kiln-domain operator op (kernels/cpu), its inputs and
 * attributes left to the caller; -1 out of memory. */
static int to_kiln_op(struct graph_node *n, const char *op) {
    char *o = strdup(op), *d = strdup("kiln");
    if (!o || !d) {
        free(o);
        free(d);
        return -1;
    }
    free(n->op_type);
    free(n->domain);
    n->op_type = o;
    n->domain = d;
    n->opset = 1;
    n->op = op_find("kiln", op);
    return 0;
}

/* Sets node n's attributes to scale and nan_to_zero. */
static int masked_softmax_attrs(struct graph_node *n, float scale, int nan_to_zero) {
    const struct graph_attr at[2] = {{.name = "scale", .type = ATTR_FLOAT, .f = scale},
                                     {.name = "nan_to_zero", .type = ATTR_INT, .i = nan_to_zero}};
    return pass_set_attrs(n, at, 2);
}

/* The softmax of attention as exporters write it,
 *   X -> [Mul/Div by a scalar] -> [Add(mask)] -> Softmax(last axis)
 *   -> [Where(IsNaN(p), 0, p)],
 * with a mask or the NaN guard, becomes one kiln.MaskedSoftmax node
 * (kernels/cpu/ops_softmax_fused.c): one pass over the scores instead of
 * up to five. Matched at the Softmax. */
static int masked_softmax_node(struct pass *ps, int si) {
    struct graph *g = ps->g;
    const struct graph_node *s = &g->nodes[si];
    if (ps->dead[si] || !is_op(s, "Softmax") || s->opset < 13 || s->nin != 1 || s->nout != 1 || s->in[0] < 0 ||
        s->out[0] < 0 || node_attr_int(s, "axis", -1) != -1)
        return 0;
    struct softmax_feed f;
    softmax_feed(ps, s->in[0], &f);
    int x = f.x, addi = f.addi, mask = f.mask;
    if (known_dtype(g, x, 0) != DT_FP32) return 0;
    int y = s->out[0], isn = -1, wh = -1;
    if (ps->nuse[y] == 2 && !ps->is_out[y]) { /* Where(IsNaN(y), 0, y) */
        for (int i = si + 1; i < g->nnodes; i++)
            if (!ps->dead[i] && is_op(&g->nodes[i], "IsNaN") && g->nodes[i].nin == 1 && g->nodes[i].in[0] == y &&
                g->nodes[i].nout == 1 && g->nodes[i].out[0] >= 0)
                isn = i;
        int b = isn >= 0 ? g->nodes[isn].out[0] : -1;
        wh = b >= 0 && ps->nuse[b] == 1 && !ps->is_out[b] ? sole_reader(g, ps->dead, b, isn) : -1;
        const struct graph_node *w = wh >= 0 ? &g->nodes[wh] : NULL;
        if (!w || !is_op(w, "Where") || w->nin != 3 || w->nout != 1 || w->in[0] != b || w->in[2] != y ||
            !const_near(g, w->in[1], 0.0) || w->out[0] < 0)
            isn = wh = -1;
    }
    if (mask < 0 && wh < 0) return 0; /* a plain softmax: oneDNN's */
    int keep = wh >= 0 ? wh : si; /* the node that becomes the fused one, keeping its output */
    struct graph_node *n = &g->nodes[keep];
    if (set_nin(n, 2) || masked_softmax_attrs(n, f.scale, wh >= 0) || to_kiln_op(n, "MaskedSoftmax"))
        return pass_nomem(ps);
    n->in[0] = x;
    n->in[1] = mask;
    n->nin = mask >= 0 ? 2 : 1;
    if (keep != si) ps->dead[si] = 1;
    for (int k = 0; k < 3; k++)
        if (f.scale_node[k] >= 0) ps->dead[f.scale_node[k]] = 1;
    if (f.mm >= 0) { /* the operands' factors now scale the softmax */
        g->nodes[f.mm].in[0] = f.mm_in[0];
        g->nodes[f.mm].in[1] = f.mm_in[1];
    }
    if (addi >= 0) ps->dead[addi] = 1;
    if (isn >= 0) ps->dead[isn] = 1;
    log_debug("softmax '%s' with its mask and NaN guard: one MaskedSoftmax node", s->name);
    return 1;
}

static const struct pass_def masked_softmax_pass = {"fusing masked softmax", masked_softmax_node, 0};

int passes_fuse_masked_softmax(struct graph *g, int *nfused, char *err, size_t err_len) {
    return pass_run(&masked_softmax_pass, g, NULL, nfused, err, err_len);
}

/* ---- masked attention in the heads' layout (CPU) ----------------------------------------------- */

/* 1 if node r is a Shape of all of v's axes. */
static int whole_shape_of(const struct graph_node *r, int v) {
    return is_op(r, "Shape") && r->nin == 1 && r->in[0] == v && r->nout == 1 && !node_attr(r, "start") &&
           !node_attr(r, "end");
}

/* v, made by a Transpose with permutation perm (4 axes) that nothing else
 * reads: the Transpose's input (its node in *ti), else -1. With shape
 * non-NULL, a Shape of v may read it too (its node in *shape, else -1). */
static int transposed_from(struct pass *ps, int v, const int64_t *perm, int *ti, int *shape) {
    struct graph *g = ps->g;
    if (shape) *shape = -1;
    if (v < 0 || ps->is_out[v] || ps->nuse[v] < 1 || ps->nuse[v] > (shape ? 2 : 1)) return -1;
    int t = g->values[v].producer;
    const int64_t *pp;
    if (t < 0 || ps->dead[t] || !is_op(&g->nodes[t], "Transpose") || g->nodes[t].nin != 1 || g->nodes[t].nout != 1 ||
        node_attr_ints(&g->nodes[t], "perm", &pp) != 4)
        return -1;
    for (int i = 0; i < 4; i++)
        if (pp[i] != perm[i]) return -1;
    if (ps->nuse[v] == 2) { /* the other reader must be a Shape of v */
        for (int i = 0; i < g->nnodes && *shape < 0; i++) {
            const struct graph_node *r = &g->nodes[i];
            if (!ps->dead[i] && whole_shape_of(r, v)) *shape = i;
        }
        if (*shape < 0) return -1;
    }
    *ti = t;
    return g->nodes[t].in[0];
}

/* The one int64 in constant v, or def when v is no such constant. */
static int64_t const_one_i64(const struct graph *g, int v, int64_t def) {
    const struct tensor *t = const_of(g, v);
    return t && t->dtype == DT_INT64 && tensor_numel(t) == 1 ? *(const int64_t *)t->data : def;
}

/* A Shape node whose values a Reshape may take (the axes in dims), and how
 * many of its readers were found among the Reshape's pieces. */
struct shape_src {
    int node;
    unsigned dims;
    int used;
};

/* y's Reshape to its own shape, as torch exports
 * scaled_dot_product_attention's output:
 *   Reshape(y, Concat(Unsqueeze(Gather(Shape(x), k)) or a constant for each
 *   axis k)),
 * x being y itself (src[0], found here among y's readers) or a tensor whose
 * axis k is y's (src[1..nsrc), which the caller found), or 0 (which copies
 * y's axis) or -1 for at most one axis (which element counts make y's: the
 * other three are). A positive constant is refused: beside a -1, or with no
 * elements, it need not be y's axis. Every
 * reader of those Shapes must be one of the pieces. Returns the Reshape (y's
 * one other reader), the nodes that compute its shape in nodes[0..*n) (at
 * most 12), or -1. */
static int own_shape_reshape(struct pass *ps, int y, struct shape_src *src, int nsrc, int *nodes, int *n) {
    struct graph *g = ps->g;
    int ri = -1;
    src[0] = (struct shape_src){-1, 0xf, 0};
    for (int i = 0; i < g->nnodes; i++) {
        const struct graph_node *r = &g->nodes[i];
        if (ps->dead[i] || r->nin < 1 || r->in[0] != y) continue;
        if (is_op(r, "Reshape") && r->nin == 2 && r->nout == 1 && ri < 0) ri = i;
        else if (whole_shape_of(r, y) && src[0].node < 0)
            src[0].node = i;
        else
            return -1;
    }
    if (ri < 0 || ps->nuse[y] != 1 + (src[0].node >= 0)) return -1;
    int allowzero = node_attr_int(&g->nodes[ri], "allowzero", 0) != 0;
    int ci = pass_sole_producer(ps, g->nodes[ri].in[1], "Concat");
    if (ci < 0 || g->nodes[ci].nin != 4 || node_attr_int(&g->nodes[ci], "axis", 0) != 0) return -1;
    int infer = 0;
    *n = 0;
    nodes[(*n)++] = ci;
    for (int k = 0; k < 4; k++) {
        int piece = g->nodes[ci].in[k];
        int64_t c = const_one_i64(g, piece, INT64_MIN);
        if (c != INT64_MIN) {
            if (c < -1 || c > 0 || (c == 0 && allowzero)) return -1;
            infer += c == -1;
            continue;
        }
        int ui = pass_sole_producer(ps, piece, "Unsqueeze");
        if (ui < 0) return -1;
        const struct graph_node *u = &g->nodes[ui];
        const int64_t *axes;
        int na = node_attr_ints(u, "axes", &axes);
        if (!(na == 1 && axes[0] == 0) && !(u->nin == 2 && const_one_i64(g, u->in[1], -1) == 0)) return -1;
        int gi = pass_sole_producer(ps, u->in[0], "Gather");
        if (gi < 0) return -1;
        const struct graph_node *ga = &g->nodes[gi];
        int64_t idx = ga->nin == 2 ? const_one_i64(g, ga->in[1], -9) : -9;
        if (node_attr_int(ga, "axis", 0) != 0 || (idx != k && idx != k - 4)) return -1;
        int j = 0;
        while (j < nsrc && !(src[j].node >= 0 && g->nodes[src[j].node].out[0] == ga->in[0] && (src[j].dims >> k & 1)))
            j++;
        if (j == nsrc) return -1;
        src[j].used++;
        nodes[(*n)++] = ui;
        nodes[(*n)++] = gi;
    }
    if (infer > 1) return -1;
    for (int j = 0; j < nsrc; j++) {
        if (src[j].node < 0) continue;
        int sv = g->nodes[src[j].node].out[0];
        if (ps->nuse[sv] != src[j].used || ps->is_out[sv]) return -1;
        nodes[(*n)++] = src[j].node;
    }
    return ri;
}

/* BERT's attention as exporters write it, after the masked softmax's fusion,
 *   Q, K, V [B, S, H, D] -> Transpose (0,2,1,3) each (K's (0,2,3,1), or
 *   (0,2,1,3) then (0,1,3,2)) -> MatMul(Q, K) -> MaskedSoftmax
 *   -> MatMul(., V) -> [Reshape to its own shape] -> Transpose (0,2,1,3),
 * with nothing else reading what is between, becomes one kiln.HeadAttention
 * node (kernels/cpu/ops_softmax_fused.c) that reads Q, K and V where the
 * projections wrote them and writes where the next one reads. Matched at
 * the second MatMul. */
static int head_attention_node(struct pass *ps, int mi2) {
    struct graph *g = ps->g;
    const struct graph_node *m2 = &g->nodes[mi2];
    if (ps->dead[mi2] || !is_op(m2, "MatMul") || m2->nin != 2 || m2->nout != 1 || m2->act != ACT_NONE ||
        m2->in[0] < 0 || m2->in[1] < 0 || m2->out[0] < 0)
        return 0;
    int pv = m2->in[0], si = g->values[pv].producer;
    if (ps->nuse[pv] != 1 || ps->is_out[pv] || si < 0 || ps->dead[si]) return 0;
    const struct graph_node *sm = &g->nodes[si];
    if (strcmp(sm->domain, "kiln") != 0 || strcmp(sm->op_type, "MaskedSoftmax") != 0 || sm->nout != 1 ||
        sm->in[0] < 0)
        return 0;
    int mi = pass_sole_producer(ps, sm->in[0], "MatMul");
    if (mi < 0 || g->nodes[mi].nin != 2 || g->nodes[mi].act != ACT_NONE) return 0;
    static const int64_t heads[4] = {0, 2, 1, 3}, keys[4] = {0, 2, 3, 1}, last2[4] = {0, 1, 3, 2};
    int tq = -1, tk = -1, tk2 = -1, tv = -1;
    /* Q's and V's transposed shapes may give the output's axes 2 and 3 (below). */
    struct shape_src src[3] = {{-1, 0xf, 0}, {-1, 1u << 2, 0}, {-1, 1u << 3, 0}};
    int q = transposed_from(ps, g->nodes[mi].in[0], heads, &tq, &src[1].node);
    int k = transposed_from(ps, g->nodes[mi].in[1], keys, &tk, NULL);
    if (k < 0) {
        int kh = transposed_from(ps, g->nodes[mi].in[1], last2, &tk2, NULL);
        k = kh >= 0 ? transposed_from(ps, kh, heads, &tk, NULL) : -1;
    }
    int v = transposed_from(ps, m2->in[1], heads, &tv, &src[2].node), y = m2->out[0];
    if (q < 0 || k < 0 || v < 0 || ps->is_out[y]) return 0;
    int extra[13], nextra = 0, oi = -1;
    int direct = ps->nuse[y] == 1 ? sole_reader(g, ps->dead, y, mi2) : -1;
    if (direct >= 0 && is_op(&g->nodes[direct], "Transpose") && src[1].node < 0 && src[2].node < 0) {
        oi = direct;
    } else {
        int ri = own_shape_reshape(ps, y, src, 3, extra, &nextra), ry = ri >= 0 ? g->nodes[ri].out[0] : -1;
        if (ri < 0 || ry < 0 || ps->nuse[ry] != 1 || ps->is_out[ry]) return 0;
        oi = sole_reader(g, ps->dead, ry, ri);
        extra[nextra++] = ri;
    }
    const int64_t *perm;
    if (oi < 0 || !is_op(&g->nodes[oi], "Transpose") || g->nodes[oi].nin != 1 || g->nodes[oi].nout != 1 ||
        node_attr_ints(&g->nodes[oi], "perm", &perm) != 4 || memcmp(perm, heads, sizeof heads) != 0)
        return 0;
    int mask = sm->nin > 1 ? sm->in[1] : -1;
    if (known_dtype(g, q, 0) != DT_FP32 || known_dtype(g, k, 0) != DT_FP32 || known_dtype(g, v, 0) != DT_FP32 ||
        (mask >= 0 && known_dtype(g, mask, 0) != DT_FP32))
        return 0;
    float scale = node_attr_float(sm, "scale", 1.0f);
    int nan_to_zero = node_attr_int(sm, "nan_to_zero", 0) != 0;
    struct graph_node *n = &g->nodes[oi];
    if (set_nin(n, 4) || masked_softmax_attrs(n, scale, nan_to_zero) || to_kiln_op(n, "HeadAttention"))
        return pass_nomem(ps);
    n->in[0] = q;
    n->in[1] = k;
    n->in[2] = v;
    n->in[3] = mask;
    n->nin = mask >= 0 ? 4 : 3;
    ps->dead[tq] = ps->dead[tk] = ps->dead[tv] = ps->dead[mi] = ps->dead[si] = ps->dead[mi2] = 1;
    if (tk2 >= 0) ps->dead[tk2] = 1;
    for (int i = 0; i < nextra; i++) ps->dead[extra[i]] = 1;
    log_debug("attention at '%s': one HeadAttention node in the heads' layout", g->nodes[mi2].name);
    return 1;
}

static const struct pass_def head_attention_pass = {"fusing masked attention", head_attention_node, 0};

int passes_fuse_head_attention(struct graph *g, int *nfused, char *err, size_t err_len) {
    return pass_run(&head_attention_pass, g, NULL, nfused, err, err_len);
}

/* ---- unmasked attention (CPU) ------------------------------------------------------------------ */

/* Attention as exporters write it without a mask (audio and vision
 * encoders),
 *   MatMul(A, B) -> [Mul/Div by a scalar] -> Softmax(last axis) -> MatMul(., V),
 * with nothing else reading the scores, becomes one kiln.SoftmaxAttention
 * node (kernels/cpu/ops_attention.c) that never writes the scores to
 * memory. Matched at the second MatMul. */
static int softmax_attention_node(struct pass *ps, int mi2) {
    struct graph *g = ps->g;
    const struct graph_node *m2 = &g->nodes[mi2];
    if (ps->dead[mi2] || !is_op(m2, "MatMul") || m2->nin != 2 || m2->nout != 1 || m2->act != ACT_NONE ||
        m2->in[1] < 0 || m2->out[0] < 0)
        return 0;
    int si = pass_sole_producer(ps, m2->in[0], "Softmax");
    if (si < 0) return 0;
    const struct graph_node *sm = &g->nodes[si];
    if (sm->opset < 13 || sm->nin != 1 || sm->in[0] < 0 || node_attr_int(sm, "axis", -1) != -1) return 0;
    struct softmax_feed f;
    softmax_feed(ps, sm->in[0], &f);
    if (f.addi >= 0) return 0; /* masked: kiln.MaskedSoftmax's */
    int mi = pass_sole_producer(ps, f.x, "MatMul");
    if (mi < 0 || g->nodes[mi].nin != 2 || g->nodes[mi].act != ACT_NONE) return 0;
    int a = f.mm_in[0], b = f.mm_in[1], v = m2->in[1];
    if (a < 0 || b < 0 || known_dtype(g, a, 0) != DT_FP32 || known_dtype(g, b, 0) != DT_FP32 ||
        known_dtype(g, v, 0) != DT_FP32)
        return 0;
    struct graph_node *n = &g->nodes[mi2];
    struct graph_attr *at = calloc(1, sizeof *at);
    char *an = strdup("scale");
    if (!at || !an || set_nin(n, 3) || to_kiln_op(n, "SoftmaxAttention")) {
        free(at);
        free(an);
        return pass_nomem(ps);
    }
    at[0] = (struct graph_attr){.name = an, .type = ATTR_FLOAT, .f = f.scale};
    for (int k = 0; k < n->nattr; k++) graph_attr_clear(&n->attrs[k]);
    free(n->attrs);
    n->attrs = at;
    n->nattr = 1;
    n->in[0] = a;
    n->in[1] = b;
    n->in[2] = v;
    n->nin = 3;
    ps->dead[si] = ps->dead[mi] = 1;
    for (int k = 0; k < 3; k++)
        if (f.scale_node[k] >= 0) ps->dead[f.scale_node[k]] = 1;
    log_debug("attention at '%s' without a mask: one SoftmaxAttention node", g->nodes[si].name);
    return 1;
}

static const struct pass_def softmax_attention_pass = {"fusing unmasked attention", softmax_attention_node, 0};

int passes_fuse_softmax_attention(struct graph *g, int *nfused, char *err, size_t err_len) {
    return pass_run(&softmax_attention_pass, g, NULL, nfused, err, err_len);
}

/* ---- QDQ to integer operators (CPU) -------------------------------------------------------- */

/* onnxruntime.quantization's QDQ format writes a quantized model as its float
 * graph with DequantizeLinear before each operator and QuantizeLinear after
 * it. The rewrites below turn DequantizeLinear -> op -> QuantizeLinear into
 * the integer operator that computes the same thing on the 8-bit values, so
 * activations stay 8-bit from one operator to the next:
 *   Conv [-> Relu/Clip]        QLinearConv (the activation fused: node->act)
 *   Add                        com.microsoft QLinearAdd
 *   GlobalAveragePool          com.microsoft QLinearGlobalAveragePool
 *   MaxPool, Flatten, Reshape  the op itself on the 8-bit input, when the
 *                              QuantizeLinear's scale and zero point are the
 *                              DequantizeLinear's (exact: they commute)
 * The integer operators round once where the float graph rounds the float
 * result of float arithmetic: results agree with ONNX's reference within one
 * quantization step. Run before constant folding, which would otherwise turn
 * the weights' DequantizeLinear into float constants. */

/* A per-tensor quantization: scale (one float32) and zero point (one 8-bit
 * value, whose type is the quantized tensor's), both constants. */
static int q_scalar_params(const struct graph *g, const struct graph_node *n) {
    if (n->nin < 3 || n->nout != 1 || n->out[0] < 0) return 0;
    const struct tensor *s = const_of(g, n->in[1]), *z = const_of(g, n->in[2]);
    return s && z && s->dtype == DT_FP32 && tensor_numel(s) == 1 && (z->dtype == DT_UINT8 || z->dtype == DT_INT8) &&
           tensor_numel(z) == 1 && op_double_at(s, 0) > 0;
}

/* The DequantizeLinear (per tensor, constant parameters) that produces v,
 * or -1. */
static int dq_producer(struct pass *ps, int v) {
    if (v < 0) return -1;
    int di = ps->g->values[v].producer;
    if (di < 0 || ps->dead[di]) return -1;
    const struct graph_node *d = &ps->g->nodes[di];
    return is_op(d, "DequantizeLinear") && q_scalar_params(ps->g, d) ? di : -1;
}

/* The QuantizeLinear (per tensor, constant parameters) that alone reads
 * node i's output 0, or -1. */
static int q_reader(struct pass *ps, int i) {
    int qi = next_op(ps, i, "QuantizeLinear");
    return qi >= 0 && ps->g->nodes[qi].in[0] == ps->g->nodes[i].out[0] && q_scalar_params(ps->g, &ps->g->nodes[qi])
               ? qi
               : -1;
}

/* 1 if the scale and zero point of nodes a and b (Q or DQ) are equal. */
static int same_qparams(const struct graph *g, const struct graph_node *a, const struct graph_node *b) {
    for (int k = 1; k <= 2; k++) {
        const struct tensor *x = const_of(g, a->in[k]), *y = const_of(g, b->in[k]);
        if (x->dtype != y->dtype || op_double_at(x, 0) != op_double_at(y, 0)) return 0;
    }
    return 1;
}

/* Constant 8-bit weights of a Conv dequantized per tensor or per output
 * channel (axis 0): W_q, scale, zero point. */
static int dq_weights(struct pass *ps, int v, int *wq, int *ws, int *wz) {
    const struct graph *g = ps->g;
    int di = v >= 0 ? g->values[v].producer : -1;
    if (di < 0 || ps->dead[di]) return 0;
    const struct graph_node *d = &g->nodes[di];
    if (!is_op(d, "DequantizeLinear") || d->nin < 3) return 0;
    const struct tensor *w = const_of(g, d->in[0]), *s = const_of(g, d->in[1]), *z = const_of(g, d->in[2]);
    if (!w || !s || !z || (w->dtype != DT_INT8 && w->dtype != DT_UINT8) || z->dtype != w->dtype || s->dtype != DT_FP32 ||
        w->ndim < 3 || tensor_numel(s) != tensor_numel(z))
        return 0;
    if (tensor_numel(s) != 1 && (tensor_numel(s) != w->dims[0] || node_attr_int(d, "axis", 1) != 0)) return 0;
    if (node_attr_int(d, "block_size", 0) != 0) return 0;
    *wq = d->in[0];
    *ws = d->in[1];
    *wz = d->in[2];
    return 1;
}

/* A bias quantized to int32 at scale x_scale * w_scale (zero point 0), as
 * QLinearConv takes it: the int32 constant, or -1 when v is not one. */
static int dq_bias(struct pass *ps, int v, int64_t m, float xs, const struct tensor *ws) {
    const struct graph *g = ps->g;
    int di = v >= 0 ? g->values[v].producer : -1;
    if (di < 0 || ps->dead[di]) return -1;
    const struct graph_node *d = &g->nodes[di];
    if (!is_op(d, "DequantizeLinear") || d->nin < 2) return -1;
    const struct tensor *b = const_of(g, d->in[0]), *s = const_of(g, d->in[1]);
    const struct tensor *z = d->nin > 2 && d->in[2] >= 0 ? const_of(g, d->in[2]) : NULL;
    if (!b || !s || b->dtype != DT_INT32 || tensor_numel(b) != m || s->dtype != DT_FP32) return -1;
    if (tensor_numel(s) != 1 && tensor_numel(s) != m) return -1;
    if (d->nin > 2 && d->in[2] >= 0 && !z) return -1;
    for (int64_t i = 0; i < m; i++) {
        double want = (double)xs * op_double_at(ws, tensor_numel(ws) == 1 ? 0 : i);
        double got = op_double_at(s, tensor_numel(s) == 1 ? 0 : i);
        if (fabs(got - want) > 1e-6 * fabs(want)) return -1;
        if (z && op_double_at(z, tensor_numel(z) == 1 ? 0 : i) != 0) return -1;
    }
    return d->in[0];
}

int pass_become(struct pass *ps, int ni, const char *domain, const char *op_type, const int *in, int nin,
                int keep_attrs) {
    struct graph_node *n = &ps->g->nodes[ni];
    const struct op_def *op = op_find(domain, op_type);
    if (!op) return 0;
    char *t = strdup(op_type), *dm = strdup(domain);
    int *ins = malloc((size_t)nin * sizeof *ins);
    if (!t || !dm || !ins) {
        free(t);
        free(dm);
        free(ins);
        return pass_nomem(ps);
    }
    memcpy(ins, in, (size_t)nin * sizeof *ins);
    free(n->op_type);
    free(n->domain);
    free(n->in);
    n->op_type = t;
    n->domain = dm;
    n->in = ins;
    n->nin = nin;
    n->op = op;
    if (!keep_attrs) {
        for (int k = 0; k < n->nattr; k++) graph_attr_clear(&n->attrs[k]);
        n->nattr = 0;
    }
    if (domain[0]) n->opset = 1;
    return 1;
}

/* Turns node n into op_type (domain) with inputs in[0..nin), keeping its
 * attributes when keep_attrs; its output becomes that of the QuantizeLinear
 * qi, which goes (with the activation ai, if any) when the pass ends. */
static int become_qop(struct pass *ps, int ni, const char *domain, const char *op_type, const int *in, int nin,
                      int keep_attrs, int ai, int qi) {
    int rc = pass_become(ps, ni, domain, op_type, in, nin, keep_attrs);
    if (rc <= 0) return rc;
    if (ai >= 0) ps->dead[ai] = 1;
    take_output(ps, ni, qi);
    log_debug("QDQ: %s '%s' runs on 8-bit values", op_type, ps->g->nodes[ni].name);
    return 1;
}

/* Conv between DequantizeLinear of its input, weights and bias and a
 * QuantizeLinear, with Relu or Clip (constant bounds) between. */
static int qdq_conv(struct pass *ps, int ci) {
    struct graph *g = ps->g;
    const struct graph_node *c = &g->nodes[ci];
    if (c->nin < 2 || c->nout != 1 || c->act != ACT_NONE) return 0;
    int xi = dq_producer(ps, c->in[0]), wq, ws, wz;
    if (xi < 0 || !dq_weights(ps, c->in[1], &wq, &ws, &wz)) return 0;
    int64_t m = const_of(g, wq)->dims[0];
    /* uint8 weights or nonzero weight zero points would run QLinearConv's
     * exact loop, slower than the float Conv: left float. */
    const struct tensor *wzt = const_of(g, wz);
    if (const_of(g, wq)->dtype != DT_INT8) return 0;
    for (int64_t i = 0; i < tensor_numel(wzt); i++)
        if (op_double_at(wzt, i) != 0) return 0;
    const struct graph_node *x = &g->nodes[xi];
    int bq = -1;
    if (c->nin > 2 && c->in[2] >= 0 &&
        (bq = dq_bias(ps, c->in[2], m, (float)op_double_at(const_of(g, x->in[1]), 0), const_of(g, ws))) < 0)
        return 0;
    int ai = -1, last = ci;
    enum act_kind kind = ACT_NONE;
    float alpha = 0, beta = 0;
    int r = c->out[0] >= 0 && ps->nuse[c->out[0]] == 1 && !ps->is_out[c->out[0]]
                ? sole_reader(g, ps->dead, c->out[0], ci)
                : -1;
    if (r >= 0 && (is_op(&g->nodes[r], "Relu") || is_op(&g->nodes[r], "Clip")) &&
        g->nodes[r].in[0] == c->out[0] && passes_activation_of(g, &g->nodes[r], &kind, &alpha, &beta)) {
        ai = last = r;
    } else {
        kind = ACT_NONE;
    }
    int qi = q_reader(ps, last);
    if (qi < 0) return 0;
    int in[9] = {x->in[0], x->in[1], x->in[2], wq, ws, wz, g->nodes[qi].in[1], g->nodes[qi].in[2], bq};
    int rc = become_qop(ps, ci, "", "QLinearConv", in, bq >= 0 ? 9 : 8, 1, ai, qi);
    if (rc > 0) {
        g->nodes[ci].act = kind;
        g->nodes[ci].act_alpha = alpha;
        g->nodes[ci].act_beta = beta;
    }
    return rc;
}

/* Add of two DequantizeLinear outputs, quantized (a residual connection). */
static int qdq_add(struct pass *ps, int ni) {
    struct graph *g = ps->g;
    const struct graph_node *n = &g->nodes[ni];
    if (n->nin != 2 || n->nout != 1) return 0;
    int a = dq_producer(ps, n->in[0]), b = dq_producer(ps, n->in[1]), qi = q_reader(ps, ni);
    if (a < 0 || b < 0 || qi < 0) return 0;
    const struct graph_node *da = &g->nodes[a], *db = &g->nodes[b], *q = &g->nodes[qi];
    enum dtype t = const_of(g, da->in[2])->dtype;
    if (const_of(g, db->in[2])->dtype != t || const_of(g, q->in[2])->dtype != t) return 0;
    int in[8] = {da->in[0], da->in[1], da->in[2], db->in[0], db->in[1], db->in[2], q->in[1], q->in[2]};
    return become_qop(ps, ni, "com.microsoft", "QLinearAdd", in, 8, 0, -1, qi);
}

/* GlobalAveragePool of a DequantizeLinear output, quantized. */
static int qdq_gap(struct pass *ps, int ni) {
    struct graph *g = ps->g;
    const struct graph_node *n = &g->nodes[ni];
    if (n->nin != 1 || n->nout != 1) return 0;
    int d = dq_producer(ps, n->in[0]), qi = q_reader(ps, ni);
    if (d < 0 || qi < 0) return 0;
    const struct graph_node *dq = &g->nodes[d], *q = &g->nodes[qi];
    if (const_of(g, dq->in[2])->dtype != const_of(g, q->in[2])->dtype) return 0;
    int in[5] = {dq->in[0], dq->in[1], dq->in[2], q->in[1], q->in[2]};
    return become_qop(ps, ni, "com.microsoft", "QLinearGlobalAveragePool", in, 5, 0, -1, qi);
}

/* An op that moves or selects values (MaxPool, Flatten, Reshape) between a
 * DequantizeLinear and a QuantizeLinear of the same scale and zero point
 * runs on the 8-bit values directly. */
static int qdq_direct(struct pass *ps, int ni) {
    struct graph *g = ps->g;
    struct graph_node *n = &g->nodes[ni];
    int pool = is_op(n, "MaxPool");
    if (n->nin < 1 || n->nout != 1 || (pool && n->nin != 1)) return 0;
    int d = dq_producer(ps, n->in[0]), qi = q_reader(ps, ni);
    if (d < 0 || qi < 0 || !same_qparams(g, &g->nodes[d], &g->nodes[qi])) return 0;
    n->in[0] = g->nodes[d].in[0];
    take_output(ps, ni, qi);
    log_debug("QDQ: %s '%s' runs on 8-bit values", n->op_type, n->name);
    return 1;
}

static int qdq_node(struct pass *ps, int i) {
    const struct graph_node *n = &ps->g->nodes[i];
    if (ps->dead[i]) return 0;
    /* Without VNNI most integer convolutions would run QLinearConv's exact
     * loop (see ops_nn.c), slower than the float Conv they replace. */
    if (is_op(n, "Conv")) return dnnl_util_isa_vnni() ? qdq_conv(ps, i) : 0;
    if (is_op(n, "Add")) return qdq_add(ps, i);
    if (is_op(n, "GlobalAveragePool")) return qdq_gap(ps, i);
    if (is_op(n, "MaxPool") || is_op(n, "Flatten") || is_op(n, "Reshape")) return qdq_direct(ps, i);
    return 0;
}

static const struct pass_def qdq_pass = {"rewriting quantized operators", qdq_node, 0};

int passes_fuse_qdq(struct graph *g, int *nfused, char *err, size_t err_len) {
    return pass_run(&qdq_pass, g, NULL, nfused, err, err_len);
}

/* ---- QuantizeLinear -> DequantizeLinear after a float Conv (CPU) --------------------------- */

/* Where QDQ convolutions stay float (no VNNI), each activation is written
 * by the Conv, read and written 8-bit by QuantizeLinear, read and written
 * float by DequantizeLinear: on QDQ MobileNetV2 with AVX2, 4 ms of 11. The
 * pair is the elementwise scale * clip(round(x / scale), qmin - zp, qmax -
 * zp) (integers throughout: round(x / s) + zp clipped, then minus zp), which
 * the Conv applies as its activation (ACT_QDQ, oneDNN post-ops). The Conv's
 * own Relu or Clip commutes with the rounding (both are monotonic) and goes
 * when the quantization clips at least as tightly; otherwise nothing fuses. */
static int fake_quant_node(struct pass *ps, int ci) {
    struct graph *g = ps->g;
    struct graph_node *c = &g->nodes[ci];
    if (ps->dead[ci] || !is_op(c, "Conv") || c->nout != 1 || !produces_fp32(g, c)) return 0;
    if (c->act != ACT_NONE && c->act != ACT_RELU && c->act != ACT_CLIP) return 0;
    int qi = q_reader(ps, ci), di = qi >= 0 ? next_op(ps, qi, "DequantizeLinear") : -1;
    if (di < 0 || !q_scalar_params(g, &g->nodes[di]) || !same_qparams(g, &g->nodes[qi], &g->nodes[di])) return 0;
    const struct tensor *st = const_of(g, g->nodes[qi].in[1]), *zt = const_of(g, g->nodes[qi].in[2]);
    const float s = (float)op_double_at(st, 0);
    const float lo = (zt->dtype == DT_UINT8 ? 0.0f : -128.0f) - (float)op_double_at(zt, 0), hi = lo + 255.0f;
    if (!isfinite(s) || !isfinite(1.0f / s)) return 0;
    if (c->act == ACT_RELU && lo < 0.0f) return 0;
    if (c->act == ACT_CLIP && !(nearbyintf(c->act_alpha / s) <= lo && nearbyintf(c->act_beta / s) >= hi)) return 0;
    c->act = ACT_QDQ;
    c->act_alpha = s;
    c->act_beta = lo;
    take_output(ps, ci, di);
    ps->dead[qi] = 1;
    log_debug("QDQ: QuantizeLinear '%s' and DequantizeLinear '%s' run in Conv '%s'", g->nodes[qi].name,
              g->nodes[di].name, c->name);
    return 1;
}

static const struct pass_def fake_quant_pass = {"fusing quantization into convolutions", fake_quant_node, 0};

int passes_fuse_fake_quant(struct graph *g, int *nfused, char *err, size_t err_len) {
    return pass_run(&fake_quant_pass, g, NULL, nfused, err, err_len);
}

/* ---- NHWC between integer convolutions (CPU) ------------------------------------------------ */

/* oneDNN's int8 convolutions work on NHWC; ONNX tensors are NCHW, so each
 * QLinearConv would reorder its input in and its output back. Where an
 * 8-bit activation only flows between QLinearConvs (as their input x) and
 * same-shape QLinearAdds, 8-bit MaxPools and QLinearGlobalAveragePools,
 * it is stored NHWC instead, its dims still NCHW: the node attribute
 * kiln_layout says which of a QLinearConv's x (1) and y (2) are NHWC, on a
 * QLinearAdd or MaxPool (3) that its inputs and output are, on a
 * QLinearGlobalAveragePool (1) that its x is. A graph output, or a value
 * any other node reads, stays NCHW. */

static int is_qconv_2d(const struct graph *g, const struct graph_node *n) {
    const struct tensor *w = n->nin > 3 ? const_of(g, n->in[3]) : NULL;
    if (!is_op(n, "QLinearConv") || !w || w->ndim != 4) return 0;
    /* Only oneDNN's int8 convolution reads NHWC; the exact path (what it
     * cannot sum exactly: full-range weights without VNNI) reads NCHW. x's
     * type is its own where known, else its zero point's. */
    for (int k = 1; k < n->nin && k < 8; k++) /* the scales and zero points too, as the kernel asks */
        if (n->in[k] >= 0 && !const_of(g, n->in[k])) return 0;
    const struct tensor *xz = n->nin > 2 ? const_of(g, n->in[2]) : NULL;
    enum dtype xt = n->in[0] >= 0 ? g->values[n->in[0]].t.dtype : DT_UNDEFINED;
    if (xt == DT_UNDEFINED && xz) xt = xz->dtype;
    return xt != DT_UNDEFINED && dnnl_util_int8_conv_exact(xt, w, n->nin > 5 ? const_of(g, n->in[5]) : NULL);
}

/* An 8-bit MaxPool over 2 spatial dims without Indices, which pools NHWC
 * bytes (kiln_layout 3) as well; its input's type is known only from its
 * producer here, so ask that it be a QLinearConv, QLinearAdd or another
 * such MaxPool (what passes_qdq_layout stores NHWC). */
static int is_qmaxpool_2d(const struct graph *g, const struct graph_node *n) {
    if (!is_op(n, "MaxPool") || n->nin < 1 || n->in[0] < 0 || (n->nout > 1 && n->out[1] >= 0)) return 0;
    const int64_t *ks = NULL;
    if (node_attr_ints(n, "kernel_shape", &ks) != 2) return 0;
    int p = g->values[n->in[0]].producer;
    if (p < 0) return 0;
    const struct graph_node *src = &g->nodes[p];
    return is_qconv_2d(g, src) || is_qlinear_add(src) || is_qmaxpool_2d(g, src);
}

/* 1 if every reader of v can take it NHWC, given the marks so far. */
static int nhwc_readers_ok(const struct graph *g, const unsigned char *nhwc, int v) {
    for (int i = 0; i < g->nnodes; i++) {
        const struct graph_node *n = &g->nodes[i];
        for (int k = 0; k < n->nin; k++) {
            if (n->in[k] != v) continue;
            if (is_qconv_2d(g, n) && k == 0) continue;
            if (is_qlinear_add(n) && (k == 0 || k == 3) && nhwc[n->in[0]] && nhwc[n->in[3]] && nhwc[n->out[0]])
                continue;
            if (is_qmaxpool_2d(g, n) && k == 0 && nhwc[n->out[0]]) continue;
            if (is_qgap_nchw(n) && k == 0) continue;
            return 0;
        }
    }
    return 1;
}

int passes_qdq_layout(struct graph *g, int *nnhwc, char *err, size_t err_len) {
    unsigned char *nhwc = calloc((size_t)(g->nvalues > 0 ? g->nvalues : 1), 1);
    if (!nhwc) return status_set(err, err_len, STATUS_NOMEM, "out of memory planning layouts");
    *nnhwc = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const struct graph_node *n = &g->nodes[i];
        if ((is_qconv_2d(g, n) || is_qlinear_add(n) || is_qmaxpool_2d(g, n)) && n->nout >= 1 && n->out[0] >= 0)
            nhwc[n->out[0]] = 1;
    }
    for (int o = 0; o < g->noutputs; o++) nhwc[g->outputs[o]] = 0;
    for (int more = 1; more;) { /* demote until stable */
        more = 0;
        for (int v = 0; v < g->nvalues; v++)
            if (nhwc[v] && !nhwc_readers_ok(g, nhwc, v)) nhwc[v] = 0, more = 1;
        for (int i = 0; i < g->nnodes; i++) { /* a follower's output only with its inputs */
            const struct graph_node *n = &g->nodes[i];
            int add = is_qlinear_add(n);
            if (!add && !is_qmaxpool_2d(g, n)) continue;
            int y = n->out[0];
            if (nhwc[y] && !(nhwc[n->in[0]] && (!add || nhwc[n->in[3]]))) nhwc[y] = 0, more = 1;
        }
    }
    for (int i = 0; i < g->nnodes; i++) {
        struct graph_node *n = &g->nodes[i];
        int64_t lay = 0;
        if (is_qconv_2d(g, n)) lay = (nhwc[n->in[0]] ? 1 : 0) | (nhwc[n->out[0]] ? 2 : 0);
        else if ((is_qlinear_add(n) || is_qmaxpool_2d(g, n)) && nhwc[n->out[0]]) lay = 3;
        else if (is_qgap_nchw(n) && n->nin > 0 && n->in[0] >= 0 && nhwc[n->in[0]]) lay = 1;
        if (!lay) continue;
        if (!is_qconv_2d(g, n) && !is_qlinear_add(n))
            log_debug("QDQ: %s '%s' reads NHWC bytes", n->op_type, n->name);
        if (node_set_attr_int(n, "kiln_layout", lay)) {
            free(nhwc);
            return status_set(err, err_len, STATUS_NOMEM, "out of memory planning layouts");
        }
        (*nnhwc)++;
    }
    free(nhwc);
    return 0;
}

/* ---- all of them ------------------------------------------------------------------------------ */

int passes_run(struct graph *g, char *err, size_t err_len) { return passes_run_for(g, 0, err, err_len); }

int passes_run_for(struct graph *g, int cpu_only, char *err, size_t err_len) {
    int before = g->nnodes, folded = 0, removed = 0, bn = 0, affine = 0, bias = 0, gelu = 0, act = 0, attn = 0,
        removed2 = 0, qdq = 0, sattn = 0, hattn = 0, dynq = 0, gelu_tanh = 0, hswish = 0, silu = 0, fq = 0, post = 0, rms = 0, rc;
    /* Before folding, which would dequantize the weights into floats. */
    if (cpu_only && (rc = passes_fuse_qdq(g, &qdq, err, err_len))) return rc;
    /* Folding may make an If's condition constant, and a branch brings
     * nodes that fold in turn. */
    for (int round = 0, more = 1; more && round < 8; round++) {
        int f = 0, inl = 0;
        if ((rc = passes_fold_constants(g, &f, err, err_len)) || (rc = passes_inline_if(g, &inl, err, err_len)))
            return rc;
        folded += f;
        more = inl > 0;
    }
    if ((rc = passes_eliminate_dead(g, &removed))) return status_set(err, err_len, rc, "out of memory removing dead nodes");
    if (cpu_only && (rc = passes_fuse_dynq(g, &dynq, err, err_len))) return rc;
    if ((rc = passes_fold_conv_bn(g, &bn, err, err_len))) return rc;
    if ((rc = passes_fold_affine(g, &affine, err, err_len))) return rc;
    if ((rc = passes_fuse_bias(g, &bias, err, err_len))) return rc;
    if ((rc = passes_fuse_gelu(g, &gelu, err, err_len))) return rc;
    if (cpu_only && (rc = passes_fuse_gelu_tanh(g, &gelu_tanh, err, err_len))) return rc;
    if (cpu_only && (rc = passes_fuse_hardswish(g, &hswish, err, err_len))) return rc;
    if (cpu_only && (rc = passes_fuse_rmsnorm(g, &rms, err, err_len))) return rc;
    if ((rc = passes_fuse_activations(g, &act, err, err_len))) return rc;
    if (cpu_only && (rc = passes_fuse_silu(g, &silu, err, err_len))) return rc;
    if (cpu_only && (rc = passes_fuse_post_affine(g, &post, err, err_len))) return rc;
    if (cpu_only && (rc = passes_fuse_fake_quant(g, &fq, err, err_len))) return rc;
    if (cpu_only && (rc = passes_fuse_masked_softmax(g, &attn, err, err_len))) return rc;
    if (cpu_only && (rc = passes_fuse_softmax_attention(g, &sattn, err, err_len))) return rc;
    if (cpu_only && (rc = passes_fuse_head_attention(g, &hattn, err, err_len))) return rc;
    if ((rc = passes_eliminate_dead(g, &removed2))) return status_set(err, err_len, rc, "out of memory removing dead nodes");
    int nhwc = 0, nlayout = 0, resid = 0;
    if (qdq && (rc = passes_qdq_layout(g, &nhwc, err, err_len))) return rc;
    if (cpu_only && (rc = passes_layout(g, &nlayout, err, err_len))) return rc;
    if (cpu_only && (rc = passes_fuse_residual(g, &resid, err, err_len))) return rc;
    log_debug("graph passes: %d -> %d nodes (%d folded, %d dead, %d BatchNorm and %d per-channel Mul/Add folded, %d "
              "bias, %d GELU, %d tanh GELU, %d HardSwish, %d RMS norms, %d activations (%d with a scale and shift after), %d SiLU, %d "
              "masked softmaxes (%d of them in "
              "whole attentions) and %d unmasked attentions fused, %d quantized operators, %d quantization round trips "
              "in float convolutions, %d on NHWC, %d dynamically quantized products, %d float nodes on channels-last, %d "
              "residual sums in convolutions)",
              before, g->nnodes, folded, removed + removed2, bn, affine, bias, gelu, gelu_tanh, hswish, rms, act, post, silu, attn,
              hattn, sattn, qdq, fq, nhwc, dynq, nlayout, resid);
    return 0;
}
