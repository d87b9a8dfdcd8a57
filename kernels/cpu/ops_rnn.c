/* ops_rnn.c - the recurrent family: RNN, GRU and LSTM (opsets 7 to 22),
 * with every attribute ONNX defines: direction (forward, reverse,
 * bidirectional), sequence_lens, initial_h (and initial_c, peepholes P and
 * input_forget for LSTM), activations with their alphas and betas, clip,
 * linear_before_reset (GRU), layout 0 and 1, and any subset of the outputs
 * Y, Y_h (and Y_c).
 *
 * One direction runs as one GEMM for the input projections of every time
 * step (X as [rows, input_size] times W^T, with the biases added in: a
 * oneDNN matmul on W^T packed in prepare when W is constant, as exporters
 * write it, else sgemm), then per step one product of the hidden state by
 * R^T and the gate arithmetic per batch row. R^T is packed once in prepare
 * when R is constant, not at every run. The per-step product of a few rows
 * is kiln's own vector loop (cpu_gemv, gemv.c) rather than sgemm: at one to four
 * rows a call into sgemm costs more than the product itself, and a
 * sequence makes one call per step. The two directions of a bidirectional
 * node run on a thread each when the node has two. Layout 1 only renames
 * the rows (batch-major instead of time-major), so no operand is
 * transposed. A batch row whose sequence is shorter than the longest stops
 * updating its state there; the reverse direction walks each row from its
 * own last step back to its first, and Y holds zeros past a row's length,
 * as onnxruntime does (and Y_h, Y_c of a row of length 0).
 *
 * DynamicQuantizeLSTM (com.microsoft, onnxruntime's dynamically quantized
 * LSTM) runs the same steps with both products in 8 bits, as onnxruntime
 * computes them: W [D, I, 4H] and R [D, H, 4H] (uint8 or int8, a scale and
 * zero point per direction or per column) on the exact 8-bit GEMM of
 * qgemm.c, built at prepare; the left operand (all of X for the
 * projection, the hidden state of every batch row at each step) quantized
 * to uint8 over its own range (DynamicQuantizeLinear's rule) at each call;
 * the int32 sums scaled by x_scale * w_scale into float. The gates are the
 * LSTM's.
 *
 * Everything else computes in float32. */
/* The activations' loops hold selects (tanh's two ranges, exp's clamps)
 * that GCC if-converts only when no floating-point operation may trap. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math", "no-math-errno")
#endif

#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define RNN_X86 1
#endif

#include <oneapi/dnnl/dnnl.h>

#include "common/log.h"
#include "kernels/cpu/dnnl_util.h"
#include "kernels/cpu/elementwise_util.h"
#include "kernels/cpu/gemv.h"
#include "kernels/cpu/matmul_util.h"
#include "kernels/ops.h"

/* ---- activations -------------------------------------------------------- */

enum rnn_fn {
    RNN_FN_RELU,
    RNN_FN_TANH,
    RNN_FN_SIGMOID,
    RNN_FN_AFFINE,
    RNN_FN_LEAKY_RELU,
    RNN_FN_THRESHOLDED_RELU,
    RNN_FN_SCALED_TANH,
    RNN_FN_HARD_SIGMOID,
    RNN_FN_ELU,
    RNN_FN_SOFTSIGN,
    RNN_FN_SOFTPLUS,
};

struct rnn_act {
    enum rnn_fn fn;
    float alpha, beta;
};

/* The activations ONNX lists for its recurrent ops. An activation that
 * takes alpha (beta) consumes the next value of activation_alpha
 * (activation_beta); the others consume none, so the lists pair with the
 * activations that use them, in order. */
static const struct rnn_fn_def {
    const char *name;
    enum rnn_fn fn;
    int uses_alpha, uses_beta;
    float alpha, beta; /* defaults, as the ops of the same name have them */
} g_rnn_fns[] = {
    {"Relu", RNN_FN_RELU, 0, 0, 0, 0},
    {"Tanh", RNN_FN_TANH, 0, 0, 0, 0},
    {"Sigmoid", RNN_FN_SIGMOID, 0, 0, 0, 0},
    {"Affine", RNN_FN_AFFINE, 1, 1, 1.0f, 0.0f},
    {"LeakyRelu", RNN_FN_LEAKY_RELU, 1, 0, 0.01f, 0},
    {"ThresholdedRelu", RNN_FN_THRESHOLDED_RELU, 1, 0, 1.0f, 0},
    {"ScaledTanh", RNN_FN_SCALED_TANH, 1, 1, 1.0f, 1.0f},
    {"HardSigmoid", RNN_FN_HARD_SIGMOID, 1, 1, 0.2f, 0.5f},
    {"Elu", RNN_FN_ELU, 1, 0, 1.0f, 0},
    {"Softsign", RNN_FN_SOFTSIGN, 0, 0, 0, 0},
    {"Softplus", RNN_FN_SOFTPLUS, 0, 0, 0, 0},
};

/* x[i] = expr(v) for each v = x[i]; `omp simd` because GCC's -O2 leaves
 * such loops scalar (those that call libm stay so anyway). */
#define RNN_MAP(expr)                                                      \
    do {                                                                   \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {              \
            float v = x[i];                                                \
            x[i] = (expr);                                                 \
        }                                                                  \
    } while (0)

/* Applies an activation to n floats in place; the switch sits outside the
 * loops so that each loop vectorizes. */
static void rnn_act_apply(const struct rnn_act *a, float *x, int64_t n) {
    float al = a->alpha, be = a->beta;
    switch (a->fn) {
    case RNN_FN_RELU: RNN_MAP(v > 0 ? v : 0); break;
    case RNN_FN_TANH: RNN_MAP(ew_tanh_f(v)); break;
    case RNN_FN_SIGMOID: RNN_MAP(ew_sigmoid_f(v)); break;
    case RNN_FN_AFFINE: RNN_MAP(al * v + be); break;
    case RNN_FN_LEAKY_RELU: RNN_MAP(v >= 0 ? v : al * v); break;
    case RNN_FN_THRESHOLDED_RELU: RNN_MAP(v > al ? v : 0); break;
    case RNN_FN_SCALED_TANH: RNN_MAP(al * ew_tanh_f(be * v)); break;
    case RNN_FN_HARD_SIGMOID: RNN_MAP(al * v + be < 0 ? 0 : (al * v + be > 1 ? 1 : al * v + be)); break;
    case RNN_FN_ELU: RNN_MAP(v >= 0 ? v : al * (ew_exp_f(v) - 1.0f)); break;
    case RNN_FN_SOFTSIGN: RNN_MAP(v / (1.0f + fabsf(v))); break;
    case RNN_FN_SOFTPLUS: /* libm's log1pf: no simd request that clang would report unmet */
        for (int64_t i = 0; i < n; i++) x[i] = log1pf(ew_exp_f(x[i]));
        break;
    }
}

/* Bounds n floats to [-clip, clip] (clip > 0), before an activation. */
static void rnn_clip(float *x, int64_t n, float clip) {
    if (clip <= 0) return;
    RNN_MAP(v < -clip ? -clip : (v > clip ? clip : v));
}

/* ---- parameters ------------------------------------------------------- */

enum rnn_kind { RNN_KIND_RNN, RNN_KIND_GRU, RNN_KIND_LSTM };

/* Inputs by position, the same for the three ops up to initial_h. */
enum { RNN_X, RNN_W, RNN_R, RNN_B, RNN_SEQ, RNN_H0, RNN_C0, RNN_P };
enum { RNN_Y, RNN_YH, RNN_YC };

#define RNN_MAX_FNS 3 /* activations per direction: f, g, h */

