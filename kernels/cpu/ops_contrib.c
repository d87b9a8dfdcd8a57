/* ops_contrib.c - the float operators of onnxruntime's contrib domain
 * (com.microsoft) that its transformers optimizer writes into the models it
 * fuses: the residual-and-normalize family (SkipLayerNormalization,
 * SkipSimplifiedLayerNormalization, SimplifiedLayerNormalization, which
 * onnxruntime registers in the default domain, EmbedLayerNormalization)
 * the bias-and-activation family (Gelu, BiasGelu, FastGelu, QuickGelu,
 * BiasAdd, BiasSplitGelu), and the Conv and Gemm that onnxruntime's own
 * graph optimizer fuses with their activation (FusedConv, FusedGemm).
 *
 * Semantics are onnxruntime's (docs/ContribOperators.md and its CPU
 * kernels). Sums and variances of a row are accumulated in double, so a
 * hidden size in the thousands keeps float32's precision; onnxruntime
 * accumulates in float, which bounds the difference. All of them take and
 * give float32; an FP16 model reaches them widened (models/lower_fp16.c). */

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/dnnl_util.h"
#include "kernels/cpu/elementwise_util.h"
#include "kernels/cpu/params_util.h"
#include "kernels/cpu/shape_util.h"
#include "kernels/cpu/sigmoid_vec.h"
#include "kernels/ops.h"

/* ------------------------------------------------------------------------
 * Shared checks
 * ------------------------------------------------------------------------ */

/* Output i, or NULL when the node leaves it out (its name is empty). */
static struct tensor *out_opt(const struct op_call *c, int i) {
    return i < c->nout && (!c->node->out || c->node->out[i] >= 0) ? c->out[i] : NULL; /* c->out[i] may be NULL too */
}

/* Input i must be present (when required), float32 and of known rank. */
static int need_f32_in(struct op_call *c, int i, const char *what, int required) {
    const struct tensor *t = in_opt(c, i);
    if (!t) return required ? op_error(c, "input %d (%s) is required", i, what) : 0;
    if (t->ndim < 0) return op_error(c, "input %d (%s) has no known rank", i, what);
    if (t->dtype != DT_FP32) {
        op_error(c, "input %d (%s) has dtype %s; this operator takes float32", i, what, dtype_name(t->dtype));
        return STATUS_UNSUPPORTED;
    }
    return 0;
}

/* Optional input i, if present, must hold exactly n values (one per channel). */
static int need_vec(struct op_call *c, int i, const char *what, int64_t n) {
    const struct tensor *t = in_opt(c, i);
    if (!t) return 0;
    if (tensor_numel(t) != n)
        return op_error(c, "%s has %lld values; it must have %lld (the last dim of the input)", what,
                        (long long)tensor_numel(t), (long long)n);
    return 0;
}

/* Output o gets t's shape and dtype dt. */
static void like(struct op_call *c, struct tensor *o, const struct tensor *t, enum dtype dt) {
    set_shape(c, o, dt, t->ndim, t->dims);
}

/* ------------------------------------------------------------------------
 * Residual and normalization
 *
 * One row routine serves the four ops: y = norm(x + skip + bias) * gamma
 * + beta over the last n values, where norm subtracts the mean (layer
 * norm) or not (the "simplified" RMS form). The sum before normalizing,
 * the mean and 1/sqrt(var + eps) are optional outputs.
 * ------------------------------------------------------------------------ */

struct norm_row {
    const float *x, *skip, *bias, *gamma, *beta;
    float *y, *sum, *mean, *inv;
};

static void norm_row_run(const struct norm_row *r, int64_t n, double eps, int simplified) {
    const float *t = r->x;
    if (r->skip || r->bias || r->sum) { /* the sum normalized, kept when asked for */
        float *u = r->sum ? r->sum : r->y;
        for (int64_t j = 0; j < n; j++)
            u[j] = r->x[j] + (r->skip ? r->skip[j] : 0.0f) + (r->bias ? r->bias[j] : 0.0f);
        t = u;
    }
    ew_norm_row_f32(t, r->gamma, n, r->beta, r->beta ? n : 0, r->y, r->mean, r->inv, n, (float)eps, simplified);
}

