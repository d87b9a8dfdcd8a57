/* test_ops_rnn.c - the recurrent ops against plain-C loops of ONNX's
 * formulas written here: a bidirectional LSTM with sequence_lens (a full
 * row, a short one, an empty one), initial states and peepholes; GRU with
 * linear_before_reset 0 and 1; layout 1 against layout 0 transposed; RNN's
 * activations with alpha and beta, and clip; clear refusals. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/ops.h"
#include "tests/kernels/harness.h"

/* ---- helpers ------------------------------------------------------------ */

static float *F(const struct tensor *t) { return t->data; }

static void expect_close(const float *got, const float *want, int64_t n, const char *what) {
    for (int64_t i = 0; i < n; i++)
        if (!(fabsf(got[i] - want[i]) <= 1e-5f + 1e-4f * fabsf(want[i])))
            fail_msg("%s: element %lld is %.7g, expected %.7g", what, (long long)i, got[i], want[i]);
}

static float sig(float x) { return 1.0f / (1.0f + expf(-x)); }

#define MAXH 16

/* Sizes and inputs of one recurrent call, layout 0. */
struct rnn_case {
    int T, B, I, H, D, G;
    struct tensor x, w, r, b, h0, c0, p, lens;
    int32_t len[8];
};

static void case_init(struct rnn_case *k, int T, int B, int I, int H, int D, int G) {
    memset(k, 0, sizeof *k);
    k->T = T, k->B = B, k->I = I, k->H = H, k->D = D, k->G = G;
    k->x = tn_rand_f32(3, (int64_t[]){T, B, I});
    k->w = tn_rand_f32(3, (int64_t[]){D, G * H, I});
    k->r = tn_rand_f32(3, (int64_t[]){D, G * H, H});
    k->b = tn_rand_f32(2, (int64_t[]){D, 2 * G * H});
    k->h0 = tn_rand_f32(3, (int64_t[]){D, B, H});
    k->c0 = tn_rand_f32(3, (int64_t[]){D, B, H});
    k->p = tn_rand_f32(2, (int64_t[]){D, 3 * H});
    for (int i = 0; i < B; i++) k->len[i] = T;
    k->lens = (struct tensor){DT_INT32, 1, {B}, k->len};
}

static void case_free(struct rnn_case *k) {
    free(k->x.data), free(k->w.data), free(k->r.data), free(k->b.data);
    free(k->h0.data), free(k->c0.data), free(k->p.data);
}

/* a[q*H + j] = x_t W_q^T + h R_q^T + Wb_q + Rb_q for gate q; with split,
 * the R part goes to ar instead (GRU's h gate). */
static void ref_gates(const struct rnn_case *k, int d, const float *xt, const float *h, float *a, float *ar) {
    int GH = k->G * k->H;
    const float *w = F(&k->w) + d * GH * k->I, *r = F(&k->r) + d * GH * k->H, *b = F(&k->b) + d * 2 * GH;
    for (int q = 0; q < GH; q++) {
        float sx = b[q], sh = b[GH + q];
        for (int i = 0; i < k->I; i++) sx += xt[i] * w[q * k->I + i];
        for (int i = 0; i < k->H; i++) sh += h[i] * r[q * k->H + i];
        a[q] = sx + sh;
        if (ar) ar[q] = sh, a[q] = sx;
    }
}

/* ONNX's LSTM, one direction d over row b: i, o, f, c gates, peepholes
 * i, o, f; Y zero past the row's length; Y_h, Y_c zero for length 0. */