/* Attributes and shapes of one node, decoded once. */
struct rnn_params {
    enum rnn_kind kind;
    int ngates;       /* gates per direction: 1 (RNN), 3 (GRU: z r h), 4 (LSTM: i o f c) */
    int nfns;         /* activations per direction */
    int ndir;         /* 1 or 2 */
    int reverse;      /* the single direction runs backwards */
    int layout;       /* 0: [seq, batch, ...], 1: [batch, seq, ...] */
    float clip;       /* 0 when absent */
    int input_forget; /* LSTM: f = 1 - i */
    int lbr;          /* GRU: linear_before_reset */
    struct rnn_act act[2][RNN_MAX_FNS];
    int64_t seq, batch, in_size, hidden;
    int fused; /* the default activations, no clip or peepholes: rnn_fused_cell */
    int64_t split; /* > 0: each step shared by two threads, hidden units [0, split) and [split, H) (rnn_split_at) */
    int proj_threads;                /* threads of the input projection (RNN_PROJ_MACS_THREADS) */
    struct cpu_mm_state *proj[2];    /* per direction: X W^T + bias on W packed at prepare, when W is constant */
    size_t proj_scratch;             /* bytes of scratch each projection's primitive needs */
    float *rt; /* [ndir][G*H * H]: R^T packed in prepare (rnn_pack_r) when R is constant (owned), else NULL */
    int quant;                       /* DynamicQuantizeLSTM: W and R 8-bit, products on qw and qr */
    struct cpu_qgemm qw[2], qr[2];   /* per direction: X W and h R (qgemm.c) */
    size_t q_scratch;                /* bytes of scratch the larger of them needs */
};

static const struct rnn_fn_def *rnn_fn_find(const char *name) {
    for (size_t i = 0; i < sizeof g_rnn_fns / sizeof g_rnn_fns[0]; i++)
        if (strcasecmp(g_rnn_fns[i].name, name) == 0) return &g_rnn_fns[i];
    return NULL;
}

/* activations (with activation_alpha and activation_beta) into p->act. An
 * absent list takes the op's defaults. ONNX asks a bidirectional op for
 * both directions' lists; one direction's list (onnxruntime refuses it)
 * is taken to serve both, alphas and betas included. */
static int rnn_decode_acts(struct op_call *c, struct rnn_params *p) {
    static const char *const defaults[3][RNN_MAX_FNS] = {
        {"Tanh"}, {"Sigmoid", "Tanh"}, {"Sigmoid", "Tanh", "Tanh"}};
    const struct graph_attr *acts = node_attr(c->node, "activations");
    const float *alphas = NULL, *betas = NULL;
    int nalpha = node_attr_floats(c->node, "activation_alpha", &alphas);
    int nbeta = node_attr_floats(c->node, "activation_beta", &betas);
    int n = acts ? acts->n : 0, ia = 0, ib = 0;
    if (acts && (acts->type != ATTR_STRINGS || (n != p->nfns && n != p->nfns * p->ndir)))
        return op_error(c, "activations has %d names; expected %d per direction", n, p->nfns);
    int listed = acts && n == p->nfns * p->ndir ? p->ndir : 1;
    for (int d = 0; d < listed; d++)
        for (int k = 0; k < p->nfns; k++) {
            const char *name = acts ? acts->strings[d * p->nfns + k] : defaults[p->kind][k];
            const struct rnn_fn_def *f = rnn_fn_find(name);
            if (!f) return op_error(c, "unknown activation '%s'", name);
            struct rnn_act *a = &p->act[d][k];
            a->fn = f->fn;
            a->alpha = f->uses_alpha && ia < nalpha ? alphas[ia++] : f->alpha;
            a->beta = f->uses_beta && ib < nbeta ? betas[ib++] : f->beta;
        }
    if (listed < p->ndir) memcpy(p->act[1], p->act[0], sizeof p->act[0]);
    return 0;
}

static int rnn_decode_attrs(struct op_call *c, enum rnn_kind kind, struct rnn_params *p) {
    static const int ngates[] = {1, 3, 4}, nfns[] = {1, 2, 3}; /* by enum rnn_kind */
    p->kind = kind;
    p->ngates = ngates[kind];
    p->nfns = nfns[kind];
    const char *dir = node_attr_str(c->node, "direction", "forward");
    if (!strcmp(dir, "bidirectional")) p->ndir = 2;
    else if (!strcmp(dir, "forward") || !strcmp(dir, "reverse")) p->ndir = 1;
    else return op_error(c, "unknown direction '%s'", dir);
    p->reverse = !strcmp(dir, "reverse");
    p->layout = c->node->opset >= 14 ? (int)node_attr_int(c->node, "layout", 0) : 0;
    if (p->layout != 0 && p->layout != 1) return op_error(c, "layout must be 0 or 1 (got %d)", p->layout);
    p->clip = node_attr(c->node, "clip") ? node_attr_float(c->node, "clip", 0) : 0;
    if (node_attr(c->node, "clip") && !(p->clip > 0)) return op_error(c, "clip must be positive (got %g)", p->clip);
    p->input_forget = kind == RNN_KIND_LSTM && node_attr_int(c->node, "input_forget", 0) != 0;
    p->lbr = kind == RNN_KIND_GRU && node_attr_int(c->node, "linear_before_reset", 0) != 0;
    return rnn_decode_acts(c, p);
}

static const struct tensor *rnn_in(const struct op_call *c, int i) { return i < c->nin ? c->in[i] : NULL; }

/* Checks that input i, when present, is float32 (q8: uint8 or int8) of
 * the given shape. */
static int rnn_check_typed(struct op_call *c, int i, const char *what, int ndim, const int64_t *dims, int q8) {
    const struct tensor *t = rnn_in(c, i);
    if (!t) return 0;
    if (q8 && !cpu_is_q8(t->dtype)) {
        op_error(c, "%s must be uint8 or int8 (got %s)", what, dtype_name(t->dtype));
        return STATUS_UNSUPPORTED;
    }
    if (!q8 && t->dtype != DT_FP32) {
        op_error(c, "%s must be float32 (got %s): kiln's recurrent ops compute in float32 only", what,
                 dtype_name(t->dtype));
        return STATUS_UNSUPPORTED;
    }
    int ok = t->ndim == ndim;
    for (int k = 0; ok && k < ndim; k++) ok = t->dims[k] == dims[k];
    if (ok) return 0;
    char got[128], want[128];
    struct tensor e = {.dtype = DT_FP32, .ndim = ndim};
    memcpy(e.dims, dims, sizeof(int64_t) * (size_t)ndim);
    return op_error(c, "%s has shape %s; expected %s", what, tensor_shape_str(t, got, sizeof got),
                    tensor_shape_str(&e, want, sizeof want));
}

static int rnn_check_input(struct op_call *c, int i, const char *what, int ndim, const int64_t *dims) {
    return rnn_check_typed(c, i, what, ndim, dims, 0);
}

/* DynamicQuantizeLSTM's scales and zero points (inputs 8 to 11): float32
 * scales and zero points of W's (R's) type, [D] or [D, 4H], all four
 * given. */
enum { RNN_W_SCALE = 8, RNN_W_ZP, RNN_R_SCALE, RNN_R_ZP };
static int rnn_check_qparams(struct op_call *c, const struct rnn_params *p) {
    static const char *const names[4] = {"W_scale", "W_zero_point", "R_scale", "R_zero_point"};
    const int64_t D = p->ndir, GH = p->ngates * p->hidden;
    for (int k = 0; k < 4; k++) {
        const struct tensor *t = rnn_in(c, RNN_W_SCALE + k), *of = c->in[k < 2 ? RNN_W : RNN_R];
        if (!t) return op_error(c, "%s is required", names[k]);
        if (k % 2 == 0 && t->dtype != DT_FP32)
            return op_error(c, "%s must be float32 (got %s)", names[k], dtype_name(t->dtype)), STATUS_UNSUPPORTED;
        if (k % 2 && t->dtype != of->dtype)
            return op_error(c, "%s must have %s's type %s (got %s)", names[k], k < 2 ? "W" : "R", dtype_name(of->dtype),
                            dtype_name(t->dtype)), STATUS_UNSUPPORTED;
        if (!((t->ndim == 1 && t->dims[0] == D) || (t->ndim == 2 && t->dims[0] == D && t->dims[1] == GH)))
            return op_error(c, "%s must have shape [%lld] or [%lld, %lld]", names[k], (long long)D, (long long)D,
                            (long long)GH);
    }
    return 0;
}