/* Decoded at prepare: where each input and output sits, the row geometry
 * and epsilon. skip_rows is how many rows the skip holds (it repeats over
 * the leading dims it lacks, as onnxruntime's (1, S, H) skip does). */
struct norm_params {
    int skip_in, gamma_in, beta_in, bias_in; /* input indices, -1 when the op has none */
    int mean_out, inv_out, sum_out;          /* output indices, -1 when the op has none */
    int simplified;
    int64_t rows, n, skip_rows;
    double eps;
};

static int norm_layout(struct op_call *c, struct norm_params *p) {
    const char *op = c->node->op_type;
    memset(p, 0, sizeof *p);
    p->skip_in = p->beta_in = p->bias_in = p->mean_out = p->inv_out = p->sum_out = -1;
    p->eps = 1e-12;
    if (strcmp(op, "SkipLayerNormalization") == 0) {
        *p = (struct norm_params){1, 2, 3, 4, 1, 2, 3, 0, 0, 0, 0, 1e-12};
    } else if (strcmp(op, "SkipSimplifiedLayerNormalization") == 0) {
        *p = (struct norm_params){1, 2, -1, 3, -1, 2, 3, 1, 0, 0, 0, 1e-12};
        if (out_opt(c, 1))
            return op_error(c, "output 1 (mean) is not defined for the simplified (RMS) normalization");
    } else { /* SimplifiedLayerNormalization: X, scale -> Y, inv_std_var */
        *p = (struct norm_params){-1, 1, -1, -1, -1, 1, -1, 1, 0, 0, 0, 1e-5};
    }
    p->eps = node_attr_float(c->node, "epsilon", (float)p->eps);
    if (p->eps < 0) return op_error(c, "epsilon must not be negative (got %g)", p->eps);
    const struct tensor *x = in_opt(c, 0);
    int axis = x->ndim - 1;
    if (p->skip_in < 0) {
        axis = op_axis(c, node_attr_int(c->node, "axis", -1), x->ndim);
        if (axis < 0) return STATUS_INVALID;
    }
    p->rows = p->n = 1;
    for (int i = 0; i < x->ndim; i++) {
        if (i < axis) p->rows *= x->dims[i];
        else p->n *= x->dims[i];
    }
    p->skip_rows = p->rows;
    if (p->skip_in >= 0) {
        const struct tensor *s = in_opt(c, p->skip_in);
        int64_t ns = tensor_numel(s);
        /* skip has input's shape, or its trailing dims after leading 1s */
        int ok = s->ndim >= 1 && s->ndim <= x->ndim, lead = 1;
        for (int i = 0; ok && i < s->ndim; i++) {
            int64_t ds = s->dims[i], dx = x->dims[x->ndim - s->ndim + i];
            lead = lead && ds == 1 && i < s->ndim - 1;
            ok = lead || ds == dx;
        }
        if (!ok) {
            char sx[128], ss[128];
            return op_error(c, "skip %s does not match input %s (same shape, or its trailing dims)",
                            tensor_shape_str(s, ss, sizeof ss), tensor_shape_str(x, sx, sizeof sx));
        }
        p->skip_rows = p->n ? ns / p->n : 1;
        if (p->skip_rows == 0 || p->rows % p->skip_rows) return op_error(c, "skip does not repeat over the input");
    }
    return 0;
}