static void lstm_ref(const struct rnn_case *k, float *y, float *yh, float *yc) {
    int H = k->H, B = k->B, D = k->D;
    memset(y, 0, sizeof(float) * (size_t)(k->T * D * B * H));
    for (int d = 0; d < D; d++)
        for (int b = 0; b < B; b++) {
            float h[MAXH], c[MAXH], a[4 * MAXH];
            const float *p = F(&k->p) + d * 3 * H;
            memcpy(h, F(&k->h0) + (d * B + b) * H, sizeof(float) * (size_t)H);
            memcpy(c, F(&k->c0) + (d * B + b) * H, sizeof(float) * (size_t)H);
            int L = k->len[b];
            for (int s = 0; s < L; s++) {
                int t = d ? L - 1 - s : s;
                ref_gates(k, d, F(&k->x) + (t * B + b) * k->I, h, a, NULL);
                for (int j = 0; j < H; j++) {
                    float i = sig(a[j] + p[j] * c[j]), f = sig(a[2 * H + j] + p[2 * H + j] * c[j]);
                    c[j] = f * c[j] + i * tanhf(a[3 * H + j]);
                    float o = sig(a[H + j] + p[H + j] * c[j]);
                    h[j] = o * tanhf(c[j]);
                    y[((t * D + d) * B + b) * H + j] = h[j];
                }
            }
            for (int j = 0; j < H; j++) {
                yh[(d * B + b) * H + j] = L ? h[j] : 0;
                yc[(d * B + b) * H + j] = L ? c[j] : 0;
            }
        }
}

/* ONNX's GRU, z r h gates, both forms of the h gate. */
static void gru_ref(const struct rnn_case *k, int lbr, float *y, float *yh) {
    int H = k->H, B = k->B, D = k->D;
    for (int d = 0; d < D; d++)
        for (int b = 0; b < B; b++) {
            float h[MAXH], a[3 * MAXH], ar[3 * MAXH], rh[MAXH];
            memcpy(h, F(&k->h0) + (d * B + b) * H, sizeof(float) * (size_t)H);
            for (int s = 0; s < k->T; s++) {
                int t = d ? k->T - 1 - s : s;
                ref_gates(k, d, F(&k->x) + (t * B + b) * k->I, h, a, ar);
                const float *rw = F(&k->r) + d * 3 * H * H + 2 * H * H, *rbh = F(&k->b) + d * 6 * H + 5 * H;
                float z[MAXH], r[MAXH], n[MAXH];
                for (int j = 0; j < H; j++) {
                    z[j] = sig(a[j] + ar[j]);
                    r[j] = sig(a[H + j] + ar[H + j]);
                    rh[j] = r[j] * h[j];
                }
                for (int j = 0; j < H; j++) {
                    float v = rbh[j]; /* (r * h) R_h^T + Rbh */
                    for (int i = 0; i < H; i++) v += rh[i] * rw[j * H + i];
                    n[j] = tanhf(a[2 * H + j] + (lbr ? r[j] * ar[2 * H + j] : v));
                }
                for (int j = 0; j < H; j++) {
                    h[j] = (1 - z[j]) * n[j] + z[j] * h[j];
                    y[((t * D + d) * B + b) * H + j] = h[j];
                }
            }
            memcpy(yh + (d * B + b) * H, h, sizeof(float) * (size_t)H);
        }
}

static const char *dir_name(int D) { return D == 2 ? "bidirectional" : "forward"; }

/* ---- LSTM --------------------------------------------------------------- */

static void test_lstm_bidirectional_seq_lens(void **st) {
    (void)st;
    struct rnn_case k;
    case_init(&k, 5, 3, 4, 6, 2, 4);
    k.len[1] = 2;
    k.len[2] = 0;
    struct tnode tn;
    tn_init(&tn, "LSTM", 14);
    tn_str(&tn, "direction", "bidirectional");
    tn_int(&tn, "hidden_size", 6);
    struct tensor Y = {0}, YH = {0}, YC = {0};
    const struct tensor *in[8] = {&k.x, &k.w, &k.r, &k.b, &k.lens, &k.h0, &k.c0, &k.p};
    struct tensor *out[3] = {&Y, &YH, &YC};
    for (int nt = 1; nt <= 2; nt++) {
        assert_int_equal(tn_call(&tn.n, in, 8, out, 3, nt), 0);
        assert_int_equal(Y.ndim, 4);
        assert_true(Y.dims[0] == 5 && Y.dims[1] == 2 && Y.dims[2] == 3 && Y.dims[3] == 6);
        float y[5 * 2 * 3 * 6], yh[2 * 3 * 6], yc[2 * 3 * 6];
        lstm_ref(&k, y, yh, yc);
        expect_close(F(&Y), y, 180, "Y");
        expect_close(F(&YH), yh, 36, "Y_h");
        expect_close(F(&YC), yc, 36, "Y_c");
        free(Y.data), free(YH.data), free(YC.data);
    }
    case_free(&k);
}