/* The sizes, from X and R, checked against every other input. */
static int rnn_decode_shapes(struct op_call *c, struct rnn_params *p) {
    const struct tensor *x = c->in[RNN_X], *w = c->in[RNN_W], *r = c->in[RNN_R];
    if (!x || !w || !r) return op_error(c, "X, W and R are required");
    if (x->ndim != 3 || r->ndim != 3) return op_error(c, "X and R must have 3 dims");
    p->seq = x->dims[p->layout ? 1 : 0];
    p->batch = x->dims[p->layout ? 0 : 1];
    p->in_size = x->dims[2];
    p->hidden = r->dims[p->quant ? 1 : 2];
    int64_t hs = node_attr_int(c->node, "hidden_size", p->hidden);
    if (hs != p->hidden) return op_error(c, "hidden_size is %lld but R's last dim is %lld", (long long)hs, (long long)p->hidden);
    int64_t D = p->ndir, G = p->ngates, H = p->hidden, Bt = p->batch;
    const int64_t xd[3] = {x->dims[0], x->dims[1], p->in_size}, wd[3] = {D, G * H, p->in_size},
                  rd[3] = {D, G * H, H}, bd[2] = {D, 2 * G * H}, pd[2] = {D, 3 * H};
    /* DynamicQuantizeLSTM's W and R are stored transposed: [D, I, 4H], [D, H, 4H]. */
    const int64_t wqd[3] = {D, p->in_size, G * H}, rqd[3] = {D, H, G * H};
    const int64_t hd[3] = {p->layout ? Bt : D, p->layout ? D : Bt, H};
    int rc;
    if ((rc = rnn_check_input(c, RNN_X, "X", 3, xd)) ||
        (rc = rnn_check_typed(c, RNN_W, "W", 3, p->quant ? wqd : wd, p->quant)) ||
        (rc = rnn_check_typed(c, RNN_R, "R", 3, p->quant ? rqd : rd, p->quant)) ||
        (p->quant && (rc = rnn_check_qparams(c, p))) || (rc = rnn_check_input(c, RNN_B, "B", 2, bd)) ||
        (rc = rnn_check_input(c, RNN_H0, "initial_h", 3, hd)))
        return rc;
    if (p->kind == RNN_KIND_LSTM &&
        ((rc = rnn_check_input(c, RNN_C0, "initial_c", 3, hd)) || (rc = rnn_check_input(c, RNN_P, "P", 2, pd))))
        return rc;
    const struct tensor *sl = rnn_in(c, RNN_SEQ);
    if (sl && (sl->dtype != DT_INT32 && sl->dtype != DT_INT64))
        return op_error(c, "sequence_lens must be int32 (got %s)", dtype_name(sl->dtype));
    if (sl && (sl->ndim != 1 || sl->dims[0] != Bt))
        return op_error(c, "sequence_lens must have one length per batch row (%lld)", (long long)Bt);
    return 0;
}

static int rnn_decode(struct op_call *c, enum rnn_kind kind, struct rnn_params *p) {
    int rc = rnn_decode_attrs(c, kind, p);
    return rc ? rc : rnn_decode_shapes(c, p);
}

/* ---- shapes ------------------------------------------------------------- */

static void rnn_set_out(struct op_call *c, int i, int ndim, const int64_t *dims) {
    struct tensor *t = i < c->nout ? c->out[i] : NULL;
    if (!t) return;
    t->dtype = DT_FP32;
    t->ndim = ndim;
    for (int k = 0; k < ndim; k++) t->dims[k] = dims[k];
}

static int rnn_infer(struct op_call *c, enum rnn_kind kind, int quant) {
    struct rnn_params p;
    memset(&p, 0, sizeof p);
    p.quant = quant;
    int rc = rnn_decode(c, kind, &p);
    if (rc) return rc;
    int64_t T = p.seq, D = p.ndir, Bt = p.batch, H = p.hidden;
    const int64_t y0[4] = {T, D, Bt, H}, y1[4] = {Bt, T, D, H}, h0[3] = {D, Bt, H}, h1[3] = {Bt, D, H};
    rnn_set_out(c, RNN_Y, 4, p.layout ? y1 : y0);
    rnn_set_out(c, RNN_YH, 3, p.layout ? h1 : h0);
    if (kind == RNN_KIND_LSTM) rnn_set_out(c, RNN_YC, 3, p.layout ? h1 : h0);
    return 0;
}
static int rnn_infer_rnn(struct op_call *c) { return rnn_infer(c, RNN_KIND_RNN, 0); }
static int gru_infer(struct op_call *c) { return rnn_infer(c, RNN_KIND_GRU, 0); }
static int lstm_infer(struct op_call *c) { return rnn_infer(c, RNN_KIND_LSTM, 0); }
static int dqlstm_infer(struct op_call *c) { return rnn_infer(c, RNN_KIND_LSTM, 1); }

/* ---- the per-step product ---------------------------------------------- */

/* C[M,N] (row stride ldc) = A[M,K] (row stride lda) * op(B), plus beta * C;
 * op(B) is B^T of B [N,K] when transb is 'T', B [K,N] itself when 'N'
 * (row stride ldb either way). */
static int rnn_gemm(struct op_call *c, char transb, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                    const float *b, int64_t ldb, float beta, float *out, int64_t ldc) {
    if (m == 0 || n == 0) return 0;
    if (k == 0) {
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) out[i * ldc + j] *= beta;
        return 0;
    }
    DNNL_CHECK(dnnl_sgemm('N', transb, m, n, k, 1.0f, a, lda, b, ldb, beta, out, ldc));
    return 0;
}

/* A batch of up to this many rows takes cpu_gemv per row at each step, R^T
 * packed in panels (below); a larger one takes one sgemm per step over R^T
 * laid out plainly, whose own packing then pays for itself. */
#define RNN_GEMV_MAX_ROWS 4

/* Packed R^T: the columns of a segment (one for all gates, or GRU's z and
 * r apart from h when h's product waits for r) packed for cpu_gemv
 * (gemv.h) on their own. A segment starting at column c0 starts at c0 * H
 * in both layouts' sizes. */

static int rnn_packed(const struct rnn_params *p) { return p->batch <= RNN_GEMV_MAX_ROWS; }

/* Columns [c0, c1) of R [G*H, H] (R^T's columns) into dst in the layout
 * the per-step product reads: packed panels, or plain rows of stride G*H. */
static void rnn_pack_segment(const struct rnn_params *p, const float *r, int64_t c0, int64_t c1, float *dst) {
    int64_t H = p->hidden, GH = p->ngates * H;
    if (!rnn_packed(p)) {
        for (int64_t q = c0; q < c1; q++)
            for (int64_t j = 0; j < H; j++) dst[j * GH + q] = r[q * H + j];
        return;
    }
    cpu_gemv_pack(r + c0 * H, H, c1 - c0, 1, H, dst + c0 * H);
}

/* GRU without linear_before_reset multiplies h's gate by r * h, known only
 * after z and r: its columns are a segment of their own. */
static int rnn_gru_split(const struct rnn_params *p) { return p->kind == RNN_KIND_GRU && !p->lbr; }

/* One direction's R [G*H, H] into rt, R^T as the per-step products read it
 * (p->split: rnn_pack_shared instead). */
static void rnn_pack_r(const struct rnn_params *p, const float *r, float *rt) {
    int64_t H = p->hidden, GH = p->ngates * H;
    if (rnn_gru_split(p)) {
        rnn_pack_segment(p, r, 0, 2 * H, rt);
        rnn_pack_segment(p, r, 2 * H, GH, rt);
    } else {
        rnn_pack_segment(p, r, 0, GH, rt);
    }
}

/* ---- a step shared by two threads --------------------------------------- */

/* A single direction's step is a chain: each step's product needs the whole
 * hidden state of the step before. What two threads can share is each
 * step itself, split by hidden units: thread t multiplies h by R^T's
 * columns of its units in every gate (one packed segment: rnn_pack_shared)
 * and runs those units' cells, into the other of two state buffers (the
 * other thread may still read the old state); a step starts once both
 * shares of the one before are done (rnn_steps_shared).
 * Unidirectional LSTM and GRU of one to RNN_GEMV_MAX_ROWS rows with the
 * fused cell, R constant, from RNN_SPLIT_MIN_HIDDEN units: lstm_tagger (128
 * units, 64 steps) ran at 3.6 us a step on one thread of an AMD EPYC, where
 * handing a step over costs about a tenth of that. */
#define RNN_SPLIT_MIN_HIDDEN 128

/* The first unit of the second thread's share, or 0 when steps are not
 * shared. */