static int norm_infer(struct op_call *c) {
    struct norm_params p;
    int rc;
    if ((rc = need_f32_in(c, 0, "input", 1))) return rc;
    const struct tensor *x = c->in[0];
    if (x->ndim < 1) return op_error(c, "input must have rank >= 1");
    int is_skip = strcmp(c->node->op_type, "SimplifiedLayerNormalization") != 0;
    if ((is_skip && (rc = need_f32_in(c, 1, "skip", 1)))) return rc;
    if ((rc = norm_layout(c, &p))) return rc;
    if ((rc = need_f32_in(c, p.gamma_in, "gamma", 1)) || (rc = need_vec(c, p.gamma_in, "gamma", p.n))) return rc;
    if (p.beta_in >= 0 && ((rc = need_f32_in(c, p.beta_in, "beta", 0)) || (rc = need_vec(c, p.beta_in, "beta", p.n))))
        return rc;
    if (p.bias_in >= 0 && ((rc = need_f32_in(c, p.bias_in, "bias", 0)) || (rc = need_vec(c, p.bias_in, "bias", p.n))))
        return rc;
    like(c, c->out[0], x, DT_FP32);
    /* every output slot gets a shape, the ones the node leaves out too */
    for (int k = 1; k < c->nout; k++) {
        struct tensor *o = c->out[k];
        if (!o) continue;
        like(c, o, x, DT_FP32);
        if (k != p.mean_out && k != p.inv_out) continue;
        for (int i = x->ndim - 1; i >= 0 && tensor_numel(o) != p.rows; i--) o->dims[i] = 1;
    }
    return 0;
}

static int norm_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct norm_params p;
    int rc = norm_layout(c, &p);
    return rc ? rc : params_keep(c, &p, sizeof p, state);
}

static const float *fdata(const struct op_call *c, int i) {
    const struct tensor *t = i >= 0 ? in_opt(c, i) : NULL;
    return t ? t->data : NULL;
}
static float *fout(const struct op_call *c, int i) {
    struct tensor *t = i >= 0 ? out_opt(c, i) : NULL;
    return t ? t->data : NULL;
}