/* Only Y_c asked for (Y and Y_h absent), no optional input: zeros for
 * the states and biases, full lengths. */
static void test_lstm_outputs_optional(void **st) {
    (void)st;
    struct rnn_case k;
    case_init(&k, 3, 2, 3, 4, 1, 4);
    memset(k.b.data, 0, tensor_nbytes(&k.b));
    memset(k.h0.data, 0, tensor_nbytes(&k.h0));
    memset(k.c0.data, 0, tensor_nbytes(&k.c0));
    memset(k.p.data, 0, tensor_nbytes(&k.p));
    struct tnode tn;
    tn_init(&tn, "LSTM", 7);
    struct tensor YC = {0};
    const struct tensor *in[3] = {&k.x, &k.w, &k.r};
    struct tensor *out[3] = {NULL, NULL, &YC};
    assert_int_equal(tn_call(&tn.n, in, 3, out, 3, 1), 0);
    float y[3 * 2 * 4], yh[8], yc[8];
    lstm_ref(&k, y, yh, yc);
    expect_close(F(&YC), yc, 8, "Y_c");
    free(YC.data);
    case_free(&k);
}

/* ---- GRU ---------------------------------------------------------------- */

static void gru_case(int lbr, int D) {
    struct rnn_case k;
    case_init(&k, 4, 3, 5, 7, D, 3);
    struct tnode tn;
    tn_init(&tn, "GRU", 14);
    tn_int(&tn, "linear_before_reset", lbr);
    tn_str(&tn, "direction", dir_name(D));
    struct tensor Y = {0}, YH = {0};
    const struct tensor *in[6] = {&k.x, &k.w, &k.r, &k.b, NULL, &k.h0};
    struct tensor *out[2] = {&Y, &YH};
    assert_int_equal(tn_call(&tn.n, in, 6, out, 2, 1), 0);
    float y[4 * 2 * 3 * 7], yh[2 * 3 * 7];
    gru_ref(&k, lbr, y, yh);
    expect_close(F(&Y), y, 4 * D * 3 * 7, lbr ? "Y (linear_before_reset 1)" : "Y (linear_before_reset 0)");
    expect_close(F(&YH), yh, D * 3 * 7, "Y_h");
    free(Y.data), free(YH.data);
    case_free(&k);
}

static void test_gru_linear_before_reset(void **st) {
    (void)st;
    gru_case(0, 1);
    gru_case(1, 1);
    gru_case(0, 2);
    gru_case(1, 2);
}

/* ---- layout 1 ----------------------------------------------------------- */

/* [a, b, c] -> [b, a, c] */
static struct tensor swap01(const struct tensor *t) {
    struct tensor s = *t;
    s.dims[0] = t->dims[1], s.dims[1] = t->dims[0];
    s.data = malloc(tensor_nbytes(t));
    int64_t A = t->dims[0], Bd = t->dims[1], C = tensor_numel(t) / (A * Bd);
    for (int64_t a = 0; a < A; a++)
        for (int64_t b = 0; b < Bd; b++)
            memcpy(F(&s) + (b * A + a) * C, F(t) + (a * Bd + b) * C, sizeof(float) * (size_t)C);
    return s;
}

/* A bidirectional LSTM at layout 1 gives layout 0's outputs, transposed:
 * Y [T, D, B, H] becomes [B, T, D, H], the states [D, B, H] become [B, D, H]. */