static int64_t rnn_split_at(const struct op_call *c, const struct rnn_params *p) {
    if (!p->fused || p->quant || p->ndir != 1 || !rnn_packed(p) || c->nthreads < 2 ||
        p->hidden < RNN_SPLIT_MIN_HIDDEN)
        return 0;
    return (p->hidden / 2 + 7) / 8 * 8;
}

/* R [G*H, H] into rt as the two threads' segments: units [0, split) of
 * every gate (R's rows g * H + j), then units [split, H), each packed as
 * one matrix of G * units columns. -1 when out of memory. */
static int rnn_pack_shared(const struct rnn_params *p, const float *r, float *rt) {
    const int64_t H = p->hidden;
    float *rows = malloc(sizeof(float) * (size_t)(p->ngates * H * H));
    if (!rows) return -1;
    for (int t = 0; t < 2; t++) {
        const int64_t j0 = t ? p->split : 0, n = (t ? H : p->split) - j0;
        for (int g = 0; g < p->ngates; g++)
            memcpy(rows + g * n * H, r + (g * H + j0) * H, sizeof(float) * (size_t)(n * H));
        cpu_gemv_pack(rows, H, n * p->ngates, 1, H, rt + j0 * p->ngates * H);
    }
    free(rows);
    return 0;
}

/* gh[:, c0, c0 + n) (row stride G*H) = h [batch, H] times R^T's columns
 * [c0, c0 + n), a segment of rt (rnn_pack_r). */
static int rnn_step_product(struct op_call *c, const struct rnn_params *p, const float *h, const float *rt,
                            int64_t c0, int64_t n, float *gh) {
    int64_t H = p->hidden, GH = p->ngates * H;
    if (!rnn_packed(p)) return rnn_gemm(c, 'N', p->batch, n, H, h, H, rt + c0, GH, 0.0f, gh + c0, GH);
    for (int64_t b = 0; b < p->batch; b++) cpu_gemv(h + b * H, H, rt + c0 * H, n, gh + b * GH + c0);
    return 0;
}

/* ---- scratch ------------------------------------------------------------ */

/* Where run() keeps its work, carved from the plan's scratch. */
struct rnn_work {
    float *gx;      /* [seq * batch, G*H]: input projections plus biases, rows in X's order */
    float *gh;      /* [batch, G*H]: the hidden state times R^T, then the gates */
    float *h, *cst; /* [batch, H]: hidden and (LSTM) cell state */
    float *rh;      /* [batch, H]: GRU's r * h (linear_before_reset = 0) */
    float *bias;    /* [G*H]: Wb + Rb (GRU with linear_before_reset: Wb alone for h) */
    float *rt;      /* [G*H * H]: this direction's R^T (rnn_pack_r), from prepare or made per run */
    int64_t *len;   /* [batch]: each row's sequence length */
    void *proj;     /* the projection primitive's scratch */
    uint8_t *qx;    /* DynamicQuantizeLSTM: [seq * batch, I] X quantized */
    uint8_t *qh;    /* [batch, H]: the hidden state quantized */
    float *hm;      /* [batch, H]: the hidden state with ended rows zeroed (rnn_dq_step_product) */
    void *qscr;     /* the 8-bit GEMMs' scratch */
};

static size_t rnn_work_layout(const struct rnn_params *p, char *base, struct rnn_work *w) {
    int64_t GH = p->ngates * p->hidden, BH = p->batch * p->hidden, q = p->quant;
    size_t sizes[13] = {sizeof(float) * (size_t)(p->seq * p->batch * GH), sizeof(float) * (size_t)(p->batch * GH),
                        sizeof(float) * (size_t)BH, sizeof(float) * (size_t)BH, sizeof(float) * (size_t)BH,
                        sizeof(float) * (size_t)GH, p->rt || q ? 0 : sizeof(float) * (size_t)(GH * p->hidden),
                        sizeof(int64_t) * (size_t)p->batch, p->proj_scratch,
                        q ? (size_t)(p->seq * p->batch * p->in_size) : 0, q ? (size_t)BH : 0,
                        q ? sizeof(float) * (size_t)BH : 0, p->q_scratch};
    void **slots[13] = {(void **)&w->gx, (void **)&w->gh,  (void **)&w->h,  (void **)&w->cst, (void **)&w->rh,
                        (void **)&w->bias, (void **)&w->rt, (void **)&w->len, &w->proj,        (void **)&w->qx,
                        (void **)&w->qh,  (void **)&w->hm,  &w->qscr};
    size_t off = 0;
    for (int i = 0; i < 13; i++) {
        if (base) *slots[i] = base + off;
        off += dnnl_util_align(sizes[i] ? sizes[i] : 1);
    }
    return off;
}

/* Whether the node computes what rnn_fused_cell does: LSTM with its
 * default activations (Sigmoid, Tanh, Tanh), no clip, input_forget or
 * peepholes; GRU with linear_before_reset (as torch exports it) and its
 * default activations (Sigmoid, Tanh), no clip. */
static int rnn_fusable(const struct op_call *c, const struct rnn_params *p) {
    static const enum rnn_fn want[RNN_MAX_FNS] = {RNN_FN_SIGMOID, RNN_FN_TANH, RNN_FN_TANH};
    if (p->clip > 0 || p->kind == RNN_KIND_RNN) return 0;
    if (p->kind == RNN_KIND_GRU && !p->lbr) return 0;
    if (p->kind == RNN_KIND_LSTM && (p->input_forget || rnn_in(c, RNN_P))) return 0;
    for (int d = 0; d < p->ndir; d++)
        for (int k = 0; k < p->nfns; k++)
            if (p->act[d][k].fn != want[k]) return 0;
    return 1;
}

static void rnn_release(void *state) {
    struct rnn_params *p = state;
    if (p) {
        free(p->rt);
        for (int d = 0; d < 2; d++) {
            cpu_mm_release(p->proj[d]);
            cpu_qgemm_free(&p->qw[d]);
            cpu_qgemm_free(&p->qr[d]);
        }
    }
    op_params_free(p);
}

/* Multiply-adds of one direction's input projection from which it runs
 * on all the node's threads (about a tenth of a millisecond on one). */
#define RNN_PROJ_MACS_THREADS 8388608.0

/* Each direction's input projection as a oneDNN matmul whose weights (W^T,
 * read in place as W's transpose) are packed once here: sgemm packed them
 * again at every run. The combined biases come at run time. */
static int rnn_build_projections(struct op_call *c, struct rnn_params *p) {
    const struct tensor *w = c->in[RNN_W];
    int64_t GH = p->ngates * p->hidden, rows = p->seq * p->batch, in = p->in_size;
    if (!w->data || rows == 0 || GH == 0 || in == 0) return 0;
    /* Threads pay for themselves only on a large input projection: the
     * steps are sequential, and a team started (and waited for at a busy
     * machine's pace) for a small product costs more than it saves. */
    double macs = (double)rows * (double)GH * (double)in;
    p->proj_threads = macs >= RNN_PROJ_MACS_THREADS ? c->nthreads : 1;
    struct op_call pc = *c;
    pc.nthreads = p->proj_threads;
    dnnl_memory_desc_t a_md, b_md, bias_md, y_md;
    int64_t ad[2] = {rows, in}, biasd[2] = {1, GH}, yd[2] = {rows, GH};
    dnnl_dims_t bd = {in, GH}, bs = {1, in};
    dnnl_util_plain_md(&a_md, 2, ad);
    dnnl_util_plain_md(&bias_md, 2, biasd);
    dnnl_util_plain_md(&y_md, 2, yd);
    if (dnnl_memory_desc_init_by_strides(&b_md, 2, bd, dnnl_f32, bs) != dnnl_success)
        return op_error(c, "could not describe W^T for oneDNN");
    for (int d = 0; d < p->ndir; d++) {
        size_t scratch = 0;
        if (!(p->proj[d] = calloc(1, sizeof *p->proj[d]))) return op_error(c, "out of memory");
        int rc = cpu_mm_build(&pc, p->proj[d], &a_md, &b_md, (const float *)w->data + d * GH * in, &bias_md, &y_md,
                              1.0f, 0, &scratch);
        if (rc) return rc;
        if (scratch > p->proj_scratch) p->proj_scratch = scratch;
    }
    return 0;
}