static int norm_run(struct op_call *c) {
    const struct norm_params *p = c->state;
    const float *x = c->in[0]->data, *skip = fdata(c, p->skip_in);
    const float *gamma = fdata(c, p->gamma_in), *beta = fdata(c, p->beta_in), *bias = fdata(c, p->bias_in);
    float *y = c->out[0]->data, *mean = fout(c, p->mean_out), *inv = fout(c, p->inv_out), *sum = fout(c, p->sum_out);
    const int64_t n = p->n, rows = p->rows;
#pragma omp parallel for if (rows * n >= EW_PAR_MIN && rows > 1) num_threads(c->nthreads)
    for (int64_t r = 0; r < rows; r++) {
        struct norm_row row = {x + r * n, skip ? skip + (r % p->skip_rows) * n : NULL, bias, gamma, beta,
                               y + r * n, sum ? sum + r * n : NULL, mean ? mean + r : NULL, inv ? inv + r : NULL};
        norm_row_run(&row, n, p->eps, p->simplified);
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * EmbedLayerNormalization: layer norm of word + position (+ segment)
 * embeddings, and each sequence's count of mask ones as mask_index.
 *   inputs:  input_ids (B,S), segment_ids?, word_embedding (V,H),
 *            position_embedding (P,H), segment_embedding?, gamma (H),
 *            beta (H), mask? (B,S), position_ids? (B,S) or (1,S)
 *   outputs: output (B,S,H), mask_index (B) int32, embedding_sum? (B,S,H)
 * ------------------------------------------------------------------------ */

enum { EMB_IDS, EMB_SEG_IDS, EMB_WORD, EMB_POS, EMB_SEG, EMB_GAMMA, EMB_BETA, EMB_MASK, EMB_POS_IDS };

static int need_ids(struct op_call *c, int i, const char *what, int64_t b, int64_t s, int batch_may_be_1) {
    const struct tensor *t = in_opt(c, i);
    if (!t) return 0;
    if (t->dtype != DT_INT32 && t->dtype != DT_INT64) {
        op_error(c, "%s has dtype %s; it must be int32 or int64", what, dtype_name(t->dtype));
        return STATUS_UNSUPPORTED;
    }
    if (t->ndim != 2 || t->dims[1] != s || (t->dims[0] != b && !(batch_may_be_1 && t->dims[0] == 1)))
        return op_error(c, "%s must have input_ids' shape [%lld, %lld] (rank %d given)", what, (long long)b,
                        (long long)s, t->ndim);
    return 0;
}

static int need_table(struct op_call *c, int i, const char *what, int64_t h, int required) {
    int rc = need_f32_in(c, i, what, required);
    const struct tensor *t = in_opt(c, i);
    if (rc || !t) return rc;
    if (t->ndim != 2 || t->dims[1] != h)
        return op_error(c, "%s must be a 2-D table of rows of %lld (the hidden size)", what, (long long)h);
    return 0;
}

static int embed_infer(struct op_call *c) {
    const struct tensor *ids = in_opt(c, EMB_IDS), *word = in_opt(c, EMB_WORD);
    if (!ids || !word) return op_error(c, "input_ids and word_embedding are required");
    if (ids->ndim != 2) return op_error(c, "input_ids must be 2-D (batch, sequence), not rank %d", ids->ndim);
    int rc;
    if ((rc = need_f32_in(c, EMB_WORD, "word_embedding", 1))) return rc;
    if (word->ndim != 2) return op_error(c, "word_embedding must be 2-D (vocabulary, hidden)");
    int64_t b = ids->dims[0], s = ids->dims[1], h = word->dims[1];
    if ((rc = need_ids(c, EMB_IDS, "input_ids", b, s, 0)) || (rc = need_ids(c, EMB_SEG_IDS, "segment_ids", b, s, 0)) ||
        (rc = need_ids(c, EMB_MASK, "mask", b, s, 0)) || (rc = need_ids(c, EMB_POS_IDS, "position_ids", b, s, 1)) ||
        (rc = need_table(c, EMB_POS, "position_embedding", h, 1)) ||
        (rc = need_table(c, EMB_SEG, "segment_embedding", h, 0)) || (rc = need_f32_in(c, EMB_GAMMA, "gamma", 1)) ||
        (rc = need_vec(c, EMB_GAMMA, "gamma", h)) || (rc = need_f32_in(c, EMB_BETA, "beta", 0)) ||
        (rc = need_vec(c, EMB_BETA, "beta", h)))
        return rc;
    if (!in_opt(c, EMB_SEG_IDS) != !in_opt(c, EMB_SEG))
        return op_error(c, "segment_ids and segment_embedding come together (one of them is missing)");
    *c->out[0] = (struct tensor){DT_FP32, 3, {b, s, h}, NULL};
    if (c->nout > 1 && c->out[1]) *c->out[1] = (struct tensor){DT_INT32, 1, {b}, NULL};
    if (c->nout > 2 && c->out[2]) *c->out[2] = *c->out[0];
    return 0;
}

struct embed_params {
    int64_t b, s, h, vocab, npos, nseg;
    double eps;
};

static int embed_prepare(struct op_call *c, void **state, size_t *scratch) {
    const struct tensor *seg = in_opt(c, EMB_SEG);
    struct embed_params p = {c->in[EMB_IDS]->dims[0], c->in[EMB_IDS]->dims[1], c->in[EMB_WORD]->dims[1],
                             c->in[EMB_WORD]->dims[0], c->in[EMB_POS]->dims[0], seg ? seg->dims[0] : 0,
                             node_attr_float(c->node, "epsilon", 1e-12f)};
    if (p.eps < 0) return op_error(c, "epsilon must not be negative (got %g)", p.eps);
    return params_keep(c, &p, sizeof p, state);
}

/* The row of an embedding table that id selects; NULL (and the message)
 * when id is outside it. */
static const float *embed_row(struct op_call *c, const struct tensor *table, int64_t rows, int64_t h, int64_t id,
                              const char *what, int64_t bi, int64_t si) {
    if (id < 0 || id >= rows) {
        op_error(c, "%s %lld at [%lld, %lld] is out of range: the table has %lld rows", what, (long long)id,
                 (long long)bi, (long long)si, (long long)rows);
        return NULL;
    }
    return (const float *)table->data + id * h;
}

static int embed_run(struct op_call *c) {
    const struct embed_params *p = c->state;
    const struct tensor *ids = c->in[EMB_IDS], *seg_ids = in_opt(c, EMB_SEG_IDS), *pos_ids = in_opt(c, EMB_POS_IDS);
    const struct tensor *mask = in_opt(c, EMB_MASK);
    const float *gamma = c->in[EMB_GAMMA]->data, *beta = fdata(c, EMB_BETA);
    float *y = c->out[0]->data, *sum = fout(c, 2);
    struct tensor *mi = out_opt(c, 1);
    const int64_t h = p->h;
    for (int64_t bi = 0; bi < p->b; bi++)
        for (int64_t si = 0; si < p->s; si++) {
            int64_t e = bi * p->s + si;
            int64_t pid = pos_ids ? op_int_at(pos_ids, (pos_ids->dims[0] == 1 ? 0 : bi) * p->s + si) : si;
            const float *w = embed_row(c, c->in[EMB_WORD], p->vocab, h, op_int_at(ids, e), "input_ids value", bi, si);
            const float *pe = w ? embed_row(c, c->in[EMB_POS], p->npos, h, pid, "position", bi, si) : NULL;
            const float *se = pe && seg_ids
                                  ? embed_row(c, c->in[EMB_SEG], p->nseg, h, op_int_at(seg_ids, e), "segment_ids value", bi, si)
                                  : NULL;
            if (!pe || (seg_ids && !se)) return STATUS_INVALID;
            float *yr = y + e * h, *sr = sum ? sum + e * h : yr;
            for (int64_t j = 0; j < h; j++) sr[j] = w[j] + pe[j] + (se ? se[j] : 0.0f);
            struct norm_row row = {sr, NULL, NULL, gamma, beta, yr, NULL, NULL, NULL};
            norm_row_run(&row, h, p->eps, 0);
        }
    if (mi) {
        int32_t *m = mi->data;
        for (int64_t bi = 0; bi < p->b; bi++) {
            int32_t n = 0;
            for (int64_t si = 0; mask && si < p->s; si++) n += op_int_at(mask, bi * p->s + si) == 1;
            m[bi] = n;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * Bias and activation: f(x + bias) with bias over the last dim.
 *   Gelu (x), BiasGelu (x, bias), FastGelu (x, bias?) in tanh form,
 *   QuickGelu (x; alpha) = x * sigmoid(alpha x), BiasAdd (x, bias, skip),
 *   BiasSplitGelu (x, bias) = left * gelu(right) of x + bias split in half.
 * ------------------------------------------------------------------------ */

enum act_op { ACT_OP_GELU, ACT_OP_FAST_GELU, ACT_OP_QUICK_GELU, ACT_OP_BIAS_ADD, ACT_OP_SPLIT_GELU };

struct bias_act_params {
    enum act_op op;
    float alpha;
    int64_t n, c; /* elements of x, length of the last dim */
};

static enum act_op bias_act_op(const struct op_call *c) {
    const char *op = c->node->op_type;
    if (strcmp(op, "FastGelu") == 0) return ACT_OP_FAST_GELU;
    if (strcmp(op, "QuickGelu") == 0) return ACT_OP_QUICK_GELU;
    if (strcmp(op, "BiasAdd") == 0) return ACT_OP_BIAS_ADD;
    if (strcmp(op, "BiasSplitGelu") == 0) return ACT_OP_SPLIT_GELU;
    return ACT_OP_GELU; /* Gelu, BiasGelu */
}

static int bias_act_infer(struct op_call *c) {
    int rc;
    enum act_op op = bias_act_op(c);
    int bias_required = op == ACT_OP_BIAS_ADD || op == ACT_OP_SPLIT_GELU || strcmp(c->node->op_type, "BiasGelu") == 0;
    if ((rc = need_f32_in(c, 0, "X", 1)) || (rc = need_f32_in(c, 1, "bias", bias_required))) return rc;
    const struct tensor *x = c->in[0];
    if (x->ndim < 1) return op_error(c, "X must have rank >= 1");
    int64_t ch = x->dims[x->ndim - 1];
    if ((rc = need_vec(c, 1, "bias", ch))) return rc;
    like(c, c->out[0], x, DT_FP32);
    if (op == ACT_OP_BIAS_ADD) {
        if ((rc = need_f32_in(c, 2, "skip", 1))) return rc;
        char sx[128], ss[128];
        if (tensor_numel(c->in[2]) != tensor_numel(x) || c->in[2]->ndim != x->ndim)
            return op_error(c, "skip %s must have X's shape %s", tensor_shape_str(c->in[2], ss, sizeof ss),
                            tensor_shape_str(x, sx, sizeof sx));
    }
    if (op == ACT_OP_SPLIT_GELU) {
        if (ch % 2) return op_error(c, "the last dim of X (%lld) must be even to split in halves", (long long)ch);
        c->out[0]->dims[x->ndim - 1] = ch / 2;
    }
    return 0;
}

static int bias_act_prepare(struct op_call *c, void **state, size_t *scratch) {
    const struct tensor *x = c->in[0];
    struct bias_act_params p = {bias_act_op(c), node_attr_float(c->node, "alpha", 1.702f), tensor_numel(x),
                                x->ndim ? x->dims[x->ndim - 1] : 1};
    return params_keep(c, &p, sizeof p, state);
}

/* One row of f(x + bias [+ skip]), the op's switch outside the loops so
 * that each vectorizes, on the branch-free erf and exp of
 * elementwise_util.h (libm's erff, tanhf and expf are opaque calls, and
 * the per-value switch kept the whole loop scalar). FastGelu's tanh form as
 * x / (1 + e^-2u), QuickGelu's x * sigmoid(a x) as x / (1 + e^-ax). Built
 * per ISA like ops_elementwise.c's activations. */
#define BIAS_ACT_ROW(NAME)                                                                                  \
    static void NAME(enum act_op op, float alpha, const float *x, const float *b, const float *skip, float *y, \
                     int64_t n) {                                                                           \
        switch (op) {                                                                                       \
        case ACT_OP_GELU:                                                                                   \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                                           \
                const float v = x[i] + (b ? b[i] : 0.0f);                                                   \
                y[i] = 0.5f * v * (1.0f + ew_erf_f(v * 0.70710678118654752f));                             \
            }                                                                                               \
            return;                                                                                         \
        case ACT_OP_FAST_GELU:                                                                              \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                                           \
                const float v = x[i] + (b ? b[i] : 0.0f);                                                   \
                y[i] = v / (1.0f + ew_exp_f(-1.5957691216057307f * (v + 0.044715f * v * v * v)));           \
            }                                                                                               \
            return;                                                                                         \
        case ACT_OP_QUICK_GELU:                                                                             \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                                           \
                const float v = x[i] + (b ? b[i] : 0.0f);                                                   \
                y[i] = v / (1.0f + ew_exp_f(-alpha * v));                                                   \
            }                                                                                               \
            return;                                                                                         \
        case ACT_OP_BIAS_ADD:                                                                               \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++) y[i] = x[i] + b[i] + skip[i];               \
            return;                                                                                         \
        case ACT_OP_SPLIT_GELU: return;                                                                     \
        }                                                                                                   \
    }
BIAS_ACT_ROW(bias_act_row_v2)
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("arch=x86-64-v4"))) BIAS_ACT_ROW(bias_act_row_v4)
__attribute__((target("arch=x86-64-v3"))) BIAS_ACT_ROW(bias_act_row_v3)
#endif