static void test_layout_batch_major(void **st) {
    (void)st;
    struct rnn_case k;
    case_init(&k, 4, 3, 2, 5, 2, 4);
    k.len[0] = 1;
    struct tnode t0, t1;
    tn_init(&t0, "LSTM", 14);
    tn_str(&t0, "direction", "bidirectional");
    t1 = t0;
    t1.n.attrs = t1.a;
    tn_int(&t1, "layout", 1);
    struct tensor Y0 = {0}, H0 = {0}, C0 = {0}, Y1 = {0}, H1 = {0}, C1 = {0};
    const struct tensor *in0[8] = {&k.x, &k.w, &k.r, &k.b, &k.lens, &k.h0, &k.c0, &k.p};
    struct tensor xb = swap01(&k.x), hb = swap01(&k.h0), cb = swap01(&k.c0);
    const struct tensor *in1[8] = {&xb, &k.w, &k.r, &k.b, &k.lens, &hb, &cb, &k.p};
    struct tensor *out0[3] = {&Y0, &H0, &C0}, *out1[3] = {&Y1, &H1, &C1};
    assert_int_equal(tn_call(&t0.n, in0, 8, out0, 3, 1), 0);
    assert_int_equal(tn_call(&t1.n, in1, 8, out1, 3, 1), 0);
    assert_true(Y1.dims[0] == 3 && Y1.dims[1] == 4 && Y1.dims[2] == 2 && Y1.dims[3] == 5);
    assert_true(H1.dims[0] == 3 && H1.dims[1] == 2);
    for (int t = 0; t < 4; t++)
        for (int d = 0; d < 2; d++)
            for (int b = 0; b < 3; b++)
                expect_close(F(&Y1) + ((b * 4 + t) * 2 + d) * 5, F(&Y0) + ((t * 2 + d) * 3 + b) * 5, 5, "Y");
    struct tensor h0t = swap01(&H0), c0t = swap01(&C0);
    expect_close(F(&H1), F(&h0t), 30, "Y_h");
    expect_close(F(&C1), F(&c0t), 30, "Y_c");
    free(Y0.data), free(H0.data), free(C0.data), free(Y1.data), free(H1.data), free(C1.data);
    free(xb.data), free(hb.data), free(cb.data), free(h0t.data), free(c0t.data);
    case_free(&k);
}

/* ---- RNN ---------------------------------------------------------------- */

/* Reverse RNN with Affine (alpha 0.5, beta 0.25) and clip 0.3: h is
 * 0.5 * clip(x W^T + h R^T + b) + 0.25, from the last step back. */
static void test_rnn_affine_clip(void **st) {
    (void)st;
    struct rnn_case k;
    case_init(&k, 3, 2, 3, 4, 1, 1);
    struct tnode tn;
    tn_init(&tn, "RNN", 14);
    tn_str(&tn, "direction", "reverse");
    char *acts[1] = {"Affine"};
    tn_strs(&tn, "activations", 1, acts);
    tn_floats(&tn, "activation_alpha", 1, (float[]){0.5f});
    tn_floats(&tn, "activation_beta", 1, (float[]){0.25f});
    tn_float(&tn, "clip", 0.3f);
    struct tensor Y = {0};
    const struct tensor *in[6] = {&k.x, &k.w, &k.r, &k.b, NULL, &k.h0};
    struct tensor *out[1] = {&Y};
    assert_int_equal(tn_call(&tn.n, in, 6, out, 1, 1), 0);
    float want[3 * 2 * 4], a[4];
    for (int b = 0; b < 2; b++) {
        float h[4];
        memcpy(h, F(&k.h0) + b * 4, sizeof h);
        for (int t = 2; t >= 0; t--) {
            ref_gates(&k, 0, F(&k.x) + (t * 2 + b) * 3, h, a, NULL);
            for (int j = 0; j < 4; j++) h[j] = 0.5f * fminf(fmaxf(a[j], -0.3f), 0.3f) + 0.25f;
            memcpy(want + (t * 2 + b) * 4, h, sizeof h);
        }
    }
    expect_close(F(&Y), want, 24, "Y");
    free(Y.data);
    case_free(&k);
}