/* DynamicQuantizeLSTM's two 8-bit GEMMs per direction on W and R as
 * constant [K, 4H] matrices with their zero points: the projection on the
 * threads a float one of its size would get, the per-step product of a few
 * rows on one. */
static int rnn_build_quantized(struct op_call *c, struct rnn_params *p) {
    const struct tensor *w = c->in[RNN_W], *r = c->in[RNN_R], *wz = c->in[RNN_W_ZP], *rz = c->in[RNN_R_ZP];
    if (!w->data || !r->data || !wz->data || !rz->data)
        return op_error(c, "W, R and their zero points must be constant (initializers): their 8-bit products are "
                           "built with the plan"), STATUS_UNSUPPORTED;
    int64_t GH = p->ngates * p->hidden, rows = p->seq * p->batch, I = p->in_size, H = p->hidden;
    p->proj_threads = 1;
    if (rows == 0 || GH == 0 || I == 0 || H == 0) return 0;
    double macs = (double)rows * (double)GH * (double)I;
    p->proj_threads = macs >= RNN_PROJ_MACS_THREADS ? c->nthreads : 1;
    struct op_call pc = *c, one = *c;
    pc.nthreads = p->proj_threads;
    one.nthreads = 1;
    int64_t nwz = tensor_numel(wz) / p->ndir, nrz = tensor_numel(rz) / p->ndir;
    for (int d = 0; d < p->ndir; d++) {
        struct tensor wb = {w->dtype, 2, {I, GH}, (uint8_t *)w->data + d * I * GH};
        struct tensor rb = {r->dtype, 2, {H, GH}, (uint8_t *)r->data + d * H * GH};
        struct tensor wzd = {wz->dtype, 1, {nwz}, (uint8_t *)wz->data + d * nwz};
        struct tensor rzd = {rz->dtype, 1, {nrz}, (uint8_t *)rz->data + d * nrz};
        size_t sw = 0, sr = 0;
        int rc = cpu_qgemm_build(&pc, &p->qw[d], rows, DT_UINT8, &wb, &wzd, &sw);
        if (!rc) rc = cpu_qgemm_build(&one, &p->qr[d], p->batch, DT_UINT8, &rb, &rzd, &sr);
        if (rc) return rc;
        size_t need = sw > sr ? sw : sr;
        if (need > p->q_scratch) p->q_scratch = need;
    }
    return 0;
}

static int rnn_prepare(struct op_call *c, enum rnn_kind kind, int quant, void **state, size_t *scratch_size) {
    struct rnn_params *p = op_params_alloc(c, sizeof *p);
    if (!p) return STATUS_NOMEM;
    p->quant = quant;
    int rc = rnn_decode(c, kind, p);
    if (rc) {
        op_params_free(p);
        return rc;
    }
    p->fused = rnn_fusable(c, p);
    const struct tensor *r = c->in[RNN_R];
    if (quant) {
        if ((rc = rnn_build_quantized(c, p))) {
            rnn_release(p);
            return rc;
        }
    } else if (r->data) {
        int64_t per = p->ngates * p->hidden * p->hidden;
        /* Cache-line aligned: a vector load across two lines costs both. */
        p->rt = aligned_alloc(64, dnnl_util_align(sizeof(float) * (size_t)(p->ndir * per > 0 ? p->ndir * per : 1)));
        if (!p->rt) {
            op_params_free(p);
            return op_error(c, "out of memory for R transposed (%lld floats)", (long long)(p->ndir * per));
        }
        p->split = rnn_split_at(c, p); /* R constant: packed here once */
        if (p->split && rnn_pack_shared(p, r->data, p->rt)) {
            rnn_release(p);
            return op_error(c, "out of memory for R's rows (%lld floats)", (long long)per);
        }
        if (p->split)
            log_debug("%s '%s': each step shared by two threads, hidden units [0, %lld) and [%lld, %lld)",
                      c->node->op_type, c->node->name, (long long)p->split, (long long)p->split,
                      (long long)p->hidden);
        for (int d = 0; !p->split && d < p->ndir; d++)
            rnn_pack_r(p, (const float *)r->data + d * per, p->rt + d * per);
    }
    if (!quant) p->proj_threads = c->nthreads;
    if (!quant && (rc = rnn_build_projections(c, p))) {
        rnn_release(p);
        return rc;
    }
    struct rnn_work w;
    *scratch_size = rnn_work_layout(p, NULL, &w) * (size_t)p->ndir; /* a work per direction */
    *state = p;
    return 0;
}
static int rnn_prepare_rnn(struct op_call *c, void **s, size_t *n) { return rnn_prepare(c, RNN_KIND_RNN, 0, s, n); }
static int gru_prepare(struct op_call *c, void **s, size_t *n) { return rnn_prepare(c, RNN_KIND_GRU, 0, s, n); }
static int lstm_prepare(struct op_call *c, void **s, size_t *n) { return rnn_prepare(c, RNN_KIND_LSTM, 0, s, n); }
static int dqlstm_prepare(struct op_call *c, void **s, size_t *n) { return rnn_prepare(c, RNN_KIND_LSTM, 1, s, n); }

/* ---- one direction ------------------------------------------------------ */

/* What one direction reads and writes. */
struct rnn_dir {
    const struct rnn_params *p;
    const struct rnn_act *act;  /* this direction's activations */
    int d, reverse;
    const float *w, *r, *b, *peep; /* this direction's slices; b and peep may be NULL */
    const float *rt;            /* R^T packed in prepare; NULL: rnn_project packs it into scratch */
    const float *x;
    float *y, *yh, *yc;         /* outputs, NULL when absent */
    const float *h0, *c0;       /* initial states, NULL when absent */
    const float *ws, *rs;       /* DynamicQuantizeLSTM: this direction's W and R scales (1 or 4H) */
    int ws_per, rs_per;         /* whether they are per column */
};

/* Offsets of a (time step, batch row) in X's rows, in Y, and of a batch
 * row in Y_h and the initial states, by layout. */
static int64_t rnn_row(const struct rnn_params *p, int64_t t, int64_t b) {
    return p->layout ? b * p->seq + t : t * p->batch + b;
}
static int64_t rnn_y_off(const struct rnn_params *p, int64_t t, int d, int64_t b) {
    return (p->layout ? (b * p->seq + t) * p->ndir + d : (t * p->ndir + d) * p->batch + b) * p->hidden;
}
static int64_t rnn_state_off(const struct rnn_params *p, int d, int64_t b) {
    return (p->layout ? b * p->ndir + d : d * p->batch + b) * p->hidden;
}

/* ---- DynamicQuantizeLSTM's products ------------------------------------ */

/* The left operand a [m, k] quantized to uint8 over the range of its first
 * n_range values (onnxruntime's scale and zero point: DynamicQuantizeLinear's
 * rule, scale 1 for an all-zero range), the rest at that scale; then
 * y = (float)(sum (a_q - a_zp) (B - zb)) * (a_scale * b_scale[n]) + bias[n]
 * on the exact 8-bit GEMM q. */
static int rnn_dq_gemm(struct op_call *c, const struct rnn_work *w, const struct cpu_qgemm *q, const float *a,
                       int64_t n_range, uint8_t *aq, const float *bscale, int bscale_per, const float *bias, float *y) {
    const int64_t n = q->m * q->k;
    uint8_t zp;
    float scale = cpu_dynquant_u8(a, n_range, aq, &zp);
    if (!(scale > 0)) scale = 1.0f;
    for (int64_t i = n_range; i < n; i++) {
        float v = nearbyintf(a[i] / scale) + (float)zp;
        v = v > 0 ? v : 0; /* NaN too */
        aq[i] = (uint8_t)(v < 255 ? v : 255);
    }
    struct cpu_qgemm_epi e = {scale, bscale, bscale_per, bias, ACT_NONE, 0, 0};
    struct op_call qc = *c;
    qc.scratch = w->qscr;
    qc.scratch_size = cpu_qgemm_scratch(q);
    return cpu_qgemm_run(&qc, q, aq, DT_UINT8, zp, (int32_t *)y, &e);
}

/* gx = X W + bias, X quantized over the steps any row runs (the rows
 * onnxruntime projects: its range decides the scale). */