typedef void (*bias_act_row_fn)(enum act_op op, float alpha, const float *x, const float *b, const float *skip,
                                float *y, int64_t n);

#if defined(__x86_64__) && defined(__GNUC__)
/* GELU's two forms and QuickGelu on sigmoid_vec.h's AVX-512 and AVX2 loops. */
static void bias_act_row_vec(enum act_op op, float alpha, const float *x, const float *b, const float *skip, float *y,
                             int64_t n) {
    if (op == ACT_OP_GELU) sigmoid_vec(SIGV_GELU_ERF, 1.0f, x, b, y, n);
    else if (op == ACT_OP_FAST_GELU) sigmoid_vec(SIGV_GELU_TANH, 1.0f, x, b, y, n);
    else if (op == ACT_OP_QUICK_GELU) sigmoid_vec(SIGV_SWISH, alpha, x, b, y, n);
    else (dnnl_util_isa_level() >= 4 ? bias_act_row_v4 : bias_act_row_v3)(op, alpha, x, b, skip, y, n);
}
#endif

static int bias_act_run(struct op_call *c) {
    const struct bias_act_params *p = c->state;
    const float *x = c->in[0]->data, *b = fdata(c, 1);
    float *y = c->out[0]->data;
    const int64_t n = p->n, ch = p->c;
    if (n <= 0 || ch <= 0) return 0;
    bias_act_row_fn row = bias_act_row_v2;
#if defined(__x86_64__) && defined(__GNUC__)
    const int level = dnnl_util_isa_level();
    row = level >= 3 ? bias_act_row_vec : bias_act_row_v2;
#endif
    const int64_t rows = n / ch;
    if (p->op == ACT_OP_SPLIT_GELU) { /* left * gelu(right) of x + bias split in half, 1024 values at a time */
        const int64_t half = ch / 2;
        float buf[1024];
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j0 = 0; j0 < half; j0 += 1024) {
                const int64_t len = half - j0 < 1024 ? half - j0 : 1024;
                const float *xl = x + r * ch + j0, *bl = b ? b + j0 : NULL;
                row(ACT_OP_GELU, 0.0f, xl + half, b ? bl + half : NULL, NULL, buf, len);
                float *yr = y + r * half + j0;
                for (int64_t j = 0; j < len; j++) yr[j] = (xl[j] + (bl ? bl[j] : 0.0f)) * buf[j];
            }
        return 0;
    }
    const float *skip = p->op == ACT_OP_BIAS_ADD ? c->in[2]->data : NULL;
    PAR_FOR(n >= EW_PAR_MIN && rows > 1, c->nthreads, ,
            for (int64_t r = 0; r < rows; r++)
                row(p->op, p->alpha, x + r * ch, b, skip ? skip + r * ch : NULL, y + r * ch, ch););
    return 0;
}