/* A bidirectional RNN given one direction's activations uses them for
 * both: the same as the list written out twice. */
static void test_rnn_one_list_for_both_directions(void **st) {
    (void)st;
    struct rnn_case k;
    case_init(&k, 3, 2, 3, 4, 2, 1);
    char *one[1] = {"Affine"}, *two[2] = {"Affine", "Affine"};
    struct tnode t1, t2;
    tn_init(&t1, "RNN", 14);
    tn_str(&t1, "direction", "bidirectional");
    tn_strs(&t1, "activations", 1, one);
    tn_floats(&t1, "activation_alpha", 1, (float[]){0.5f});
    tn_floats(&t1, "activation_beta", 1, (float[]){0.3f});
    tn_init(&t2, "RNN", 14);
    tn_str(&t2, "direction", "bidirectional");
    tn_strs(&t2, "activations", 2, two);
    tn_floats(&t2, "activation_alpha", 2, (float[]){0.5f, 0.5f});
    tn_floats(&t2, "activation_beta", 2, (float[]){0.3f, 0.3f});
    struct tensor Y1 = {0}, Y2 = {0};
    const struct tensor *in[6] = {&k.x, &k.w, &k.r, &k.b, NULL, &k.h0};
    struct tensor *o1[1] = {&Y1}, *o2[1] = {&Y2};
    assert_int_equal(tn_call(&t1.n, in, 6, o1, 1, 1), 0);
    assert_int_equal(tn_call(&t2.n, in, 6, o2, 1, 1), 0);
    assert_memory_equal(Y1.data, Y2.data, tensor_nbytes(&Y1));
    free(Y1.data), free(Y2.data);
    case_free(&k);
}

/* ---- refusals ----------------------------------------------------------- */

static void test_rnn_refusals(void **st) {
    (void)st;
    struct rnn_case k;
    case_init(&k, 2, 2, 3, 4, 1, 3);
    const struct tensor *in[3] = {&k.x, &k.w, &k.r};
    struct tensor Y = {0};
    struct tensor *out[1] = {&Y};
    struct tnode tn;

    tn_init(&tn, "GRU", 14);
    char *acts[2] = {"Sigmoid", "Cosh"};
    tn_strs(&tn, "activations", 2, acts);
    assert_int_equal(tn_call(&tn.n, in, 3, out, 1, 1), STATUS_INVALID);
    assert_non_null(strstr(g_err, "unknown activation 'Cosh'"));

    tn_init(&tn, "GRU", 14);
    tn_int(&tn, "hidden_size", 5);
    assert_int_equal(tn_call(&tn.n, in, 3, out, 1, 1), STATUS_INVALID);
    assert_non_null(strstr(g_err, "hidden_size is 5"));

    tn_init(&tn, "GRU", 14);
    tn_str(&tn, "direction", "bidirectional");
    assert_int_equal(tn_call(&tn.n, in, 3, out, 1, 1), STATUS_INVALID);
    assert_non_null(strstr(g_err, "W has shape"));

    tn_init(&tn, "GRU", 14);
    k.len[1] = 3;
    const struct tensor *in_len[5] = {&k.x, &k.w, &k.r, NULL, &k.lens};
    assert_int_equal(tn_call(&tn.n, in_len, 5, out, 1, 1), STATUS_INVALID);
    assert_non_null(strstr(g_err, "sequence_lens[1] is 3"));
    free(Y.data);
    case_free(&k);
}

/* ---- DynamicQuantizeLSTM ----------------------------------------------- */