static int rnn_dq_project(struct op_call *c, const struct rnn_dir *rd, struct rnn_work *w) {
    const struct rnn_params *p = rd->p;
    const struct cpu_qgemm *q = &p->qw[rd->d];
    if (!q->prim) return 0;
    int64_t live = 0;
    for (int64_t b = 0; b < p->batch; b++) live = w->len[b] > live ? w->len[b] : live;
    return rnn_dq_gemm(c, w, q, rd->x, live * p->batch * p->in_size, w->qx, rd->ws, rd->ws_per, w->bias, w->gx);
}

/* gh = h R at step s. The hidden state is quantized as one block over
 * every batch row, as onnxruntime does at one thread; a row whose sequence
 * ended before step s - 1 counts as zeros when the node writes Y, because
 * onnxruntime reads the previous state back from Y, where such rows are
 * zeroed (without Y they keep their last state in both). */
static int rnn_dq_step_product(struct op_call *c, const struct rnn_dir *rd, struct rnn_work *w, int64_t s) {
    const struct rnn_params *p = rd->p;
    const struct cpu_qgemm *q = &p->qr[rd->d];
    if (!q->prim) return 0;
    const int64_t H = p->hidden;
    const float *h = w->h;
    int masked = 0;
    for (int64_t b = 0; rd->y && s > 0 && b < p->batch; b++) masked |= w->len[b] < s;
    if (masked) {
        for (int64_t b = 0; b < p->batch; b++) {
            if (w->len[b] < s) memset(w->hm + b * H, 0, sizeof(float) * (size_t)H);
            else memcpy(w->hm + b * H, w->h + b * H, sizeof(float) * (size_t)H);
        }
        h = w->hm;
    }
    return rnn_dq_gemm(c, w, q, h, p->batch * H, w->qh, rd->rs, rd->rs_per, NULL, w->gh);
}

/* The combined biases, R^T, then every step's input projection:
 * gx = X W^T + bias. */
static int rnn_project(struct op_call *c, const struct rnn_dir *rd, struct rnn_work *w) {
    const struct rnn_params *p = rd->p;
    int64_t H = p->hidden, GH = p->ngates * H, rows = p->seq * p->batch;
    for (int64_t j = 0; j < GH; j++) {
        int r_inside = p->lbr && j >= 2 * H; /* GRU's Rbh is added inside r * (...) */
        w->bias[j] = rd->b ? rd->b[j] + (r_inside ? 0 : rd->b[GH + j]) : 0;
    }
    if (p->quant) return rnn_dq_project(c, rd, w);
    /* sgemm packs a transposed operand again at every call: the per-step
     * products read R^T laid out as they want it instead. */
    if (rd->rt) w->rt = (float *)rd->rt;
    else rnn_pack_r(p, rd->r, w->rt);
    if (p->proj[rd->d]) {
        void *args[4] = {(void *)rd->x, NULL, w->gx, w->bias};
        return dnnl_prim_exec(c, p->proj[rd->d]->prim, args, w->proj);
    }
    for (int64_t i = 0; i < rows; i++) memcpy(w->gx + i * GH, w->bias, sizeof(float) * (size_t)GH);
    return rnn_gemm(c, 'T', rows, GH, p->in_size, rd->x, p->in_size, rd->w, p->in_size, 1.0f, w->gx, GH);
}

/* The time index a row reads at step s, or -1 once its sequence ended. */
static int64_t rnn_step_t(const struct rnn_dir *rd, const struct rnn_work *w, int64_t s, int64_t b) {
    if (s >= w->len[b]) return -1;
    return rd->reverse ? w->len[b] - 1 - s : s;
}

/* Gates of one batch row: g holds x W^T + h R^T + biases on entry. */
static void rnn_cell_rnn(const struct rnn_dir *rd, float *g, const float *gx, float *h) {
    int64_t H = rd->p->hidden;
    for (int64_t j = 0; j < H; j++) g[j] += gx[j];
    rnn_clip(g, H, rd->p->clip);
    rnn_act_apply(&rd->act[0], g, H);
    memcpy(h, g, sizeof(float) * (size_t)H);
}

/* LSTM gates in ONNX's order i, o, f, c; peepholes P in order i, o, f. */
static void rnn_cell_lstm(const struct rnn_dir *rd, float *g, const float *gx, float *h, float *cs) {
    const struct rnn_params *p = rd->p;
    int64_t H = p->hidden;
    float *gi = g, *go = g + H, *gf = g + 2 * H, *gc = g + 3 * H;
    for (int64_t j = 0; j < 4 * H; j++) g[j] += gx[j];
    if (rd->peep)
        for (int64_t j = 0; j < H; j++) gi[j] += rd->peep[j] * cs[j];
    rnn_clip(gi, H, p->clip);
    rnn_act_apply(&rd->act[0], gi, H);
    if (p->input_forget) {
        for (int64_t j = 0; j < H; j++) gf[j] = 1.0f - gi[j];
    } else {
        if (rd->peep)
            for (int64_t j = 0; j < H; j++) gf[j] += rd->peep[2 * H + j] * cs[j];
        rnn_clip(gf, H, p->clip);
        rnn_act_apply(&rd->act[0], gf, H);
    }
    rnn_clip(gc, H, p->clip);
    rnn_act_apply(&rd->act[1], gc, H);
    for (int64_t j = 0; j < H; j++) cs[j] = gf[j] * cs[j] + gi[j] * gc[j];
    if (rd->peep)
        for (int64_t j = 0; j < H; j++) go[j] += rd->peep[H + j] * cs[j];
    rnn_clip(go, H, p->clip);
    rnn_act_apply(&rd->act[0], go, H);
    memcpy(h, cs, sizeof(float) * (size_t)H);
    rnn_act_apply(&rd->act[2], h, H);
    for (int64_t j = 0; j < H; j++) h[j] *= go[j];
}

/* GRU's update and reset gates (z, r) of one row, in place in g. */
static void rnn_gru_zr(const struct rnn_dir *rd, float *g, const float *gx) {
    int64_t H2 = 2 * rd->p->hidden;
    for (int64_t j = 0; j < H2; j++) g[j] += gx[j];
    rnn_clip(g, H2, rd->p->clip);
    rnn_act_apply(&rd->act[0], g, H2);
}

/* GRU's new state from z, r (done) and g's third slice: h R_h^T (+ Rbh)
 * with linear_before_reset, (r * h) R_h^T without. */
static void rnn_cell_gru(const struct rnn_dir *rd, float *g, const float *gx, float *h) {
    const struct rnn_params *p = rd->p;
    int64_t H = p->hidden;
    float *z = g, *r = g + H, *hh = g + 2 * H;
    const float *rbh = rd->b ? rd->b + 5 * H : NULL;
    if (p->lbr)
        for (int64_t j = 0; j < H; j++) hh[j] = gx[2 * H + j] + r[j] * (hh[j] + (rbh ? rbh[j] : 0));
    else
        for (int64_t j = 0; j < H; j++) hh[j] += gx[2 * H + j];
    rnn_clip(hh, H, p->clip);
    rnn_act_apply(&rd->act[1], hh, H);
    for (int64_t j = 0; j < H; j++) h[j] = (1.0f - z[j]) * hh[j] + z[j] * h[j];
}

/* The gates of one row in one pass, for the common forms (rnn_fusable):
 * the same arithmetic as rnn_cell_lstm and rnn_cell_gru with their default
 * activations, in the same order (so the same results), without a pass
 * per gate. Built per ISA like cpu_gemv: the sigmoids and tanhs are most
 * of a step's arithmetic beside the product. n hidden units; gate k of
 * unit j at g[k * gs + j] and gx[k * xs + j]; GRU reads the previous state
 * at hp (h itself, or another buffer: rnn_steps_shared). */