/* ------------------------------------------------------------------------
 * FusedConv (X, W, B?, Z?; Conv's attributes, activation,
 * activation_params) and FusedGemm (Gemm's inputs and attributes,
 * activation, activation_alpha, activation_beta): the standard Conv or
 * Gemm kernel, then + Z (FusedConv) and the activation.
 * ------------------------------------------------------------------------ */

struct fused_state {
    const struct op_def *base;
    void *base_state;
    enum act_kind act;
    float a, b;
};

static const struct op_def *fused_base(const struct op_call *c) {
    return op_find("", strcmp(c->node->op_type, "FusedConv") == 0 ? "Conv" : "Gemm");
}

/* The base op's call: Conv's or Gemm's inputs (FusedConv's Z left out). */
static struct op_call fused_sub(const struct op_call *c) {
    struct op_call sub = *c;
    if (strcmp(c->node->op_type, "FusedConv") == 0 && sub.nin > 3) sub.nin = 3;
    return sub;
}

static int fused_activation(struct op_call *c, struct fused_state *st) {
    const char *name = node_attr_str(c->node, "activation", "");
    const float *p = NULL;
    int np = node_attr_floats(c->node, "activation_params", &p);
    float a0 = np > 0 ? p[0] : node_attr_float(c->node, "activation_alpha", NAN);
    float b0 = np > 1 ? p[1] : node_attr_float(c->node, "activation_beta", NAN);
    static const struct {
        const char *name;
        enum act_kind act;
        float a, b; /* defaults */
    } acts[] = {
        {"", ACT_NONE, 0, 0},
        {"Relu", ACT_RELU, 0, 0},
        {"Tanh", ACT_TANH, 0, 0},
        {"Sigmoid", ACT_SIGMOID, 0, 0},
        {"LeakyRelu", ACT_LEAKY_RELU, 0.01f, 0},
        {"Clip", ACT_CLIP, -FLT_MAX, FLT_MAX},
        {"HardSigmoid", ACT_HARD_SIGMOID, 0.2f, 0.5f},
    };
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++)
        if (strcmp(name, acts[i].name) == 0) {
            st->act = acts[i].act;
            st->a = isnan(a0) ? acts[i].a : a0;
            st->b = isnan(b0) ? acts[i].b : b0;
            return 0;
        }
    op_error(c, "activation '%s' is not supported (Relu, Tanh, Sigmoid, LeakyRelu, Clip, HardSigmoid are)", name);
    return STATUS_UNSUPPORTED;
}