/* onnxruntime's quantization of a GEMM's left operand: the scale and zero
 * point of its GetQuantizationParameter over the first n_range values (the
 * range widened to hold 0; scale 1 for an empty range), then
 * MlasQuantizeLinear (round half to even, saturated) of all n. */
static float ort_quant(const float *a, int64_t n_range, int64_t n, uint8_t *q, int *zp) {
    float mn = 0, mx = 0;
    for (int64_t i = 0; i < n_range; i++) mn = a[i] < mn ? a[i] : mn, mx = a[i] > mx ? a[i] : mx;
    float scale = mx == mn ? 1.0f : (mx - mn) / 255.0f, z0 = 0 - mn / scale;
    *zp = (int)nearbyintf(z0 < 0 ? 0 : z0 > 255 ? 255 : z0);
    for (int64_t i = 0; i < n; i++) {
        float v = nearbyintf(a[i] / scale) + (float)*zp;
        q[i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
    }
    return scale;
}

/* 8-bit weights [D, K, 4H] with a scale and zero point per direction or
 * per column; dequantized they lie within about [-1, 1]. */
struct dq_weights {
    struct tensor q, scale, zp;
    int per;
};

static void dq_weights_init(struct dq_weights *w, enum dtype dt, int D, int K, int GH, int per, int zero_zp) {
    int64_t nz = per ? GH : 1, dims[3] = {D, K, GH}, sd[2] = {D, GH};
    w->per = per;
    w->q = (struct tensor){dt, 3, {D, K, GH}, malloc((size_t)(D * K * GH))};
    w->scale = (struct tensor){DT_FP32, per ? 2 : 1, {D, GH}, malloc(sizeof(float) * (size_t)(D * nz))};
    w->zp = (struct tensor){dt, per ? 2 : 1, {D, GH}, malloc((size_t)(D * nz))};
    (void)dims, (void)sd;
    for (int64_t i = 0; i < D * nz; i++) {
        ((float *)w->scale.data)[i] = (1.0f + 0.5f * tn_frand()) / 127.0f;
        /* onnxruntime: an int8 W's zero points are 0, a uint8 W's one value */
        if (dt == DT_INT8) ((int8_t *)w->zp.data)[i] = 0;
        else ((uint8_t *)w->zp.data)[i] = zero_zp ? 128 : 120;
    }
    for (int64_t i = 0; i < D * K * GH; i++) {
        int v = (int)nearbyintf(127.0f * tn_frand());
        if (dt == DT_INT8) ((int8_t *)w->q.data)[i] = (int8_t)v;
        else ((uint8_t *)w->q.data)[i] = (uint8_t)(v + 128);
    }
}

static void dq_weights_free(struct dq_weights *w) { free(w->q.data), free(w->scale.data), free(w->zp.data); }

static float dq_w(const struct dq_weights *w, int d, int K, int GH, int k, int q) {
    int64_t zi = w->per ? d * GH + q : d;
    double v = op_double_at(&w->q, ((int64_t)d * K + k) * GH + q) - op_double_at(&w->zp, zi);
    return (float)v; /* integer: exact */
}
static float dq_scale(const struct dq_weights *w, int d, int GH, int q) {
    return ((float *)w->scale.data)[w->per ? d * GH + q : d];
}

/* onnxruntime's DynamicQuantizeLSTM (its ComputeGemm on quantized weights
 * in UniDirectionalLstm, at one thread), default activations: X projected
 * over the steps any row runs, quantized as one block; at each step the
 * hidden state of all rows quantized as one block, rows that ended before
 * the previous step zeros when Y is written. */
static void dqlstm_ref(const struct rnn_case *k, const struct dq_weights *W, const struct dq_weights *R, int with_y,
                       float *y, float *yh, float *yc) {
    int T = k->T, B = k->B, I = k->I, H = k->H, D = k->D, GH = 4 * H, maxlen = 0;
    for (int b = 0; b < B; b++) maxlen = k->len[b] > maxlen ? k->len[b] : maxlen;
    float *gx = malloc(sizeof(float) * (size_t)(T * B * GH));
    uint8_t *xq = malloc((size_t)(T * B * I)), hq[8 * MAXH];
    memset(y, 0, sizeof(float) * (size_t)(T * D * B * H));
    for (int d = 0; d < D; d++) {
        int xz;
        float xs = ort_quant(F(&k->x), (int64_t)maxlen * B * I, (int64_t)T * B * I, xq, &xz);
        for (int r = 0; r < T * B; r++)
            for (int q = 0; q < GH; q++) {
                int32_t acc = 0;
                for (int i = 0; i < I; i++) acc += (int32_t)(xq[r * I + i] - xz) * (int32_t)dq_w(W, d, I, GH, i, q);
                gx[r * GH + q] = (float)acc * (xs * dq_scale(W, d, GH, q));
            }
        float h[8][MAXH], c[8][MAXH], hb[8 * MAXH];
        const float *bias = F(&k->b) + d * 2 * GH;
        for (int b = 0; b < B; b++) {
            memcpy(h[b], F(&k->h0) + (d * B + b) * H, sizeof(float) * (size_t)H);
            memcpy(c[b], F(&k->c0) + (d * B + b) * H, sizeof(float) * (size_t)H);
        }
        for (int s = 0; s < maxlen; s++) {
            for (int b = 0; b < B; b++)
                for (int j = 0; j < H; j++) hb[b * H + j] = with_y && s > 0 && k->len[b] < s ? 0 : h[b][j];
            int hz;
            float hs = ort_quant(hb, B * H, B * H, hq, &hz);
            for (int b = 0; b < B; b++) {
                int L = k->len[b];
                if (s >= L) continue;
                int t = d ? L - 1 - s : s;
                float a[4 * MAXH];
                for (int q = 0; q < GH; q++) {
                    int32_t acc = 0;
                    for (int j = 0; j < H; j++) acc += (int32_t)(hq[b * H + j] - hz) * (int32_t)dq_w(R, d, H, GH, j, q);
                    a[q] = gx[(t * B + b) * GH + q] + (float)acc * (hs * dq_scale(R, d, GH, q)) + bias[q] + bias[GH + q];
                }
                for (int j = 0; j < H; j++) {
                    float i = sig(a[j]), o = sig(a[H + j]), f = sig(a[2 * H + j]);
                    c[b][j] = f * c[b][j] + i * tanhf(a[3 * H + j]);
                    h[b][j] = o * tanhf(c[b][j]);
                    y[((t * D + d) * B + b) * H + j] = h[b][j];
                }
            }
        }
        for (int b = 0; b < B; b++)
            for (int j = 0; j < H; j++) {
                yh[(d * B + b) * H + j] = k->len[b] ? h[b][j] : 0;
                yc[(d * B + b) * H + j] = k->len[b] ? c[b][j] : 0;
            }
    }
    free(gx), free(xq);
}

/* got against onnxruntime's arithmetic. Both quantize the same floats by
 * the same rule, so they agree to float32 rounding (1e-5 here) except
 * where a value that lands within rounding of a half step of the
 * quantization grid rounds the other way: that moves one term of a gate's
 * sum by one step of the grid times one dequantized weight. tol bounds a
 * few such flips; at most 2% of the elements may use it. */
static void expect_quantized_close(const float *got, const float *want, int64_t n, float tol, const char *what) {
    int64_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        float e = fabsf(got[i] - want[i]);
        if (!(e <= tol)) fail_msg("%s: element %lld is %.7g, expected %.7g (tolerance %g)", what, (long long)i, got[i], want[i], tol);
        off += e > 1e-5f + 1e-5f * fabsf(want[i]);
    }
    if (off * 50 > n) fail_msg("%s: %lld of %lld elements beyond float rounding", what, (long long)off, (long long)n);
}