#define RNN_FUSED_CELL(NAME)                                                                                \
    static void NAME(enum rnn_kind kind, int64_t n, int64_t gs, const float *g, int64_t xs, const float *gx, \
                     const float *rbh, const float *hp, float *h, float *cs) {                              \
        if (kind == RNN_KIND_LSTM) {                                                                        \
            _Pragma("omp simd") for (int64_t j = 0; j < n; j++) {                                           \
                float i = ew_sigmoid_f(g[j] + gx[j]), o = ew_sigmoid_f(g[gs + j] + gx[xs + j]);             \
                float f = ew_sigmoid_f(g[2 * gs + j] + gx[2 * xs + j]);                                     \
                float cc = ew_tanh_f(g[3 * gs + j] + gx[3 * xs + j]);                                       \
                float cn = f * cs[j] + i * cc;                                                              \
                cs[j] = cn;                                                                                 \
                h[j] = ew_tanh_f(cn) * o;                                                                   \
            }                                                                                               \
            return;                                                                                         \
        }                                                                                                   \
        _Pragma("omp simd") for (int64_t j = 0; j < n; j++) {                                               \
            float z = ew_sigmoid_f(g[j] + gx[j]), r = ew_sigmoid_f(g[gs + j] + gx[xs + j]);                 \
            float hh = ew_tanh_f(gx[2 * xs + j] + r * (g[2 * gs + j] + (rbh ? rbh[j] : 0)));                \
            h[j] = (1.0f - z) * hh + z * hp[j];                                                             \
        }                                                                                                   \
    }
RNN_FUSED_CELL(rnn_fused_cell_v2)
#ifdef RNN_X86
__attribute__((target("arch=x86-64-v4"))) RNN_FUSED_CELL(rnn_fused_cell_v4)
__attribute__((target("arch=x86-64-v3"))) RNN_FUSED_CELL(rnn_fused_cell_v3)
#endif

typedef void (*rnn_cell_fn)(enum rnn_kind kind, int64_t n, int64_t gs, const float *g, int64_t xs, const float *gx,
                            const float *rbh, const float *hp, float *h, float *cs);

static rnn_cell_fn rnn_fused_cell_for_cpu(void) {
#ifdef RNN_X86
    int l = dnnl_util_isa_level();
    if (l >= 4) return rnn_fused_cell_v4;
    if (l == 3) return rnn_fused_cell_v3;
#endif
    return rnn_fused_cell_v2;
}

static void rnn_fused_cell(const struct rnn_dir *rd, const float *g, const float *gx, float *h, float *cs) {
    int64_t H = rd->p->hidden;
    const float *rbh = rd->b ? rd->b + 5 * H : NULL;
    rnn_fused_cell_for_cpu()(rd->p->kind, H, H, g, H, gx, rbh, h, h, cs);
}

/* Whether any row still runs at step s. */
static int rnn_any_live(const struct rnn_work *w, int64_t batch, int64_t s) {
    for (int64_t b = 0; b < batch; b++)
        if (s < w->len[b]) return 1;
    return 0;
}

/* GRU without linear_before_reset: z and r first, then (r * h) R_h^T
 * into the third slice of gh. */
static int rnn_gru_reset_gemm(struct op_call *c, const struct rnn_dir *rd, struct rnn_work *w, int64_t s) {
    const struct rnn_params *p = rd->p;
    int64_t H = p->hidden, GH = 3 * H;
    for (int64_t b = 0; b < p->batch; b++) {
        int64_t t = rnn_step_t(rd, w, s, b);
        float *g = w->gh + b * GH;
        if (t >= 0) rnn_gru_zr(rd, g, w->gx + rnn_row(p, t, b) * GH);
        for (int64_t j = 0; j < H; j++) w->rh[b * H + j] = g[H + j] * w->h[b * H + j];
    }
    return rnn_step_product(c, p, w->rh, w->rt, 2 * H, H, w->gh);
}

/* The gates and new state of batch row b at step s, and its Y. */
static void rnn_step_row(const struct rnn_dir *rd, struct rnn_work *w, int64_t s, int64_t b) {
    const struct rnn_params *p = rd->p;
    int64_t H = p->hidden, GH = p->ngates * H, t = rnn_step_t(rd, w, s, b);
    if (t < 0) return;
    float *g = w->gh + b * GH, *h = w->h + b * H;
    const float *gx = w->gx + rnn_row(p, t, b) * GH;
    if (p->fused) rnn_fused_cell(rd, g, gx, h, w->cst + b * H);
    else switch (p->kind) {
    case RNN_KIND_RNN: rnn_cell_rnn(rd, g, gx, h); break;
    case RNN_KIND_LSTM: rnn_cell_lstm(rd, g, gx, h, w->cst + b * H); break;
    case RNN_KIND_GRU:
        if (p->lbr) rnn_gru_zr(rd, g, gx);
        rnn_cell_gru(rd, g, gx, h);
        break;
    }
    if (rd->y) memcpy(rd->y + rnn_y_off(p, t, rd->d, b), h, sizeof(float) * (size_t)H);
}

/* One time step for every live row. Rows go to threads only when there is
 * much to share: even a parallel region that its if clause keeps on one
 * thread costs libgomp a team set-up, at every step of the sequence. */
static int rnn_step(struct op_call *c, const struct rnn_dir *rd, struct rnn_work *w, int64_t s) {
    const struct rnn_params *p = rd->p;
    int64_t H = p->hidden, GH = p->ngates * H;
    int gru_split = rnn_gru_split(p);
    int rc = p->quant ? rnn_dq_step_product(c, rd, w, s)
                      : rnn_step_product(c, p, w->h, w->rt, 0, gru_split ? 2 * H : GH, w->gh);
    if (!rc && gru_split) rc = rnn_gru_reset_gemm(c, rd, w, s);
    if (rc) return rc;
    if (p->batch * GH < 65536 || c->nthreads < 2) {
        for (int64_t b = 0; b < p->batch; b++) rnn_step_row(rd, w, s, b);
        return 0;
    }
#pragma omp parallel for num_threads(c->nthreads)
    for (int64_t b = 0; b < p->batch; b++) rnn_step_row(rd, w, s, b);
    return 0;
}

/* A direction's state [batch, H] from an initial state laid out by
 * p->layout (zeros when absent), and back into Y_h or Y_c. A row of
 * length 0 ran no step: its final state is zeros, not the initial state,
 * as onnxruntime has it. */
static void rnn_state_load(const struct rnn_params *p, int d, float *state, const float *src) {
    size_t hb = sizeof(float) * (size_t)p->hidden;
    for (int64_t b = 0; b < p->batch; b++) {
        if (src) memcpy(state + b * p->hidden, src + rnn_state_off(p, d, b), hb);
        else memset(state + b * p->hidden, 0, hb);
    }
}
static void rnn_state_store(const struct rnn_params *p, int d, const int64_t *len, const float *state, float *dst) {
    size_t hb = sizeof(float) * (size_t)p->hidden;
    for (int64_t b = 0; b < p->batch; b++) {
        if (len[b]) memcpy(dst + rnn_state_off(p, d, b), state + b * p->hidden, hb);
        else memset(dst + rnn_state_off(p, d, b), 0, hb);
    }
}

/* ---- the shared steps (rnn_split_at) --------------------------------- */

/* Share t's part of step s for every row: the product into its gates
 * (gh + b * G*H + j0 * G, gate k of unit j at k * n + j), the cells, Y. */
static void rnn_split_share(const struct rnn_dir *rd, struct rnn_work *w, rnn_cell_fn cell, int64_t s, int t,
                            const float *h, float *hn) {
    const struct rnn_params *p = rd->p;
    const int64_t H = p->hidden, GH = p->ngates * H, j0 = t ? p->split : 0, n = (t ? H : p->split) - j0;
    const float *rbh = rd->b ? rd->b + 5 * H + j0 : NULL;
    for (int64_t b = 0; b < p->batch; b++) {
        const int64_t ts = rnn_step_t(rd, w, s, b);
        if (ts < 0) { /* ended: the state stays */
            memcpy(hn + b * H + j0, h + b * H + j0, sizeof(float) * (size_t)n);
            continue;
        }
        float *g = w->gh + b * GH + j0 * p->ngates;
        cpu_gemv(h + b * H, H, w->rt + j0 * p->ngates * H, n * p->ngates, g);
        cell(p->kind, n, n, g, H, w->gx + rnn_row(p, ts, b) * GH + j0, rbh, h + b * H + j0, hn + b * H + j0,
             w->cst + b * H + j0);
        if (rd->y) memcpy(rd->y + rnn_y_off(p, ts, rd->d, b) + j0, hn + b * H + j0, sizeof(float) * (size_t)n);
    }
}

/* Waits until *done reaches want: spinning, then yielding the core (the
 * thread that holds the missing share may be waiting for it). */