static int fused_infer(struct op_call *c) {
    const struct op_def *base = fused_base(c);
    struct op_call sub = fused_sub(c);
    int rc = base->infer(&sub);
    if (rc) return rc;
    const struct tensor *z = sub.nin < c->nin ? in_opt(c, 3) : NULL;
    if (z) {
        char sz[128], sy[128];
        if (z->dtype != DT_FP32 || z->ndim != c->out[0]->ndim || tensor_numel(z) != tensor_numel(c->out[0]))
            return op_error(c, "Z %s must be float32 with the output's shape %s", tensor_shape_str(z, sz, sizeof sz),
                            tensor_shape_str(c->out[0], sy, sizeof sy));
    }
    struct fused_state st;
    return fused_activation(c, &st);
}

static void fused_release(void *state) {
    struct fused_state *st = state;
    if (!st) return;
    if (st->base->release) st->base->release(st->base_state);
    free(st);
}

static int fused_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct fused_state *st = op_params_alloc(c, sizeof *st);
    if (!st) return STATUS_NOMEM;
    st->base = fused_base(c);
    struct op_call sub = fused_sub(c);
    int rc = fused_activation(c, st);
    if (!rc && st->base->prepare) rc = st->base->prepare(&sub, &st->base_state, scratch);
    if (rc) {
        free(st);
        return rc;
    }
    *state = st;
    return 0;
}