/* DynamicQuantizeLSTM (com.microsoft) against dqlstm_ref: bidirectional
 * with sequence_lens (a row ending early, one shorter still), initial
 * states, int8 W per column and uint8 R per direction with a zero point;
 * then forward without Y (the ended rows keep their state in the
 * quantized block), uint8 W per column and int8 R. One and two threads. */
static void test_dynamic_quantize_lstm(void **st) {
    (void)st;
    for (int form = 0; form < 2; form++) {
        const int T = 6, B = 3, I = 5, H = 8, D = form ? 1 : 2, GH = 4 * H;
        struct rnn_case k;
        case_init(&k, T, B, I, H, D, 4);
        k.len[1] = 4;
        k.len[2] = form ? 2 : 1;
        struct dq_weights W, R;
        dq_weights_init(&W, form ? DT_UINT8 : DT_INT8, D, I, GH, 1, 0);
        dq_weights_init(&R, form ? DT_INT8 : DT_UINT8, D, H, GH, 0, form);
        struct tnode tn;
        tn_init_domain(&tn, "com.microsoft", "DynamicQuantizeLSTM", 1);
        tn_str(&tn, "direction", dir_name(D));
        tn_int(&tn, "hidden_size", H);
        const struct tensor *in[12] = {&k.x, &W.q, &R.q, &k.b, &k.lens, &k.h0, &k.c0, NULL,
                                       &W.scale, &W.zp, &R.scale, &R.zp};
        float y[6 * 2 * 3 * 8], yh[2 * 3 * 8], yc[2 * 3 * 8];
        dqlstm_ref(&k, &W, &R, !form, y, yh, yc);
        /* a flip: one grid step of x or h (ranges within [-1, 1] and
         * [-1, 1]: 2 / 255) times a weight of at most about 1.5 */
        const float tol = 4 * (2.0f / 255.0f) * 1.5f;
        for (int nt = 1; nt <= 2; nt++) {
            struct tensor Y = {0}, YH = {0}, YC = {0};
            struct tensor *out[3] = {form ? NULL : &Y, &YH, &YC};
            if (tn_call(&tn.n, in, 12, out, 3, nt)) fail_msg("DynamicQuantizeLSTM: %s", g_err);
            if (!form) {
                assert_true(Y.ndim == 4 && Y.dims[0] == T && Y.dims[1] == D && Y.dims[2] == B && Y.dims[3] == H);
                expect_quantized_close(F(&Y), y, T * D * B * H, tol, "Y");
            }
            expect_quantized_close(F(&YH), yh, D * B * H, tol, "Y_h");
            expect_quantized_close(F(&YC), yc, D * B * H, tol, "Y_c");
            free(Y.data), free(YH.data), free(YC.data);
        }
        /* refusals: a float W; a missing zero point; R given at run time */
        struct tensor Y = {0};
        struct tensor *out1[1] = {&Y};
        const struct tensor *bad[12] = {&k.x, &k.w, &R.q, &k.b, &k.lens, &k.h0, &k.c0, NULL,
                                        &W.scale, &W.zp, &R.scale, &R.zp};
        tn_expect_error(&tn.n, bad, 12, out1, 1, "W must be uint8 or int8");
        tn_expect_error(&tn.n, in, 11, out1, 1, "R_zero_point is required");
        g_runtime_inputs = 4;
        tn_expect_error(&tn.n, in, 12, out1, 1, "must be constant");
        g_runtime_inputs = 0;
        dq_weights_free(&W), dq_weights_free(&R);
        case_free(&k);
    }
}

int main(void) {
    g_run_without_attrs = 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lstm_bidirectional_seq_lens), cmocka_unit_test(test_lstm_outputs_optional),
        cmocka_unit_test(test_gru_linear_before_reset),     cmocka_unit_test(test_layout_batch_major),
        cmocka_unit_test(test_rnn_affine_clip),             cmocka_unit_test(test_rnn_one_list_for_both_directions),
        cmocka_unit_test(test_rnn_refusals),                cmocka_unit_test(test_dynamic_quantize_lstm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