static void rnn_wait_done(atomic_llong *done, long long want) {
    for (unsigned spins = 0; atomic_load_explicit(done, memory_order_acquire) < want; spins++) {
#ifdef RNN_X86
        if (spins < 4096) {
            _mm_pause();
            continue;
        }
#endif
        sched_yield();
    }
}

/* The steps of a direction, each shared by two threads. The shares are taken
 * in order from a counter, share k = step k / 2, half k % 2, and a share
 * starts once every share of the steps before it is done: a thread the
 * system has taken away (a busy machine, another process on the other
 * core) holds back at most the share it took, where a barrier a step made
 * lstm_tagger 10x slower in the mean on a loaded two-core VM. The state
 * alternates between w->h and w->rh (GRU's r * h, unused with
 * linear_before_reset). */
static void rnn_steps_shared(const struct op_call *c, const struct rnn_dir *rd, struct rnn_work *w) {
    const struct rnn_params *p = rd->p;
    const rnn_cell_fn cell = rnn_fused_cell_for_cpu();
    float *buf[2] = {w->h, w->rh};
    int64_t steps = 0;
    while (steps < p->seq && rnn_any_live(w, p->batch, steps)) steps++;
    atomic_llong next = 0, done = 0;
#pragma omp parallel num_threads(c->nthreads >= 2 ? 2 : 1)
    for (;;) {
        const long long k = atomic_fetch_add_explicit(&next, 1, memory_order_relaxed), s = k / 2;
        if (s >= steps) break;
        rnn_wait_done(&done, 2 * s);
        rnn_split_share(rd, w, cell, s, (int)(k % 2), buf[s & 1], buf[(s & 1) ^ 1]);
        atomic_fetch_add_explicit(&done, 1, memory_order_release);
    }
    if (steps & 1) memcpy(w->h, w->rh, sizeof(float) * (size_t)(p->batch * p->hidden));
}

static int rnn_direction(struct op_call *c, const struct rnn_dir *rd, struct rnn_work *w) {
    const struct rnn_params *p = rd->p;
    int rc = rnn_project(c, rd, w);
    if (rc) return rc;
    rnn_state_load(p, rd->d, w->h, rd->h0);
    if (p->kind == RNN_KIND_LSTM) rnn_state_load(p, rd->d, w->cst, rd->c0);
    if (p->split) rnn_steps_shared(c, rd, w);
    for (int64_t s = 0; !p->split && s < p->seq && rnn_any_live(w, p->batch, s); s++)
        if ((rc = rnn_step(c, rd, w, s))) return rc;
    if (rd->yh) rnn_state_store(p, rd->d, w->len, w->h, rd->yh);
    if (rd->yc) rnn_state_store(p, rd->d, w->len, w->cst, rd->yc);
    return 0;
}

/* ---- run ---------------------------------------------------------------- */

static float *rnn_out(const struct op_call *c, int i) {
    return i < c->nout && c->out[i] ? c->out[i]->data : NULL;
}

static const float *rnn_slice(const struct op_call *c, int i, int d, int64_t per_dir) {
    const struct tensor *t = rnn_in(c, i);
    return t ? (const float *)t->data + d * per_dir : NULL;
}

/* Reads sequence_lens into w->len (every row full when absent); a length
 * outside [0, seq] is an error. Returns whether any row is short. */
static int rnn_read_lens(struct op_call *c, const struct rnn_params *p, struct rnn_work *w, int *short_rows) {
    const struct tensor *sl = rnn_in(c, RNN_SEQ);
    *short_rows = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        w->len[b] = sl ? op_int_at(sl, b) : p->seq;
        if (w->len[b] < 0 || w->len[b] > p->seq)
            return op_error(c, "sequence_lens[%lld] is %lld; expected 0 to %lld", (long long)b, (long long)w->len[b],
                            (long long)p->seq);
        if (w->len[b] < p->seq) *short_rows = 1;
    }
    return 0;
}

/* Direction d's slices of the inputs and outputs. */
static void rnn_dir_init(const struct op_call *c, const struct rnn_params *p, int d, struct rnn_dir *rd) {
    int64_t H = p->hidden, GH = p->ngates * H;
    *rd = (struct rnn_dir){
        .p = p, .act = p->act[d], .d = d, .reverse = p->reverse || d == 1,
        .w = p->quant ? NULL : rnn_slice(c, RNN_W, d, GH * p->in_size),
        .r = p->quant ? NULL : rnn_slice(c, RNN_R, d, GH * H),
        .b = rnn_slice(c, RNN_B, d, 2 * GH), .x = c->in[RNN_X]->data, .y = rnn_out(c, RNN_Y),
        .rt = p->rt ? p->rt + d * GH * H : NULL,
        .yh = rnn_out(c, RNN_YH), .h0 = rnn_in(c, RNN_H0) ? c->in[RNN_H0]->data : NULL,
    };
    if (p->quant) { /* W and R are 8-bit (p->qw, p->qr); their scales per direction */
        int64_t nws = tensor_numel(c->in[RNN_W_SCALE]) / p->ndir, nrs = tensor_numel(c->in[RNN_R_SCALE]) / p->ndir;
        rd->ws = (const float *)c->in[RNN_W_SCALE]->data + d * nws;
        rd->rs = (const float *)c->in[RNN_R_SCALE]->data + d * nrs;
        rd->ws_per = nws > 1;
        rd->rs_per = nrs > 1;
    }
    if (p->kind == RNN_KIND_LSTM) {
        rd->peep = rnn_slice(c, RNN_P, d, 3 * H);
        rd->yc = rnn_out(c, RNN_YC);
        rd->c0 = rnn_in(c, RNN_C0) ? c->in[RNN_C0]->data : NULL;
    }
}

/* The two directions of a bidirectional node, one thread each: they share
 * nothing but X and write apart in the outputs, and a step of one is too
 * small to split between threads. Each has its own work (scratch holds
 * two) and its own error text; the first failure is reported. */
static int rnn_both_directions(struct op_call *c, const struct rnn_dir *rd, struct rnn_work *w) {
    struct op_call c1 = *c;
    char err1[256] = "";
    c1.err = err1;
    c1.err_len = sizeof err1;
    int rcs[2] = {0, 0};
#pragma omp parallel for num_threads(2)
    for (int d = 0; d < 2; d++) rcs[d] = rnn_direction(d ? &c1 : c, &rd[d], &w[d]);
    if (rcs[1] && !rcs[0] && c->err && c->err_len) snprintf(c->err, c->err_len, "%s", err1);
    return rcs[0] ? rcs[0] : rcs[1];
}

static int rnn_run(struct op_call *c) {
    const struct rnn_params *p = c->state;
    struct rnn_work w[2];
    size_t one = rnn_work_layout(p, NULL, &w[0]);
    for (int d = 0; d < p->ndir; d++) rnn_work_layout(p, (char *)c->scratch + d * one, &w[d]);
    int short_rows, rc = rnn_read_lens(c, p, &w[0], &short_rows);
    if (rc) return rc;
    if (p->ndir == 2) memcpy(w[1].len, w[0].len, sizeof(int64_t) * (size_t)p->batch);
    dnnl_util_set_threads(p->proj_threads);
    float *y = rnn_out(c, RNN_Y);
    if (y && short_rows) memset(y, 0, tensor_nbytes(c->out[RNN_Y]));
    struct rnn_dir rd[2];
    for (int d = 0; d < p->ndir; d++) rnn_dir_init(c, p, d, &rd[d]);
    if (p->ndir == 2 && c->nthreads >= 2) return rnn_both_directions(c, rd, w);
    for (int d = 0; d < p->ndir; d++)
        if ((rc = rnn_direction(c, &rd[d], &w[d]))) return rc;
    return 0;
}

const struct op_def op_defs_rnn[] = {
    {"RNN", "", rnn_infer_rnn, rnn_prepare_rnn, rnn_run, rnn_release, 0},
    {"GRU", "", gru_infer, gru_prepare, rnn_run, rnn_release, 0},
    {"LSTM", "", lstm_infer, lstm_prepare, rnn_run, rnn_release, 0},
    {"DynamicQuantizeLSTM", "com.microsoft", dqlstm_infer, dqlstm_prepare, rnn_run, rnn_release, 0},
    {NULL, NULL, NULL, NULL, NULL, NULL, 0},
};