static int fused_run(struct op_call *c) {
    const struct fused_state *st = c->state;
    struct op_call sub = fused_sub(c);
    sub.state = st->base_state;
    int rc = st->base->run(&sub);
    if (rc) return rc;
    const struct tensor *z = sub.nin < c->nin ? in_opt(c, 3) : NULL;
    float *y = c->out[0]->data;
    const float *zd = z ? z->data : NULL;
    const int64_t n = tensor_numel(c->out[0]);
    const enum act_kind act = st->act;
    const float a = st->a, b = st->b;
    if (zd) {
#pragma omp parallel for simd if (n >= EW_PAR_MIN) num_threads(c->nthreads)
        for (int64_t i = 0; i < n; i++) y[i] += zd[i];
    }
    ew_act_f32(y, n, act, a, b);
    return 0;
}

/* ------------------------------------------------------------------------
 * The table
 * ------------------------------------------------------------------------ */

#define MS "com.microsoft"
#define NORM(NAME, DOMAIN) {NAME, DOMAIN, norm_infer, norm_prepare, norm_run, op_params_free, 0}
#define BIAS_ACT(NAME) {NAME, MS, bias_act_infer, bias_act_prepare, bias_act_run, op_params_free, 0}

const struct op_def op_defs_contrib[] = {
    NORM("SkipLayerNormalization", MS),
    NORM("SkipSimplifiedLayerNormalization", MS),
    NORM("SimplifiedLayerNormalization", ""),
    NORM("SimplifiedLayerNormalization", MS),
    {"EmbedLayerNormalization", MS, embed_infer, embed_prepare, embed_run, op_params_free, 0},
    BIAS_ACT("Gelu"),
    BIAS_ACT("BiasGelu"),
    BIAS_ACT("FastGelu"),
    BIAS_ACT("QuickGelu"),
    BIAS_ACT("BiasAdd"),
    BIAS_ACT("BiasSplitGelu"),
    {"FusedConv", MS, fused_infer, fused_prepare, fused_run, fused_release, 0},
    {"FusedGemm", MS, fused_infer, fused_prepare, fused_run, fused_release, 0},
    {0},
};
