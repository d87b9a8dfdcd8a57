/* test_ops_nn.c - the nn family against naive reference loops written here:
 * Conv (groups, depthwise, dilations, strides, pads, auto_pad, 1-D/3-D, both
 * layouts; identical filters give channels equal to the bit), MatMul
 * (broadcast, 1-D operands, fused bias), Gemm (transposes, alpha/beta, C
 * shapes), every fused activation, the pools (Indices, ceil,
 * count_include_pad), BatchNormalization, InstanceNormalization, LRN;
 * concurrent runs on one prepared state; run() reading only what prepare
 * decoded; clear refusals. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/cpu/dnnl_util.h"
#include "kernels/cpu/layout_util.h"
#include "kernels/ops.h"
#include "tests/kernels/harness.h"

/* ---- helpers ------------------------------------------------------------ */

static uint64_t g_rng = 88172645463325252ull;
static float frand(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((g_rng >> 11) % 2000001) / 1000000.0f - 1.0f;
}

static struct tensor mk(int ndim, const int64_t *dims, int fill) {
    struct tensor t = {DT_FP32, ndim, {0}, NULL};
    for (int i = 0; i < ndim; i++) t.dims[i] = dims[i];
    int64_t n = tensor_numel(&t);
    t.data = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    if (fill)
        for (int64_t i = 0; i < n; i++) ((float *)t.data)[i] = frand();
    return t;
}

/* A node with up to 8 attributes. */
static void assert_int_equal_msg_impl(int a, int b, const char *msg) {
    if (a != b) fail_msg("status %d (expected %d): %s", a, b, msg);
}

static int run_node(const struct graph_node *n, struct tensor **in, int nin, struct tensor **out, int nout,
                    int nthreads) {
    return tn_call(n, (const struct tensor *const *)in, nin, out, nout, nthreads);
}

static void expect_close(const float *got, const float *want, int64_t n, float tol, const char *what) {
    for (int64_t i = 0; i < n; i++) {
        float d = fabsf(got[i] - want[i]);
        if (!(d <= tol * (1.0f + fabsf(want[i])))) {
            fail_msg("%s: element %lld is %g, expected %g", what, (long long)i, got[i], want[i]);
        }
    }
}

/* ---- Conv ----------------------------------------------------------------- */

struct conv_case {
    int nsp;
    int64_t n, c, m, group;
    int64_t in[3], k[3], s[3], d[3], pl[3], pr[3];
    const char *auto_pad;
    int bias;
    enum act_kind act;
    float aa, ab;
};

static void conv_ref(const struct conv_case *cc, const float *x, const float *w, const float *b, float *y,
                     const int64_t *out) {
    int64_t in[3] = {1, 1, 1}, k[3] = {1, 1, 1}, s[3] = {1, 1, 1}, d[3] = {1, 1, 1}, pl[3] = {0}, o[3] = {1, 1, 1};
    for (int i = 0; i < cc->nsp; i++) {
        in[i] = cc->in[i]; k[i] = cc->k[i]; s[i] = cc->s[i]; d[i] = cc->d[i]; pl[i] = cc->pl[i]; o[i] = out[i];
    }
    int64_t cg = cc->c / cc->group, mg = cc->m / cc->group;
    int64_t isz = in[0] * in[1] * in[2], osz = o[0] * o[1] * o[2], ksz = k[0] * k[1] * k[2];
    for (int64_t nn = 0; nn < cc->n; nn++)
        for (int64_t m = 0; m < cc->m; m++) {
            int64_t g = m / mg;
            for (int64_t o0 = 0; o0 < o[0]; o0++)
                for (int64_t o1 = 0; o1 < o[1]; o1++)
                    for (int64_t o2 = 0; o2 < o[2]; o2++) {
                        double acc = b ? b[m] : 0;
                        for (int64_t ci = 0; ci < cg; ci++)
                            for (int64_t t0 = 0; t0 < k[0]; t0++)
                                for (int64_t t1 = 0; t1 < k[1]; t1++)
                                    for (int64_t t2 = 0; t2 < k[2]; t2++) {
                                        int64_t i0 = o0 * s[0] - pl[0] + t0 * d[0];
                                        int64_t i1 = o1 * s[1] - pl[1] + t1 * d[1];
                                        int64_t i2 = o2 * s[2] - pl[2] + t2 * d[2];
                                        if (i0 < 0 || i0 >= in[0] || i1 < 0 || i1 >= in[1] || i2 < 0 || i2 >= in[2])
                                            continue;
                                        acc += x[(nn * cc->c + g * cg + ci) * isz + (i0 * in[1] + i1) * in[2] + i2] *
                                               w[(m * cg + ci) * ksz + (t0 * k[1] + t1) * k[2] + t2];
                                    }
                        y[(nn * cc->m + m) * osz + (o0 * o[1] + o1) * o[2] + o2] =
                            act_apply(cc->act, (float)acc, cc->aa, cc->ab);
                    }
        }
}

static void run_conv_case(struct conv_case cc, const char *layout) {
    int nd = cc.nsp + 2;
    int64_t xd[5] = {cc.n, cc.c}, wd[5] = {cc.m, cc.c / cc.group}, out[3];
    for (int i = 0; i < cc.nsp; i++) {
        xd[2 + i] = cc.in[i];
        wd[2 + i] = cc.k[i];
    }
    struct tensor x = mk(nd, xd, 1), w = mk(nd, wd, 1), b = mk(1, &cc.m, 1), y = {0};
    struct tnode t;
    tn_init(&t, "Conv", 0);
    int64_t pads[6];
    for (int i = 0; i < cc.nsp; i++) {
        pads[i] = cc.pl[i];
        pads[cc.nsp + i] = cc.pr[i];
    }
    tn_ints(&t, "strides", cc.nsp, cc.s);
    tn_ints(&t, "dilations", cc.nsp, cc.d);
    if (cc.auto_pad) tn_str(&t, "auto_pad", cc.auto_pad);
    else tn_ints(&t, "pads", 2 * cc.nsp, pads);
    tn_int(&t, "group", cc.group);
    t.n.act = cc.act;
    t.n.act_alpha = cc.aa;
    t.n.act_beta = cc.ab;
    setenv("KILN_CONV_LAYOUT", layout, 1);
    struct tensor *in[3] = {&x, &w, cc.bias ? &b : NULL}, *o[1] = {&y};
    int rc = run_node(&t.n, in, 3, o, 1, 2);
    unsetenv("KILN_CONV_LAYOUT");
    assert_int_equal_msg_impl(rc, 0, g_err);
    /* The reference needs explicit pads: recompute SAME's split here. */
    for (int i = 0; i < cc.nsp; i++) {
        out[i] = y.dims[2 + i];
        if (cc.auto_pad && strncmp(cc.auto_pad, "SAME", 4) == 0) {
            int64_t dk = (cc.k[i] - 1) * cc.d[i] + 1, total = (out[i] - 1) * cc.s[i] + dk - cc.in[i];
            if (total < 0) total = 0;
            cc.pl[i] = strcmp(cc.auto_pad, "SAME_UPPER") == 0 ? total / 2 : total - total / 2;
        } else if (cc.auto_pad) {
            cc.pl[i] = 0;
        }
    }
    float *ref = malloc(tensor_nbytes(&y));
    conv_ref(&cc, x.data, w.data, cc.bias ? b.data : NULL, ref, out);
    expect_close(y.data, ref, tensor_numel(&y), 1e-4f, "Conv");
    free(ref);
    free(x.data);
    free(w.data);
    free(b.data);
    free(y.data);
}

static void test_conv_cases(void **st) {
    (void)st;
    struct conv_case cases[] = {
        /* nsp n c m group in k s d pl pr auto bias act */
        {2, 1, 3, 8, 1, {9, 11}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}, NULL, 1, ACT_NONE, 0, 0},
        {2, 2, 8, 16, 1, {10, 10}, {3, 3}, {2, 2}, {1, 1}, {1, 0}, {0, 1}, NULL, 1, ACT_RELU, 0, 0},
        {2, 1, 16, 16, 16, {12, 12}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}, NULL, 1, ACT_CLIP, 0, 6},   /* depthwise */
        {2, 1, 8, 12, 4, {9, 9}, {3, 3}, {1, 2}, {2, 2}, {2, 2}, {2, 2}, NULL, 0, ACT_LEAKY_RELU, 0.1f, 0},
        {2, 1, 4, 6, 1, {7, 8}, {2, 3}, {2, 2}, {1, 1}, {0}, {0}, "SAME_UPPER", 1, ACT_SIGMOID, 0, 0},
        {2, 1, 4, 6, 1, {7, 8}, {2, 3}, {2, 1}, {1, 1}, {0}, {0}, "SAME_LOWER", 1, ACT_TANH, 0, 0},
        {2, 1, 4, 6, 1, {7, 8}, {3, 3}, {2, 2}, {1, 1}, {0}, {0}, "VALID", 1, ACT_GELU, 0, 0},
        {2, 1, 32, 64, 1, {7, 7}, {1, 1}, {1, 1}, {1, 1}, {0}, {0}, NULL, 1, ACT_HARD_SWISH, 0, 0},
        {2, 1, 32, 24, 1, {14, 14}, {1, 1}, {2, 2}, {1, 1}, {0}, {0}, NULL, 1, ACT_HARD_SIGMOID, 0.2f, 0.5f},
        {2, 2, 32, 48, 1, {14, 14}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}, NULL, 1, ACT_RELU, 0, 0}, /* Winograd */
        {1, 2, 5, 7, 1, {20}, {4}, {3}, {2}, {1}, {2}, NULL, 1, ACT_RELU, 0, 0},
        {3, 1, 3, 4, 1, {5, 6, 7}, {3, 2, 3}, {1, 2, 1}, {1, 1, 2}, {1, 0, 1}, {1, 1, 0}, NULL, 1, ACT_NONE, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run_conv_case(cases[i], "plain");
        run_conv_case(cases[i], "blocked");
        run_conv_case(cases[i], "auto");
        g_runtime_inputs = 6; /* W and B computed at run time: no reorder at prepare */
        run_conv_case(cases[i], "auto");
        run_conv_case(cases[i], "blocked");
        g_runtime_inputs = 0;
    }
}

/* Identical filters give identical output channels, bit for bit, on every
 * ISA, with weights constant or computed at run time: a model whose
 * channels tie (ONNX's light SqueezeNet: 1000 equal logits, then Softmax)
 * keeps the tie. oneDNN's AVX2 GEMM rounds a few trailing columns (output
 * channels here) differently from the rest: SqueezeNet's last 1x1 Conv made
 * channels 954, 955, 998 and 999 of 1000 differ there. Grouped convolutions
 * whose groups are not whole blocks of 8 channels have no blocked kernel
 * and stay on the GEMM, so the grouped case here has whole blocks. */
static void test_conv_identical_filters(void **st) {
    (void)st;
    struct { int64_t c, m, group, k, in; } cases[] = {
        /* c m group k in (square) */
        {512, 1000, 1, 1, 13}, {16, 14, 1, 1, 9}, {64, 8, 1, 1, 5}, {32, 64, 2, 1, 6}, {16, 1000, 1, 3, 5},
    };
    const char *layouts[] = {"auto", "blocked"}; /* "plain" asks for the GEMM itself */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int runtime_w = 0; runtime_w < 2; runtime_w++)
            for (size_t l = 0; l < sizeof layouts / sizeof layouts[0]; l++) {
                int64_t cg = cases[i].c / cases[i].group, k = cases[i].k;
                int64_t xd[4] = {1, cases[i].c, cases[i].in, cases[i].in}, wd[4] = {cases[i].m, cg, k, k};
                struct tensor x = mk(4, xd, 1), w = mk(4, wd, 0), b = mk(1, &cases[i].m, 0), y = {0};
                int64_t per = cg * k * k;
                for (int64_t j = 0; j < per; j++) ((float *)w.data)[j] = frand();
                for (int64_t m = 1; m < cases[i].m; m++) memcpy((float *)w.data + m * per, w.data, sizeof(float) * per);
                for (int64_t m = 0; m < cases[i].m; m++) ((float *)b.data)[m] = 0.25f;
                struct tnode t;
                tn_init(&t, "Conv", 0);
                int64_t pads[4] = {k / 2, k / 2, k / 2, k / 2};
                tn_ints(&t, "pads", 4, pads);
                tn_int(&t, "group", cases[i].group);
                setenv("KILN_CONV_LAYOUT", layouts[l], 1);
                g_runtime_inputs = runtime_w ? 2 : 0;
                struct tensor *in[3] = {&x, &w, &b}, *o[1] = {&y};
                int rc = run_node(&t.n, in, 3, o, 1, 1);
                g_runtime_inputs = 0;
                unsetenv("KILN_CONV_LAYOUT");
                assert_int_equal_msg_impl(rc, 0, g_err);
                /* Within a group every channel sees the same inputs. */
                int64_t mg = cases[i].m / cases[i].group, hw = cases[i].in * cases[i].in;
                const float *yd = y.data;
                for (int64_t m = 0; m < cases[i].m; m++) {
                    const float *first = yd + (m / mg) * mg * hw;
                    if (memcmp(yd + m * hw, first, sizeof(float) * hw))
                        fail_msg("case %zu (%s layout, %s weights): channel %lld differs from its group's first "
                                 "(%.9g vs %.9g)", i, layouts[l], runtime_w ? "run-time" : "constant", (long long)m,
                                 yd[m * hw], first[0]);
                }
                free(x.data);
                free(w.data);
                free(b.data);
                free(y.data);
            }
}

/* A Conv with a fused quantization round trip (ACT_QDQ) whose sum lies
 * exactly on a half step quantizes as the exact sum does, on every ISA.
 * Each output sums -(0.5 + 2^-11) * 1 and (1 + 2^-12)^2 = 1 + 2^-11 + 2^-24:
 * 0.5 + 2^-24, which rounds to 1 step. A product rounded before it is
 * added (SSE4.1 has no FMA) loses the 2^-24, the sum is 0.5 and rounds
 * half to even to 0: ONEDNN_MAX_CPU_ISA=SSE41 answered 0 everywhere. The
 * plain layout (oneDNN's GEMM) is not asked of AVX2, which never runs it
 * (conv_use_blocked) and whose GEMM tails add in another order. */
static void test_conv_qdq_tie(void **st) {
    (void)st;
    const char *layouts[] = {"auto", "blocked", "plain", "nhwc"};
    for (int k = 1; k <= 3; k += 2)
        for (size_t l = 0; l < sizeof layouts / sizeof layouts[0]; l++) {
            int nhwc = strcmp(layouts[l], "nhwc") == 0;
            if (strcmp(layouts[l], "plain") == 0 && dnnl_util_isa_avx2()) continue;
            int64_t m = 8, hw = 5 * 5, xd[4] = {1, 2, 5, 5}, wd[4] = {m, 2, k, k};
            struct tensor x = mk(4, xd, 0), w = mk(4, wd, 0), b = mk(1, &m, 0), y = {0};
            float *xv = x.data, *wv = w.data;
            for (int64_t i = 0; i < hw; i++) {
                xv[nhwc ? 2 * i : i] = -(0.5f + 0x1p-11f);
                xv[nhwc ? 2 * i + 1 : hw + i] = 1.0f + 0x1p-12f;
            }
            memset(w.data, 0, tensor_nbytes(&w));
            for (int64_t o = 0; o < m; o++) {
                wv[(o * 2 + 0) * k * k + k * k / 2] = 1.0f; /* the centre tap */
                wv[(o * 2 + 1) * k * k + k * k / 2] = 1.0f + 0x1p-12f;
                ((float *)b.data)[o] = 0.0f;
            }
            struct tnode t;
            tn_init(&t, "Conv", 0);
            int64_t pads[4] = {k / 2, k / 2, k / 2, k / 2};
            tn_ints(&t, "pads", 4, pads);
            if (nhwc) tn_int(&t, "kiln_layout", 3);
            t.n.act = ACT_QDQ;
            t.n.act_alpha = 1.0f;   /* scale 1: steps are units */
            t.n.act_beta = -128.0f; /* int8, zero point 0 */
            if (!nhwc) setenv("KILN_CONV_LAYOUT", layouts[l], 1);
            struct tensor *in[3] = {&x, &w, &b}, *o[1] = {&y};
            int rc = run_node(&t.n, in, 3, o, 1, 1);
            unsetenv("KILN_CONV_LAYOUT");
            assert_int_equal_msg_impl(rc, 0, g_err);
            for (int64_t i = 0; i < tensor_numel(&y); i++)
                if (((float *)y.data)[i] != 1.0f)
                    fail_msg("%lldx%lld kernel, %s layout: output %lld is %g steps, expected 1 (0.5 + 2^-24 rounded)",
                             (long long)k, (long long)k, layouts[l], (long long)i, ((float *)y.data)[i]);
            free(x.data);
            free(w.data);
            free(b.data);
            free(y.data);
        }
}

/* Conv weights arriving at run time (not constant at plan time) and a
 * shape error that names the problem. */
static void test_conv_errors(void **st) {
    (void)st;
    int64_t xd[4] = {1, 3, 5, 5}, wd[4] = {4, 2, 3, 3};
    struct tensor x = mk(4, xd, 1), w = mk(4, wd, 1), y = {0};
    struct tnode t;
    tn_init(&t, "Conv", 0);
    struct tensor *in[2] = {&x, &w}, *o[1] = {&y};
    int rc = run_node(&t.n, in, 2, o, 1, 1);
    assert_int_not_equal(rc, 0);
    assert_non_null(strstr(g_err, "channels"));
    assert_non_null(strstr(g_err, "node 'n0' (Conv)"));
    /* a window larger than the padded input */
    int64_t xd2[4] = {1, 2, 2, 2}, wd2[4] = {4, 2, 3, 3};
    struct tensor x2 = mk(4, xd2, 1), w2 = mk(4, wd2, 1);
    struct tensor *in2[2] = {&x2, &w2};
    y = (struct tensor){0};
    assert_int_not_equal(run_node(&t.n, in2, 2, o, 1, 1), 0);
    assert_non_null(strstr(g_err, "larger than the padded input"));
    /* MatMul inner dims, Gemm ranks, pools without kernel_shape, int inputs */
    int64_t ad[2] = {3, 4}, bd[2] = {5, 6}, a3[3] = {2, 3, 4};
    struct tensor a = mk(2, ad, 1), b = mk(2, bd, 1), a3t = mk(3, a3, 1);
    struct tnode mm;
    tn_init(&mm, "MatMul", 0);
    struct tensor *in3[2] = {&a, &b};
    assert_int_not_equal(run_node(&mm.n, in3, 2, o, 1, 1), 0);
    assert_non_null(strstr(g_err, "inner dims differ"));
    tn_init(&mm, "Gemm", 0);
    struct tensor *in4[2] = {&a3t, &b};
    assert_int_not_equal(run_node(&mm.n, in4, 2, o, 1, 1), 0);
    assert_non_null(strstr(g_err, "must be 2-D"));
    tn_init(&mm, "MaxPool", 0);
    struct tensor *in5[1] = {&x};
    assert_int_not_equal(run_node(&mm.n, in5, 1, o, 1, 1), 0);
    assert_non_null(strstr(g_err, "kernel_shape"));
    struct tensor xi = x;
    xi.dtype = DT_INT32;
    struct tensor *in6[2] = {&xi, &w};
    assert_int_equal(run_node(&t.n, in6, 2, o, 1, 1), STATUS_UNSUPPORTED);
    assert_non_null(strstr(g_err, "float32"));
    free(x.data);
    free(w.data);
    free(x2.data);
    free(w2.data);
    free(a.data);
    free(b.data);
    free(a3t.data);
}

/* ConvTranspose against a scatter-add reference (the kernel gathers):
 * oneDNN's deconvolution where it applies, the loop for output_padding
 * beyond the pads and weights known only at run time, and the product of
 * patches (kernel = stride, at most 8 outputs: DBNet's 24 -> 1 head, its
 * output_padding and dilation left to the others). */
static void test_conv_transpose(void **st) {
    (void)st;
    struct { int64_t n, c, m, g, in[2], k[2], s[2], d[2], pl[2], pr[2], op[2]; int runtime_w; enum act_kind act; } cases[] = {
        {1, 3, 4, 1, {5, 4}, {3, 3}, {2, 2}, {1, 1}, {1, 0}, {1, 1}, {0, 0}, 0, ACT_NONE},
        {2, 4, 6, 2, {4, 4}, {3, 2}, {2, 1}, {1, 2}, {0, 1}, {0, 0}, {1, 0}, 0, ACT_RELU},
        {1, 16, 16, 1, {7, 7}, {4, 4}, {2, 2}, {1, 1}, {1, 1}, {1, 1}, {0, 0}, 0, ACT_TANH},
        {1, 2, 3, 1, {3, 3}, {3, 3}, {3, 2}, {1, 1}, {0, 0}, {0, 0}, {2, 1}, 0, ACT_NONE},
        {1, 2, 3, 1, {3, 3}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, {1, 1}, {0, 0}, 1, ACT_NONE},
        {2, 24, 1, 1, {6, 5}, {2, 2}, {2, 2}, {1, 1}, {0, 0}, {0, 0}, {0, 0}, 0, ACT_SIGMOID},
        {1, 5, 3, 1, {4, 7}, {3, 1}, {3, 1}, {1, 1}, {0, 0}, {0, 0}, {0, 0}, 1, ACT_RELU},
        {1, 4, 8, 1, {3, 3}, {2, 2}, {2, 2}, {1, 1}, {0, 0}, {0, 0}, {1, 0}, 0, ACT_NONE},
        {1, 4, 2, 1, {3, 3}, {2, 2}, {2, 2}, {2, 1}, {0, 0}, {0, 0}, {0, 0}, 0, ACT_NONE},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        __typeof__(cases[0]) *k = &cases[ci];
        int64_t xd[4] = {k->n, k->c, k->in[0], k->in[1]}, wd[4] = {k->c, k->m / k->g, k->k[0], k->k[1]};
        struct tensor x = mk(4, xd, 1), w = mk(4, wd, 1), b = mk(1, &k->m, 1), y = {0};
        struct tnode t;
        tn_init(&t, "ConvTranspose", 0);
        int64_t pads[4] = {k->pl[0], k->pl[1], k->pr[0], k->pr[1]};
        tn_ints(&t, "strides", 2, k->s);
        tn_ints(&t, "dilations", 2, k->d);
        tn_ints(&t, "pads", 4, pads);
        tn_ints(&t, "output_padding", 2, k->op);
        tn_int(&t, "group", k->g);
        t.n.act = k->act;
        struct tensor *in[3] = {&x, &w, &b}, *o[1] = {&y};
        g_runtime_inputs = k->runtime_w ? 2 : 0;
        int rc = run_node(&t.n, in, 3, o, 1, 2);
        g_runtime_inputs = 0;
        assert_int_equal_msg_impl(rc, 0, g_err);
        int64_t oh = y.dims[2], ow = y.dims[3];
        for (int i = 0; i < 2; i++)
            assert_int_equal(y.dims[2 + i], (k->in[i] - 1) * k->s[i] + (k->k[i] - 1) * k->d[i] + 1 + k->op[i] - k->pl[i] - k->pr[i]);
        double *ref = calloc((size_t)tensor_numel(&y), sizeof(double));
        int64_t cg = k->c / k->g, mg = k->m / k->g;
        const float *X = x.data, *W = w.data, *B = b.data;
        for (int64_t nn = 0; nn < k->n; nn++)
            for (int64_t c = 0; c < k->c; c++)
                for (int64_t ih = 0; ih < k->in[0]; ih++)
                    for (int64_t iw = 0; iw < k->in[1]; iw++)
                        for (int64_t mm = 0; mm < mg; mm++)
                            for (int64_t th = 0; th < k->k[0]; th++)
                                for (int64_t tw = 0; tw < k->k[1]; tw++) {
                                    int64_t h = ih * k->s[0] - k->pl[0] + th * k->d[0];
                                    int64_t ww = iw * k->s[1] - k->pl[1] + tw * k->d[1];
                                    if (h < 0 || h >= oh || ww < 0 || ww >= ow) continue;
                                    int64_t m = (c / cg) * mg + mm;
                                    ref[((nn * k->m + m) * oh + h) * ow + ww] +=
                                        X[((nn * k->c + c) * k->in[0] + ih) * k->in[1] + iw] *
                                        W[((c * mg + mm) * k->k[0] + th) * k->k[1] + tw];
                                }
        for (int64_t i = 0; i < tensor_numel(&y); i++) {
            float want = act_apply(k->act, (float)(ref[i] + B[(i / (oh * ow)) % k->m]), 0, 0);
            float got = ((float *)y.data)[i];
            if (fabsf(got - want) > 1e-4f * (1 + fabsf(want)))
                fail_msg("ConvTranspose case %zu element %lld: %g vs %g", ci, (long long)i, got, want);
        }
        free(ref);
        free(x.data), free(w.data), free(b.data), free(y.data);
    }
}

/* ---- MatMul and Gemm -------------------------------------------------------- */

static void matmul_ref(const struct tensor *a, const struct tensor *b, const float *bias, float *y, enum act_kind act) {
    /* numpy semantics via padded shapes */
    int64_t ad[8], bd[8];
    int ra = a->ndim, rb = b->ndim;
    if (ra == 1) { ad[0] = 1; ad[1] = a->dims[0]; ra = 2; } else memcpy(ad, a->dims, 8 * ra);
    if (rb == 1) { bd[0] = b->dims[0]; bd[1] = 1; rb = 2; } else memcpy(bd, b->dims, 8 * rb);
    int r = ra > rb ? ra : rb;
    int64_t A[8] = {0}, B[8] = {0}, Y[8] = {0};
    for (int i = 0; i < r; i++) {
        A[i] = i < r - ra ? 1 : ad[i - (r - ra)];
        B[i] = i < r - rb ? 1 : bd[i - (r - rb)];
        Y[i] = A[i] > B[i] ? A[i] : B[i];
    }
    int64_t M = A[r - 2], K = A[r - 1], N = B[r - 1], nb = 1;
    for (int i = 0; i < r - 2; i++) nb *= Y[i];
    for (int64_t bi = 0; bi < nb; bi++) {
        int64_t rem = bi, ao = 0, bo = 0, as = 1, bs = 1;
        for (int i = r - 3; i >= 0; i--) {
            int64_t idx = rem % Y[i];
            rem /= Y[i];
            ao += (A[i] == 1 ? 0 : idx) * as;
            bo += (B[i] == 1 ? 0 : idx) * bs;
            as *= A[i];
            bs *= B[i];
        }
        const float *ap = (const float *)a->data + ao * M * K, *bp = (const float *)b->data + bo * K * N;
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                double acc = bias ? bias[n] : 0;
                for (int64_t k = 0; k < K; k++) acc += ap[m * K + k] * bp[k * N + n];
                y[(bi * M + m) * N + n] = act_apply(act, (float)acc, 0, 0);
            }
    }
}

static void test_matmul_cases(void **st) {
    (void)st;
    struct { int ra; int64_t a[4]; int rb; int64_t b[4]; int bias; int bconst; enum act_kind act; } cases[] = {
        {2, {3, 5}, 2, {5, 4}, 0, 1, ACT_NONE},
        {2, {1, 64}, 2, {64, 32}, 1, 1, ACT_RELU},
        {3, {2, 3, 5}, 2, {5, 4}, 1, 1, ACT_TANH},
        /* batch dims folded into A's rows (a channels-last Linear), B constant or not */
        {4, {2, 3, 5, 7}, 2, {7, 4}, 1, 1, ACT_GELU},
        {4, {1, 3, 5, 7}, 3, {1, 7, 4}, 0, 0, ACT_NONE},
        {3, {2, 3, 5}, 3, {2, 5, 4}, 0, 0, ACT_NONE},
        {4, {2, 1, 3, 5}, 3, {4, 5, 6}, 0, 0, ACT_SIGMOID},
        {2, {3, 5}, 3, {4, 5, 2}, 0, 1, ACT_NONE},
        {1, {5}, 2, {5, 4}, 0, 1, ACT_NONE},
        {2, {3, 5}, 1, {5}, 0, 0, ACT_NONE},
        {1, {7}, 1, {7}, 0, 0, ACT_NONE},
        {3, {2, 4, 3}, 1, {3}, 0, 1, ACT_RELU},
        /* a few rows by a small constant B run on cpu_gemv: two full
         * panels and a narrower one; five rows go to oneDNN again */
        {2, {3, 40}, 2, {40, 300}, 1, 1, ACT_RELU},
        {3, {2, 2, 9}, 2, {9, 20}, 1, 1, ACT_NONE},
        {2, {5, 9}, 2, {9, 20}, 1, 1, ACT_NONE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct tensor a = mk(cases[i].ra, cases[i].a, 1), b = mk(cases[i].rb, cases[i].b, 1), y = {0};
        int64_t nn = cases[i].b[cases[i].rb - 1];
        struct tensor bias = mk(1, &nn, 1);
        struct tnode t;
        tn_init(&t, "MatMul", 0);
        t.n.act = cases[i].act;
        /* a value computed at run time reaches prepare without data */
        void *bdata = b.data;
        struct tensor bview = b;
        if (!cases[i].bconst) bview.data = NULL;
        struct tensor *in[3] = {&a, &bview, cases[i].bias ? &bias : NULL}, *o[1] = {&y};
        const struct op_def *d = op_find("", "MatMul");
        struct op_call c;
        op_call_init(&c, &t.n, 2, g_err, sizeof g_err);
        c.nin = cases[i].bias ? 3 : 2;
        c.nout = 1;
        for (int k = 0; k < 3; k++) c.in[k] = in[k];
        c.out[0] = o[0];
        assert_int_equal(d->infer(&c), 0);
        y.data = malloc(tensor_nbytes(&y));
        void *state = NULL;
        size_t ss = 0;
        int rc = d->prepare(&c, &state, &ss);
        assert_int_equal_msg_impl(rc, 0, g_err);
        bview.data = bdata;
        c.state = state;
        c.scratch = ss ? aligned_alloc(64, (ss + 63) & ~(size_t)63) : NULL;
        c.scratch_size = ss;
        assert_int_equal_msg_impl(d->run(&c), 0, g_err);
        float *ref = malloc(tensor_nbytes(&y));
        matmul_ref(&a, &b, cases[i].bias ? bias.data : NULL, ref, cases[i].act);
        expect_close(y.data, ref, tensor_numel(&y), 1e-4f, "MatMul");
        d->release(state);
        free(c.scratch);
        free(ref);
        free(a.data);
        free(b.data);
        free(bias.data);
        free(y.data);
    }
}

static void test_gemm_cases(void **st) {
    (void)st;
    struct { int ta, tb; float alpha, beta; int cr; int64_t c[2]; int cconst; enum act_kind act; } cases[] = {
        {0, 0, 1.0f, 1.0f, 1, {6}, 1, ACT_NONE},
        {0, 1, 1.0f, 1.0f, 2, {1, 6}, 0, ACT_RELU},
        {1, 0, 0.5f, 2.0f, 2, {4, 6}, 1, ACT_NONE},
        {1, 1, 1.0f, 0.5f, 1, {6}, 1, ACT_TANH},
        {0, 0, 2.0f, 1.0f, 2, {4, 1}, 0, ACT_NONE},
        {0, 0, 1.0f, 3.0f, 0, {0}, 1, ACT_NONE},
        {0, 1, 1.5f, 0.0f, 2, {4, 6}, 1, ACT_NONE},
        {0, 0, 1.0f, 1.0f, -1, {0}, 1, ACT_SIGMOID}, /* no C */
        {0, 0, 1.0f, 0.5f, 1, {6}, 0, ACT_NONE},      /* runtime row C, beta != 1 */
        {1, 0, 1.0f, 1.0f, 1, {6}, 0, ACT_RELU},      /* runtime row C as bias */
    };
    const int64_t M = 4, K = 5, N = 6;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int64_t ad[2] = {cases[i].ta ? K : M, cases[i].ta ? M : K}, bd[2] = {cases[i].tb ? N : K, cases[i].tb ? K : N};
        struct tensor a = mk(2, ad, 1), b = mk(2, bd, 1), C = mk(cases[i].cr < 0 ? 0 : cases[i].cr, cases[i].c, 1), y = {0};
        struct tnode t;
        tn_init(&t, "Gemm", 0);
        tn_int(&t, "transA", cases[i].ta);
        tn_int(&t, "transB", cases[i].tb);
        tn_float(&t, "alpha", cases[i].alpha);
        tn_float(&t, "beta", cases[i].beta);
        t.n.act = cases[i].act;
        struct tensor *in[3] = {&a, &b, cases[i].cr < 0 ? NULL : &C}, *o[1] = {&y};
        g_runtime_inputs = cases[i].cconst ? 0 : 6; /* B and C computed at run time */
        int rc = run_node(&t.n, in, cases[i].cr < 0 ? 2 : 3, o, 1, 1);
        g_runtime_inputs = 0;
        assert_int_equal_msg_impl(rc, 0, g_err);
        const float *A = a.data, *B = b.data, *Cv = C.data;
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                double acc = 0;
                for (int64_t k = 0; k < K; k++)
                    acc += A[cases[i].ta ? k * M + m : m * K + k] * B[cases[i].tb ? n * K + k : k * N + n];
                double cval = 0;
                if (cases[i].cr >= 0) {
                    int64_t r0 = cases[i].cr == 2 ? cases[i].c[0] : 1, c1 = cases[i].cr >= 1 ? cases[i].c[cases[i].cr - 1] : 1;
                    cval = Cv[(r0 == 1 ? 0 : m) * c1 + (c1 == 1 ? 0 : n)];
                }
                float want = act_apply(cases[i].act, (float)(cases[i].alpha * acc + cases[i].beta * cval), 0, 0);
                float got = ((float *)y.data)[m * N + n];
                if (fabsf(got - want) > 1e-4f * (1 + fabsf(want)))
                    fail_msg("Gemm case %zu [%lld,%lld]: %g vs %g", i, (long long)m, (long long)n, got, want);
            }
        free(a.data);
        free(b.data);
        free(C.data);
        free(y.data);
    }
}

/* ---- integer and quantized ops ------------------------------------------- */

static struct tensor mk_q(enum dtype dt, int ndim, const int64_t *dims) {
    struct tensor t = {dt, ndim, {0}, NULL};
    for (int i = 0; i < ndim; i++) t.dims[i] = dims[i];
    int64_t n = tensor_numel(&t);
    t.data = malloc((size_t)(n > 0 ? n : 1) * dtype_size(dt));
    for (int64_t i = 0; i < n; i++) {
        g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
        if (dt == DT_UINT8) ((uint8_t *)t.data)[i] = (uint8_t)(g_rng >> 20);
        else if (dt == DT_INT8) ((int8_t *)t.data)[i] = (int8_t)(g_rng >> 20);
        else if (dt == DT_INT32) ((int32_t *)t.data)[i] = (int32_t)((g_rng >> 20) % 2001) - 1000;
    }
    return t;
}
static double q_at(const struct tensor *t, int64_t i) { return op_double_at(t, i); }
static double q_round_clip(double v, enum dtype dt) {
    double r = nearbyint(v), lo = dt == DT_UINT8 ? 0 : -128, hi = dt == DT_UINT8 ? 255 : 127;
    return r < lo ? lo : r > hi ? hi : r;
}

static void test_quantized_matmul(void **st) {
    (void)st;
    int64_t ad[2] = {3, 5}, bd[2] = {5, 4}, one = 1, four = 4;
    struct tensor a = mk_q(DT_UINT8, 2, ad), b = mk_q(DT_INT8, 2, bd), za = mk_q(DT_UINT8, 1, &one),
                  zb = mk_q(DT_INT8, 1, &four), y = {0};
    struct tnode t;
    tn_init(&t, "MatMulInteger", 0);
    struct tensor *in[4] = {&a, &b, &za, &zb}, *o[1] = {&y};
    assert_int_equal_msg_impl(run_node(&t.n, in, 4, o, 1, 1), 0, g_err);
    assert_int_equal(y.dtype, DT_INT32);
    for (int m = 0; m < 3; m++)
        for (int n = 0; n < 4; n++) {
            int32_t acc = 0;
            for (int k = 0; k < 5; k++)
                acc += ((int32_t)q_at(&a, m * 5 + k) - (int32_t)q_at(&za, 0)) * ((int32_t)q_at(&b, k * 4 + n) - (int32_t)q_at(&zb, n));
            assert_int_equal(((int32_t *)y.data)[m * 4 + n], acc);
        }
    free(y.data);
    /* QLinearMatMul with uint8 output */
    struct tensor as = {DT_FP32, 1, {1}, (float[]){0.02f}}, bs = {DT_FP32, 1, {1}, (float[]){0.05f}};
    struct tensor ys = {DT_FP32, 1, {1}, (float[]){0.1f}}, yz = {DT_UINT8, 1, {1}, (uint8_t[]){128}};
    struct tensor zb1 = {DT_INT8, 1, {1}, (int8_t[]){0}};
    tn_init(&t, "QLinearMatMul", 0);
    struct tensor *qin[8] = {&a, &as, &za, &b, &bs, &zb1, &ys, &yz};
    y = (struct tensor){0};
    assert_int_equal_msg_impl(run_node(&t.n, qin, 8, o, 1, 1), 0, g_err);
    assert_int_equal(y.dtype, DT_UINT8);
    for (int m = 0; m < 3; m++)
        for (int n = 0; n < 4; n++) {
            int32_t acc = 0;
            for (int k = 0; k < 5; k++) acc += ((int32_t)q_at(&a, m * 5 + k) - (int32_t)q_at(&za, 0)) * (int32_t)q_at(&b, k * 4 + n);
            double v = q_round_clip(acc * (double)(0.02f * 0.05f / 0.1f) + 128, DT_UINT8);
            assert_int_equal(((uint8_t *)y.data)[m * 4 + n], (int)v);
        }
    free(y.data), free(a.data), free(b.data), free(za.data), free(zb.data);
}

/* One int32 sum of an integer product against the definition's (wrapped
 * as int32 wraps), the failure naming the case: its index, the operands'
 * types, the zero-point form (none, one, per channel), the threads and
 * whether the weights came at run time. */
struct isum_case {
    size_t index;
    enum dtype a, b;
    int zp, threads, runtime;
};
static void expect_isum(int32_t got, int64_t want, const struct isum_case *k, int64_t i, int64_t j, int64_t l) {
    if (got == (int32_t)want) return;
    fail_msg("case %zu, %s x %s, zero point %d, %d threads, weights %s: [%lld,%lld,%lld] is %d, expected %lld", k->index,
             dtype_name(k->a), dtype_name(k->b), k->zp, k->threads, k->runtime ? "at run time" : "constant",
             (long long)i, (long long)j, (long long)l, got, (long long)want);
}

/* MatMulInteger with constant weights runs on oneDNN's int8 matmul
 * (kernels/cpu/qgemm.c), with the zero points and type shifts taken out
 * algebraically and, without VNNI, A in two 4-bit halves: every type
 * pairing, zero points absent, scalar or per column, odd shapes and a
 * batch, extremes that would saturate vpmaddubsw's int16 pair sums, one
 * and two threads; the int32 sums must equal the definition exactly (and
 * so the exact loop that runs B given at run time). `make isa` runs this
 * under AVX2 (no VNNI) and SSE4.1 too. */
static void test_matmulinteger_int8_gemm(void **st) {
    (void)st;
    static const int64_t shapes[][4] = {/* batch, M, K, N */
                                        {1, 1, 1, 1}, {1, 3, 5, 4}, {2, 7, 33, 17}, {1, 64, 128, 130}, {1, 5, 300, 3},
                                        /* big enough that two threads share the product and the rows */
                                        {1, 300, 256, 260}};
    static const enum dtype dts[2] = {DT_UINT8, DT_INT8};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int zk = 0; zk < 3; zk++) { /* b_zero_point: none, one, per column */
                    if (si == 5 && !((ta == 0 && tb == 1 && zk == 2) || (ta == 1 && tb == 0 && zk == 1))) continue;
                    const int64_t nb = shapes[si][0], M = shapes[si][1], K = shapes[si][2], N = shapes[si][3];
                    const int64_t ad3[3] = {nb, M, K}, bd[2] = {K, N}, one = 1;
                    struct tensor a = mk_q(dts[ta], nb > 1 ? 3 : 2, nb > 1 ? ad3 : ad3 + 1), b = mk_q(dts[tb], 2, bd);
                    struct tensor za = mk_q(dts[ta], 1, &one), zb = mk_q(dts[tb], 1, zk == 2 ? &N : &one);
                    if (si == 4) { /* extremes: every product pair past int16 */
                        for (int64_t i = 0; i < tensor_numel(&a); i++)
                            ta ? (((int8_t *)a.data)[i] = -128) : (((uint8_t *)a.data)[i] = 255);
                        for (int64_t i = 0; i < tensor_numel(&b); i++)
                            tb ? (((int8_t *)b.data)[i] = (int8_t)(i % 2 ? 127 : -128))
                               : (((uint8_t *)b.data)[i] = (uint8_t)(i % 2 ? 255 : 0));
                    }
                    struct tnode t;
                    tn_init(&t, "MatMulInteger", 0);
                    struct tensor *in[4] = {&a, &b, &za, zk ? &zb : NULL};
                    for (int threads = 1; threads <= 2; threads++)
                        for (int runtime_b = 0; runtime_b < 2; runtime_b++) {
                            struct tensor y = {0}, *o[1] = {&y};
                            g_runtime_inputs = runtime_b ? 2 : 0;
                            int rc = run_node(&t.n, in, 4, o, 1, threads);
                            g_runtime_inputs = 0;
                            assert_int_equal_msg_impl(rc, 0, g_err);
                            for (int64_t bi = 0; bi < nb; bi++)
                                for (int64_t m = 0; m < M; m++)
                                    for (int64_t n = 0; n < N; n++) {
                                        int64_t acc = 0;
                                        for (int64_t k = 0; k < K; k++)
                                            acc += ((int64_t)q_at(&a, (bi * M + m) * K + k) - (int64_t)q_at(&za, 0)) *
                                                   ((int64_t)q_at(&b, k * N + n) - (zk ? (int64_t)q_at(&zb, zk == 2 ? n : 0) : 0));
                                        expect_isum(((int32_t *)y.data)[(bi * M + m) * N + n], acc,
                                                    &(struct isum_case){si, dts[ta], dts[tb], zk, threads, runtime_b},
                                                    bi, m, n);
                                    }
                            free(y.data);
                        }
                    free(a.data), free(b.data), free(za.data), free(zb.data);
                }
}

/* MatMulIntegerToFloat and DynamicQuantizeMatMul (what the dynamic
 * quantization pass makes) give the same bits with constant weights
 * (oneDNN's int8 matmul) as with weights at run time (the exact loop):
 * one set of int32 sums, one float epilogue; and the float result is
 * (float)sum * (a_scale * b_scale[n]) + bias[n]. */
static void test_dynamic_quantized_matmul(void **st) {
    (void)st;
    const int64_t M = 9, K = 70, N = 33, ad[2] = {M, K}, bd[2] = {K, N}, one = 1;
    struct tensor x = tn_rand_f32(2, ad), b = mk_q(DT_INT8, 2, bd), zb = mk_q(DT_INT8, 1, &N);
    struct tensor bs = tn_rand_f32(1, &N), bias = tn_rand_f32(1, &N);
    struct tensor aq = mk_q(DT_UINT8, 2, ad), as = {DT_FP32, 1, {1}, (float[]){0.0123f}}, az = mk_q(DT_UINT8, 1, &one);
    (void)one;
    for (int op = 0; op < 2; op++) {
        struct tnode t;
        tn_init_domain(&t, "com.microsoft", op ? "DynamicQuantizeMatMul" : "MatMulIntegerToFloat", 1);
        struct tensor *in_f[7] = {&aq, &b, &as, &bs, &az, &zb, &bias}, *in_d[5] = {&x, &b, &bs, &zb, &bias};
        struct tensor **in = op ? in_d : in_f;
        const int nin = op ? 5 : 7;
        struct tensor y[2] = {{0}, {0}}, g[2] = {{0}, {0}};
        for (int runtime_b = 0; runtime_b < 2; runtime_b++) {
            struct tensor *o[1] = {&y[runtime_b]}, *og[1] = {&g[runtime_b]};
            g_runtime_inputs = runtime_b ? 2 : 0;
            int rc = run_node(&t.n, in, nin, o, 1, 1);
            t.n.act = ACT_GELU; /* fused by the activation pass */
            if (!rc) rc = run_node(&t.n, in, nin, og, 1, 1);
            t.n.act = ACT_NONE;
            g_runtime_inputs = 0;
            assert_int_equal_msg_impl(rc, 0, g_err);
        }
        assert_memory_equal(y[0].data, y[1].data, sizeof(float) * (size_t)(M * N));
        assert_memory_equal(g[0].data, g[1].data, sizeof(float) * (size_t)(M * N));
        for (int64_t i = 0; i < M * N; i++) {
            float v = ((float *)y[0].data)[i], want = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
            if (fabsf(((float *)g[0].data)[i] - want) > 1e-6f * (1.0f + fabsf(want)))
                fail_msg("%s: gelu of %g is %g, expected %g", t.n.op_type, v, ((float *)g[0].data)[i], want);
        }
        free(g[0].data), free(g[1].data);
        if (!op) /* the definition, from the exact sums */
            for (int64_t m = 0; m < M; m++)
                for (int64_t n = 0; n < N; n++) {
                    int32_t acc = 0;
                    for (int64_t k = 0; k < K; k++)
                        acc += ((int32_t)q_at(&aq, m * K + k) - (int32_t)q_at(&az, 0)) *
                               ((int32_t)q_at(&b, k * N + n) - (int32_t)q_at(&zb, n));
                    float want = (float)acc * (0.0123f * ((float *)bs.data)[n]) + ((float *)bias.data)[n];
                    assert_memory_equal(&((float *)y[0].data)[m * N + n], &want, sizeof want);
                }
        free(y[0].data), free(y[1].data);
    }
    free(x.data), free(b.data), free(zb.data), free(bs.data), free(bias.data), free(aq.data), free(az.data);
}

static void test_quantized_conv(void **st) {
    (void)st;
    int64_t xd[4] = {1, 2, 5, 5}, wd[4] = {3, 2, 3, 3}, three = 3;
    struct tensor x = mk_q(DT_UINT8, 4, xd), w = mk_q(DT_INT8, 4, wd), bias = mk_q(DT_INT32, 1, &three), y = {0};
    struct tensor xz = {DT_UINT8, 0, {0}, (uint8_t[]){100}}, wz = {DT_INT8, 1, {3}, (int8_t[]){1, -2, 0}};
    struct tensor xs = {DT_FP32, 0, {0}, (float[]){0.01f}}, ws = {DT_FP32, 1, {3}, (float[]){0.02f, 0.03f, 0.005f}};
    struct tensor ys = {DT_FP32, 0, {0}, (float[]){0.5f}}, yz = {DT_INT8, 0, {0}, (int8_t[]){-3}};
    int64_t pads[4] = {1, 1, 1, 1};
    struct tnode t;
    tn_init(&t, "ConvInteger", 0);
    tn_ints(&t, "pads", 4, pads);
    struct tensor *in[4] = {&x, &w, &xz, &wz}, *o[1] = {&y};
    assert_int_equal_msg_impl(run_node(&t.n, in, 4, o, 1, 1), 0, g_err);
    assert_int_equal(y.dtype, DT_INT32);
    int32_t acc[75];
    for (int m = 0; m < 3; m++)
        for (int h = 0; h < 5; h++)
            for (int ww = 0; ww < 5; ww++) {
                int32_t sum = 0;
                for (int c = 0; c < 2; c++)
                    for (int kh = 0; kh < 3; kh++)
                        for (int kw = 0; kw < 3; kw++) {
                            int ih = h - 1 + kh, iw = ww - 1 + kw;
                            if (ih < 0 || ih >= 5 || iw < 0 || iw >= 5) continue;
                            sum += ((int32_t)q_at(&x, (c * 5 + ih) * 5 + iw) - 100) *
                                   ((int32_t)q_at(&w, ((m * 2 + c) * 3 + kh) * 3 + kw) - (int32_t)q_at(&wz, m));
                        }
                acc[(m * 5 + h) * 5 + ww] = sum;
                assert_int_equal(((int32_t *)y.data)[(m * 5 + h) * 5 + ww], sum);
            }
    free(y.data);
    tn_init(&t, "QLinearConv", 0);
    tn_ints(&t, "pads", 4, pads);
    struct tensor *qin[9] = {&x, &xs, &xz, &w, &ws, &wz, &ys, &yz, &bias};
    y = (struct tensor){0};
    assert_int_equal_msg_impl(run_node(&t.n, qin, 9, o, 1, 2), 0, g_err);
    assert_int_equal(y.dtype, DT_INT8);
    for (int i = 0; i < 75; i++) {
        int m = i / 25;
        double v = q_round_clip((acc[i] + ((int32_t *)bias.data)[m]) * (double)(0.01f * ((float *)ws.data)[m] / 0.5f) - 3, DT_INT8);
        assert_int_equal(((int8_t *)y.data)[i], (int)v);
    }
    free(y.data), free(x.data), free(w.data), free(bias.data);
}

/* ConvInteger on the 8-bit GEMM (im2col times W^T on oneDNN's int8
 * matmul, kernels/cpu/ops_nn.c): every pairing of uint8 and int8 x and w,
 * weight zero points absent, one or per output channel, x zero points
 * absent or not, padding (a padded tap is x's zero point), strides and
 * dilations, 1 to 3 spatial dims, a batch of 2, and extremes that would
 * saturate vpmaddubsw's int16 pair sums; a grouped one and weights given at
 * run time take the widened loop. The int32 sums must equal the
 * definition exactly (as onnxruntime's and ONNX's node tests do); `make
 * isa` runs this under AVX2 (no VNNI) and SSE4.1 too. */
static void test_convinteger_int8_gemm(void **st) {
    (void)st;
    static const struct {
        int nsp, n, c, m, group;
        int64_t in[3], k[3], s[3], d[3], p[3];
        int asym;      /* end pads pe, not p */
        int64_t pe[3];
    } cases[] = {
        {2, 1, 3, 4, 1, {7, 9}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 0, {0}},
        {2, 2, 5, 6, 1, {8, 6}, {3, 2}, {2, 1}, {1, 2}, {1, 0}, 0, {0}},
        {1, 1, 4, 3, 1, {11}, {5}, {2}, {1}, {2}, 0, {0}},
        {3, 1, 2, 3, 1, {4, 5, 3}, {2, 3, 1}, {1, 2, 1}, {1, 1, 1}, {1, 1, 0}, 0, {0}},
        {2, 1, 16, 32, 1, {12, 20}, {1, 1}, {1, 1}, {1, 1}, {0, 0}, 0, {0}},
        {2, 1, 4, 4, 2, {5, 5}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 0, {0}},
        {2, 1, 64, 8, 1, {6, 6}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 0, {0}}, /* extremes */
        /* grouped and depthwise, the widened loop's row forms: rows as long
         * as x's (one run per tap, its row ends taken back), vector steps of
         * 8 and 4 and their tails, stride 2 (even bytes), taps wider than a
         * row, a multiplier of 2, a stride on the outer axis only */
        {2, 1, 8, 8, 8, {9, 21}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 0, {0}},
        {2, 1, 6, 12, 6, {10, 19}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, 0, {0}},
        {2, 1, 4, 4, 4, {7, 16}, {5, 5}, {1, 1}, {1, 1}, {2, 2}, 0, {0}},
        {2, 1, 4, 4, 4, {6, 12}, {3, 3}, {1, 1}, {2, 2}, {2, 2}, 0, {0}},
        {2, 1, 4, 4, 4, {3, 3}, {3, 5}, {1, 1}, {1, 1}, {1, 2}, 0, {0}},
        {1, 1, 4, 4, 4, {40}, {3}, {1}, {1}, {1}, 0, {0}},
        {2, 1, 6, 6, 3, {8, 11}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 0, {0}},
        {2, 2, 4, 4, 4, {9, 9}, {3, 3}, {2, 1}, {1, 1}, {1, 1}, 0, {0}},
        {2, 1, 4, 4, 4, {6, 10}, {2, 2}, {1, 1}, {1, 1}, {0, 0}, 1, {1, 1}},
        {2, 1, 4, 8, 4, {5, 33}, {1, 3}, {1, 3}, {1, 1}, {0, 1}, 0, {0}},
    };
    static const enum dtype dts[2] = {DT_UINT8, DT_INT8};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int tx = 0; tx < 2; tx++)
            for (int tw = 0; tw < 2; tw++)
                for (int zk = 0; zk < 3; zk++) { /* w_zero_point: none, one, per channel */
                    const int nsp = cases[ci].nsp, N = cases[ci].n, C = cases[ci].c, M = cases[ci].m, G = cases[ci].group;
                    int64_t xd[5] = {N, C}, wd[5] = {M, C / G}, one = 1, mm = M, ks[3], pads[6], strides[3], dil[3];
                    int64_t in3[3] = {1, 1, 1}, k3[3] = {1, 1, 1}, s3[3] = {1, 1, 1}, d3[3] = {1, 1, 1}, p3[3] = {0},
                            o3[3] = {1, 1, 1};
                    for (int i = 0; i < nsp; i++) {
                        xd[2 + i] = in3[i] = cases[ci].in[i];
                        wd[2 + i] = ks[i] = k3[i] = cases[ci].k[i];
                        strides[i] = s3[i] = cases[ci].s[i];
                        dil[i] = d3[i] = cases[ci].d[i];
                        pads[i] = p3[i] = cases[ci].p[i];
                        pads[nsp + i] = cases[ci].asym ? cases[ci].pe[i] : p3[i];
                        o3[i] = (in3[i] + p3[i] + pads[nsp + i] - d3[i] * (k3[i] - 1) - 1) / s3[i] + 1;
                    }
                    struct tensor x = mk_q(dts[tx], nsp + 2, xd), w = mk_q(dts[tw], nsp + 2, wd);
                    struct tensor xz = mk_q(dts[tx], 0, &one), wz = mk_q(dts[tw], 1, zk == 2 ? &mm : &one);
                    if (ci == 6) {
                        for (int64_t i = 0; i < tensor_numel(&x); i++)
                            tx ? (((int8_t *)x.data)[i] = -128) : (((uint8_t *)x.data)[i] = 255);
                        for (int64_t i = 0; i < tensor_numel(&w); i++)
                            tw ? (((int8_t *)w.data)[i] = (int8_t)(i % 2 ? 127 : -128))
                               : (((uint8_t *)w.data)[i] = (uint8_t)(i % 2 ? 255 : 0));
                    }
                    struct tnode t;
                    tn_init(&t, "ConvInteger", 10);
                    tn_ints(&t, "kernel_shape", nsp, ks);
                    tn_ints(&t, "pads", 2 * nsp, pads);
                    tn_ints(&t, "strides", nsp, strides);
                    tn_ints(&t, "dilations", nsp, dil);
                    tn_int(&t, "group", G);
                    struct tensor *in[4] = {&x, &w, zk || tx ? &xz : NULL, zk ? &wz : NULL};
                    const int64_t osz = o3[0] * o3[1] * o3[2], isz = in3[0] * in3[1] * in3[2];
                    const int64_t ksz = k3[0] * k3[1] * k3[2], cg = C / G, mg = M / G;
                    for (int threads = 1; threads <= 2; threads++)
                        for (int runtime_w = 0; runtime_w < 2; runtime_w++) {
                            struct tensor y = {0}, *o[1] = {&y};
                            g_runtime_inputs = runtime_w ? 2 : 0;
                            int rc = run_node(&t.n, in, 4, o, 1, threads);
                            g_runtime_inputs = 0;
                            assert_int_equal_msg_impl(rc, 0, g_err);
                            assert_int_equal(y.dtype, DT_INT32);
                            int64_t zx = in[2] ? (int64_t)q_at(&xz, 0) : 0;
                            for (int64_t n = 0; n < N; n++)
                                for (int64_t m = 0; m < M; m++)
                                    for (int64_t op = 0; op < osz; op++) {
                                        int64_t oo[3] = {op / (o3[1] * o3[2]), (op / o3[2]) % o3[1], op % o3[2]}, acc = 0;
                                        int64_t zw = zk ? (int64_t)q_at(&wz, zk == 2 ? m : 0) : 0;
                                        for (int64_t c = 0; c < cg; c++)
                                            for (int64_t kk = 0; kk < ksz; kk++) {
                                                int64_t tt[3] = {kk / (k3[1] * k3[2]), (kk / k3[2]) % k3[1], kk % k3[2]}, xi = 0;
                                                int inside = 1;
                                                for (int i = 0; i < 3; i++) {
                                                    int64_t v = oo[i] * s3[i] - p3[i] + tt[i] * d3[i];
                                                    inside &= v >= 0 && v < in3[i];
                                                    xi = xi * in3[i] + v;
                                                }
                                                if (!inside) continue;
                                                int64_t xv = (int64_t)q_at(&x, (n * C + (m / mg) * cg + c) * isz + xi);
                                                int64_t wv = (int64_t)q_at(&w, (m * cg + c) * ksz + kk);
                                                acc += (xv - zx) * (wv - zw);
                                            }
                                        expect_isum(((int32_t *)y.data)[(n * M + m) * osz + op], acc,
                                                    &(struct isum_case){ci, dts[tx], dts[tw], zk, threads, runtime_w},
                                                    n, m, op);
                                    }
                            free(y.data);
                        }
                    free(x.data), free(w.data), free(xz.data), free(wz.data);
                }
}

/* ---- pools ---------------------------------------------------------------- */

static void test_maxpool_indices(void **st) {
    (void)st;
    /* 1x1x4x4 0..15, kernel 2, stride 2: maxima are the bottom-right of each block */
    int64_t xd[4] = {1, 2, 4, 4};
    struct tensor x = mk(4, xd, 0), y = {0}, idx = {0};
    for (int i = 0; i < 32; i++) ((float *)x.data)[i] = (float)i;
    struct tnode t;
    tn_init(&t, "MaxPool", 0);
    int64_t k[2] = {2, 2};
    tn_ints(&t, "kernel_shape", 2, k);
    tn_ints(&t, "strides", 2, k);
    struct tensor *in[1] = {&x}, *o[2] = {&y, &idx};
    assert_int_equal_msg_impl(run_node(&t.n, in, 1, o, 2, 1), 0, g_err);
    assert_int_equal(idx.dtype, DT_INT64);
    const float want[8] = {5, 7, 13, 15, 21, 23, 29, 31};
    const int64_t wi[8] = {5, 7, 13, 15, 21, 23, 29, 31};
    expect_close(y.data, want, 8, 0, "MaxPool");
    for (int i = 0; i < 8; i++) assert_int_equal(((int64_t *)idx.data)[i], wi[i]);
    free(y.data);
    free(idx.data);
    /* storage_order 1: column-major numbering of the spatial elements */
    tn_int(&t, "storage_order", 1);
    y = (struct tensor){0};
    idx = (struct tensor){0};
    assert_int_equal_msg_impl(run_node(&t.n, in, 1, o, 2, 1), 0, g_err);
    const int64_t wc[8] = {5, 13, 7, 15, 21, 29, 23, 31};
    for (int i = 0; i < 8; i++) assert_int_equal(((int64_t *)idx.data)[i], wc[i]);
    free(y.data);
    free(idx.data);
    free(x.data);
}

/* MaxPool's Indices feed MaxUnpool: maxima return to their places, the
 * rest is zero; an index outside the output is refused. */
static void test_maxunpool(void **st) {
    (void)st;
    int64_t xd[4] = {1, 2, 4, 6};
    struct tensor x = mk(4, xd, 1), y = {0}, idx = {0}, u = {0};
    struct tnode t;
    tn_init(&t, "MaxPool", 0);
    int64_t k[2] = {2, 2};
    tn_ints(&t, "kernel_shape", 2, k);
    tn_ints(&t, "strides", 2, k);
    struct tensor *in[1] = {&x}, *o[2] = {&y, &idx};
    assert_int_equal_msg_impl(run_node(&t.n, in, 1, o, 2, 1), 0, g_err);
    t.n.op_type = "MaxUnpool";
    struct tensor *in2[2] = {&y, &idx}, *o2[1] = {&u};
    assert_int_equal_msg_impl(run_node(&t.n, in2, 2, o2, 1, 1), 0, g_err);
    assert_true(tensor_same_shape(&u, &x));
    int64_t kept = 0;
    for (int64_t i = 0; i < 48; i++) {
        float v = ((float *)u.data)[i];
        if (v != 0) {
            assert_true(v == ((float *)x.data)[i]);
            kept++;
        }
    }
    assert_int_equal(kept, 12);
    free(u.data);
    ((int64_t *)idx.data)[3] = 1000;
    u = (struct tensor){0};
    assert_int_not_equal(run_node(&t.n, in2, 2, o2, 1, 1), 0);
    assert_non_null(strstr(g_err, "outside"));
    free(u.data);
    free(x.data);
    free(y.data);
    free(idx.data);
}

/* oneDNN's pooling and the C loop agree (Indices forces the C loop). */
static void test_pool_paths_agree(void **st) {
    (void)st;
    int64_t xd[4] = {2, 3, 11, 10};
    struct tensor x = mk(4, xd, 1);
    for (int ceil = 0; ceil < 2; ceil++) {
        struct tnode t;
        tn_init(&t, "MaxPool", 0);
        int64_t k[2] = {3, 3}, s[2] = {2, 2}, p[4] = {1, 0, 0, 1};
        tn_ints(&t, "kernel_shape", 2, k);
        tn_ints(&t, "strides", 2, s);
        tn_ints(&t, "pads", 4, p);
        tn_int(&t, "ceil_mode", ceil);
        struct tensor y1 = {0}, y2 = {0}, idx = {0};
        struct tensor *in[1] = {&x}, *o1[1] = {&y1}, *o2[2] = {&y2, &idx};
        assert_int_equal_msg_impl(run_node(&t.n, in, 1, o1, 1, 2), 0, g_err);
        assert_int_equal_msg_impl(run_node(&t.n, in, 1, o2, 2, 2), 0, g_err);
        assert_true(tensor_same_shape(&y1, &y2));
        expect_close(y1.data, y2.data, tensor_numel(&y1), 0, "MaxPool paths");
        for (int64_t i = 0; i < tensor_numel(&y1); i++)
            assert_true(((float *)x.data)[((int64_t *)idx.data)[i]] == ((float *)y2.data)[i]);
        free(y1.data);
        free(y2.data);
        free(idx.data);
    }
    free(x.data);
}

/* Max and average pools over a plain NCHW input against a direct
 * reference: pads, strides, ceil overhang, both count_include_pad. Whatever
 * runs them (oneDNN's generated code, or kiln's row loop where oneDNN would
 * use one of its C loops: without AVX-512, as make isa runs this) must give
 * the reference's floats. */
static void test_pool_plain_rows(void **st) {
    (void)st;
    int64_t xd[4] = {2, 3, 9, 14};
    struct tensor x = mk(4, xd, 1);
    const float *xv = x.data;
    for (int kind = 0; kind < 3; kind++) /* max, avg excluding, avg including padding */
        for (int ceil = 0; ceil < 2; ceil++) {
            struct tnode t;
            tn_init(&t, kind ? "AveragePool" : "MaxPool", 0);
            int64_t k[2] = {3, 2}, s[2] = {2, 3}, p[4] = {1, 0, 1, 1};
            tn_ints(&t, "kernel_shape", 2, k);
            tn_ints(&t, "strides", 2, s);
            tn_ints(&t, "pads", 4, p);
            tn_int(&t, "ceil_mode", ceil);
            if (kind) tn_int(&t, "count_include_pad", kind == 2);
            struct tensor y = {0};
            struct tensor *in[1] = {&x}, *o[1] = {&y};
            assert_int_equal_msg_impl(run_node(&t.n, in, 1, o, 1, 2), 0, g_err);
            int64_t oh = y.dims[2], ow = y.dims[3];
            float *want = malloc(sizeof(float) * (size_t)tensor_numel(&y));
            for (int64_t c = 0; c < 6; c++)
                for (int64_t a = 0; a < oh; a++)
                    for (int64_t b = 0; b < ow; b++) {
                        float best = -INFINITY, sum = 0;
                        int64_t n = 0, npad = 0;
                        for (int64_t r = a * 2 - 1; r < a * 2 - 1 + 3; r++)
                            for (int64_t q = b * 3 - 0; q < b * 3 + 2; q++) {
                                if (r >= -1 && r < 9 + 1 && q >= 0 && q < 14 + 1) npad++;
                                if (r < 0 || r >= 9 || q < 0 || q >= 14) continue;
                                float v = xv[(c * 9 + r) * 14 + q];
                                best = n == 0 || v > best ? v : best;
                                sum += v;
                                n++;
                            }
                        int64_t div = kind == 2 ? npad : n;
                        want[(c * oh + a) * ow + b] = kind == 0 ? best : div ? sum / (float)div : 0.0f;
                    }
            expect_close(y.data, want, tensor_numel(&y), kind ? 1e-6f : 0, kind ? "AveragePool rows" : "MaxPool rows");
            free(want);
            free(y.data);
        }
    free(x.data);
}

static void test_avgpool(void **st) {
    (void)st;
    /* 1x1x3x3 ones, kernel 2, pads 1, stride 2, ceil: include_pad divides
     * by the window clipped to the padded input */
    int64_t xd[4] = {1, 1, 3, 3};
    struct tensor x = mk(4, xd, 0);
    for (int i = 0; i < 9; i++) ((float *)x.data)[i] = 1.0f;
    for (int inc = 0; inc < 2; inc++) {
        struct tnode t;
        tn_init(&t, "AveragePool", 0);
        int64_t k[2] = {2, 2}, s[2] = {2, 2}, p[4] = {1, 1, 1, 1};
        tn_ints(&t, "kernel_shape", 2, k);
        tn_ints(&t, "strides", 2, s);
        tn_ints(&t, "pads", 4, p);
        tn_int(&t, "count_include_pad", inc);
        struct tensor y = {0};
        struct tensor *in[1] = {&x}, *o[1] = {&y};
        assert_int_equal_msg_impl(run_node(&t.n, in, 1, o, 1, 1), 0, g_err);
        assert_int_equal(y.dims[2], 2);
        /* windows: corners hold 1 real of 4 padded taps */
        float want_inc[4] = {0.25f, 0.5f, 0.5f, 1.0f}, want_exc[4] = {1, 1, 1, 1};
        expect_close(y.data, inc ? want_inc : want_exc, 4, 1e-6f, "AveragePool");
        free(y.data);
    }
    free(x.data);
}

static void test_global_pools(void **st) {
    (void)st;
    int64_t xd[4] = {2, 3, 5, 7};
    struct tensor x = mk(4, xd, 1);
    for (int mx = 0; mx < 2; mx++) {
        struct tnode t;
        tn_init(&t, mx ? "GlobalMaxPool" : "GlobalAveragePool", 0);
        struct tensor y = {0};
        struct tensor *in[1] = {&x}, *o[1] = {&y};
        assert_int_equal_msg_impl(run_node(&t.n, in, 1, o, 1, 1), 0, g_err);
        assert_int_equal(y.ndim, 4);
        assert_int_equal(y.dims[3], 1);
        for (int p = 0; p < 6; p++) {
            const float *xp = (const float *)x.data + p * 35;
            double acc = 0;
            float m = xp[0];
            for (int i = 0; i < 35; i++) {
                acc += xp[i];
                m = xp[i] > m ? xp[i] : m;
            }
            float want = mx ? m : (float)(acc / 35);
            assert_true(fabsf(((float *)y.data)[p] - want) < 1e-5f);
        }
        free(y.data);
    }
    free(x.data);
}

/* Runs node t on NCHW x (and the constant inputs rest) plain, then with
 * kiln_layout = lay, and expects the same values: x is channels-last when
 * lay has bit 1, the output when it has bit 2 (3: both). */
static void expect_layout_same(struct tnode *t, int64_t lay, const struct tensor *x, struct tensor **rest, int nrest,
                               const char *what) {
    struct tensor *in[6] = {(struct tensor *)x}, y1 = {0}, y2 = {0}, *o1[1] = {&y1}, *o2[1] = {&y2};
    for (int i = 0; i < nrest; i++) in[1 + i] = rest[i];
    assert_int_equal_msg_impl(run_node(&t->n, in, 1 + nrest, o1, 1, 1), 0, g_err);
    struct tensor xc = *x;
    xc.data = malloc(tensor_nbytes(x));
    if (lay & 1) layout_nhwc_from_nchw(xc.data, x->data, x->dims[0], x->dims[1], x->dims[2] * x->dims[3]);
    else memcpy(xc.data, x->data, tensor_nbytes(x));
    tn_int(t, "kiln_layout", lay);
    in[0] = &xc;
    assert_int_equal_msg_impl(run_node(&t->n, in, 1 + nrest, o2, 1, 2), 0, g_err);
    float *got = y2.data, *plain = NULL;
    if ((lay & 2) && y2.ndim == 4) {
        plain = malloc(tensor_nbytes(&y2));
        layout_nchw_from_nhwc(plain, y2.data, y2.dims[0], y2.dims[1], y2.dims[2] * y2.dims[3]);
        got = plain;
    }
    assert_true(tensor_same_shape(&y1, &y2));
    expect_close(got, y1.data, tensor_numel(&y1), 1e-5f, what);
    free(plain);
    free(xc.data);
    free(y1.data);
    free(y2.data);
}

/* The kernels that take channels-last activations (models/passes_layout.c)
 * give the plain layout's values: oneDNN's pooling and the C loop on plain
 * copies (an including-pad average whose ceil-mode window hangs past the
 * padding), the global pools, BatchNormalization, and Conv with either end
 * channels-last, a grouped one of 2 channels per group too (which oneDNN
 * would run with its reference loop on channels-last memory). */
static void test_channels_last_kernels(void **st) {
    (void)st;
    int64_t xd[4] = {2, 6, 9, 7};
    struct tensor x = mk(4, xd, 1);
    int64_t k2[2] = {2, 2}, k3[2] = {3, 3}, s2[2] = {2, 2}, p1[4] = {1, 1, 1, 1}, p0[4] = {0, 0, 0, 0};
    for (int avg = 0; avg < 2; avg++) { /* 2x2 windows over 9 rows: the fifth hangs past the end */
        struct tnode t;
        tn_init(&t, avg ? "AveragePool" : "MaxPool", 11);
        tn_ints(&t, "kernel_shape", 2, avg ? k2 : k3);
        tn_ints(&t, "strides", 2, s2);
        tn_ints(&t, "pads", 4, avg ? p0 : p1);
        if (avg) tn_int(&t, "count_include_pad", 1), tn_int(&t, "ceil_mode", 1);
        expect_layout_same(&t, 3, &x, NULL, 0, avg ? "AveragePool (C loop)" : "MaxPool");
    }
    for (int mx = 0; mx < 2; mx++) {
        struct tnode t;
        tn_init(&t, mx ? "GlobalMaxPool" : "GlobalAveragePool", 1);
        expect_layout_same(&t, 1, &x, NULL, 0, "global pool");
    }
    int64_t cd[1] = {6};
    struct tensor sc = mk(1, cd, 1), bi = mk(1, cd, 1), mu = mk(1, cd, 1), var = mk(1, cd, 1);
    for (int i = 0; i < 6; i++) ((float *)var.data)[i] += 1.0f;
    struct tensor *bn[4] = {&sc, &bi, &mu, &var};
    struct tnode t;
    tn_init(&t, "BatchNormalization", 15);
    expect_layout_same(&t, 3, &x, bn, 4, "BatchNormalization");
    for (int group = 1; group <= 3; group += 2) {
        int64_t wd[4] = {12, 6 / group, 3, 3}, bd[1] = {12};
        struct tensor w = mk(4, wd, 1), b = mk(1, bd, 1);
        struct tensor *wb[2] = {&w, &b};
        for (int64_t lay = 1; lay <= 3; lay++) {
            tn_init(&t, "Conv", 11);
            tn_ints(&t, "pads", 4, p1);
            tn_int(&t, "group", group);
            char what[64];
            snprintf(what, sizeof what, "Conv group %d kiln_layout %lld", group, (long long)lay);
            expect_layout_same(&t, lay, &x, wb, 2, what);
        }
        free(w.data);
        free(b.data);
    }
    for (int i = 0; i < 4; i++) free(bn[i]->data);
    free(x.data);
}

static void test_lp_pools(void **st) {
    (void)st;
    int64_t xd[4] = {1, 2, 4, 5};
    struct tensor x = mk(4, xd, 1), y = {0};
    struct tnode t;
    tn_init(&t, "LpPool", 0);
    int64_t k[2] = {2, 3}, pads[4] = {0, 1, 0, 1};
    tn_ints(&t, "kernel_shape", 2, k);
    tn_ints(&t, "pads", 4, pads);
    tn_int(&t, "p", 3);
    struct tensor *in[1] = {&x}, *o[1] = {&y};
    assert_int_equal_msg_impl(run_node(&t.n, in, 1, o, 1, 1), 0, g_err);
    assert_int_equal(y.dims[2], 3);
    assert_int_equal(y.dims[3], 5);
    const float *xv = x.data;
    for (int c = 0; c < 2; c++)
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 5; j++) {
                double acc = 0;
                for (int a = 0; a < 2; a++)
                    for (int b = 0; b < 3; b++) {
                        int jj = j - 1 + b;
                        if (jj >= 0 && jj < 5) acc += pow(fabs(xv[(c * 4 + i + a) * 5 + jj]), 3);
                    }
                assert_true(fabs(((float *)y.data)[(c * 3 + i) * 5 + j] - pow(acc, 1.0 / 3)) < 1e-5);
            }
    free(y.data);
    tn_init(&t, "GlobalLpPool", 0);
    y = (struct tensor){0};
    assert_int_equal_msg_impl(run_node(&t.n, in, 1, o, 1, 1), 0, g_err);
    for (int c = 0; c < 2; c++) {
        double acc = 0;
        for (int i = 0; i < 20; i++) acc += xv[c * 20 + i] * xv[c * 20 + i];
        assert_true(fabs(((float *)y.data)[c] - sqrt(acc)) < 1e-5);
    }
    free(y.data);
    free(x.data);
}

/* ---- normalizations ---------------------------------------------------------- */

static void test_batchnorm(void **st) {
    (void)st;
    int64_t xd[4] = {2, 3, 4, 5}, cd = 3;
    struct tensor x = mk(4, xd, 1), sc = mk(1, &cd, 1), b = mk(1, &cd, 1), mu = mk(1, &cd, 1), var = mk(1, &cd, 1);
    for (int i = 0; i < 3; i++) ((float *)var.data)[i] = fabsf(((float *)var.data)[i]) + 0.5f;
    struct tnode t;
    tn_init(&t, "BatchNormalization", 0);
    tn_float(&t, "epsilon", 1e-3f);
    struct tensor y = {0};
    struct tensor *in[5] = {&x, &sc, &b, &mu, &var}, *o[1] = {&y};
    assert_int_equal_msg_impl(run_node(&t.n, in, 5, o, 1, 2), 0, g_err);
    for (int64_t i = 0; i < 120; i++) {
        int c = (int)((i / 20) % 3);
        float want = ((float *)sc.data)[c] * (((float *)x.data)[i] - ((float *)mu.data)[c]) /
                         sqrtf(((float *)var.data)[c] + 1e-3f) + ((float *)b.data)[c];
        assert_true(fabsf(((float *)y.data)[i] - want) < 1e-5f);
    }
    free(y.data);
    /* running statistics without training_mode are refused clearly */
    struct tensor rm = {0}, rv = {0};
    struct tensor *o3[3] = {&y, &rm, &rv};
    y = (struct tensor){0};
    assert_int_equal(run_node(&t.n, in, 5, o3, 3, 1), STATUS_UNSUPPORTED);
    assert_non_null(strstr(g_err, "training_mode"));
    free(y.data), free(rm.data), free(rv.data);
    /* training_mode=1: batch statistics, running mean/var with momentum */
    tn_int(&t, "training_mode", 1);
    tn_float(&t, "momentum", 0.8f);
    y = rm = rv = (struct tensor){0};
    assert_int_equal_msg_impl(run_node(&t.n, in, 5, o3, 3, 1), 0, g_err);
    for (int c = 0; c < 3; c++) {
        double m = 0, v = 0;
        for (int nn = 0; nn < 2; nn++)
            for (int i = 0; i < 20; i++) m += ((float *)x.data)[(nn * 3 + c) * 20 + i];
        m /= 40;
        for (int nn = 0; nn < 2; nn++)
            for (int i = 0; i < 20; i++) {
                double dv = ((float *)x.data)[(nn * 3 + c) * 20 + i] - m;
                v += dv * dv;
            }
        v /= 40;
        assert_true(fabs(((float *)rm.data)[c] - (((float *)mu.data)[c] * 0.8 + m * 0.2)) < 1e-5);
        assert_true(fabs(((float *)rv.data)[c] - (((float *)var.data)[c] * 0.8 + v * 0.2)) < 1e-5);
        for (int nn = 0; nn < 2; nn++)
            for (int i = 0; i < 20; i++) {
                int64_t k = (nn * 3 + c) * 20 + i;
                double want = ((float *)sc.data)[c] * (((float *)x.data)[k] - m) / sqrt(v + 1e-3) + ((float *)b.data)[c];
                assert_true(fabs(((float *)y.data)[k] - want) < 1e-4);
            }
    }
    free(y.data), free(rm.data), free(rv.data);
    free(x.data), free(sc.data), free(b.data), free(mu.data), free(var.data);
}

static void test_instancenorm_lrn(void **st) {
    (void)st;
    int64_t xd[4] = {2, 5, 3, 4}, cd = 5;
    struct tensor x = mk(4, xd, 1), sc = mk(1, &cd, 1), b = mk(1, &cd, 1), y = {0};
    struct tnode t;
    tn_init(&t, "InstanceNormalization", 0);
    struct tensor *in[3] = {&x, &sc, &b}, *o[1] = {&y};
    assert_int_equal_msg_impl(run_node(&t.n, in, 3, o, 1, 1), 0, g_err);
    for (int p = 0; p < 10; p++) {
        const float *xp = (const float *)x.data + p * 12;
        double m = 0, v = 0;
        for (int i = 0; i < 12; i++) m += xp[i];
        m /= 12;
        for (int i = 0; i < 12; i++) v += (xp[i] - m) * (xp[i] - m);
        v /= 12;
        for (int i = 0; i < 12; i++) {
            float want = (float)(((float *)sc.data)[p % 5] * (xp[i] - m) / sqrt(v + 1e-5) + ((float *)b.data)[p % 5]);
            assert_true(fabsf(((float *)y.data)[p * 12 + i] - want) < 1e-4f);
        }
    }
    free(y.data);
    /* LRN, odd and even sizes, beta 0.75 fast path and a general beta */
    for (int size = 2; size <= 5; size++)
        for (int bi = 0; bi < 2; bi++) {
            float beta = bi ? 0.6f : 0.75f;
            tn_init(&t, "LRN", 0);
            tn_int(&t, "size", size);
            tn_float(&t, "alpha", 0.01f);
            tn_float(&t, "beta", beta);
            tn_float(&t, "bias", 1.5f);
            y = (struct tensor){0};
            struct tensor *in1[1] = {&x};
            assert_int_equal_msg_impl(run_node(&t.n, in1, 1, o, 1, 1), 0, g_err);
            for (int n = 0; n < 2; n++)
                for (int c = 0; c < 5; c++)
                    for (int i = 0; i < 12; i++) {
                        double sq = 0;
                        for (int cc = c - (size - 1) / 2; cc <= c + size / 2; cc++)
                            if (cc >= 0 && cc < 5) {
                                float v = ((float *)x.data)[(n * 5 + cc) * 12 + i];
                                sq += v * v;
                            }
                        float xv = ((float *)x.data)[(n * 5 + c) * 12 + i];
                        float want = (float)(xv / pow(1.5 + 0.01 / size * sq, beta));
                        assert_true(fabsf(((float *)y.data)[(n * 5 + c) * 12 + i] - want) < 1e-5f);
                    }
            free(y.data);
        }
    free(x.data), free(sc.data), free(b.data);
}

static void test_groupnorm(void **st) {
    (void)st;
    int64_t xd[4] = {2, 6, 3, 2}, c6 = 6, c3 = 3;
    struct tensor x = mk(4, xd, 1);
    for (int per_group = 0; per_group < 2; per_group++) {
        struct tensor sc = mk(1, per_group ? &c3 : &c6, 1), b = mk(1, per_group ? &c3 : &c6, 1), y = {0};
        struct tnode t;
        tn_init(&t, "GroupNormalization", 0);
        tn_int(&t, "num_groups", 3);
        tn_float(&t, "epsilon", 1e-3f);
        struct tensor *in[3] = {&x, &sc, &b}, *o[1] = {&y};
        assert_int_equal_msg_impl(run_node(&t.n, in, 3, o, 1, 1), 0, g_err);
        for (int n = 0; n < 2; n++)
            for (int g = 0; g < 3; g++) {
                const float *xp = (const float *)x.data + (n * 6 + g * 2) * 6;
                double m = 0, v = 0;
                for (int i = 0; i < 12; i++) m += xp[i];
                m /= 12;
                for (int i = 0; i < 12; i++) v += (xp[i] - m) * (xp[i] - m);
                v /= 12;
                for (int i = 0; i < 12; i++) {
                    int k = per_group ? g : g * 2 + i / 6;
                    double want = ((float *)sc.data)[k] * (xp[i] - m) / sqrt(v + 1e-3) + ((float *)b.data)[k];
                    assert_true(fabs(((float *)y.data)[(n * 6 + g * 2) * 6 + i] - want) < 1e-4);
                }
            }
        free(sc.data), free(b.data), free(y.data);
    }
    free(x.data);
}

/* Col2Im folds blocks back: with stride == block the blocks tile the image
 * and the image comes back; with overlap each pixel sums its blocks. */
static void test_col2im(void **st) {
    (void)st;
    const int H = 4, W = 6, C = 2;
    struct tensor is = {DT_INT64, 1, {2}, NULL}, bs = {DT_INT64, 1, {2}, NULL};
    int64_t isv[2] = {H, W}, bsv[2] = {2, 3};
    is.data = isv;
    bs.data = bsv;
    for (int overlap = 0; overlap < 2; overlap++) {
        int64_t s[2] = {overlap ? 1 : 2, overlap ? 1 : 3};
        int64_t gh = (H - 2) / s[0] + 1, gw = (W - 3) / s[1] + 1;
        int64_t xd[3] = {1, C * 6, gh * gw};
        struct tensor x = mk(3, xd, 0), y = {0};
        /* im2col of the image v(c,h,w) = 100c + 10h + w */
        for (int c = 0; c < C; c++)
            for (int kh = 0; kh < 2; kh++)
                for (int kw = 0; kw < 3; kw++)
                    for (int64_t l = 0; l < gh * gw; l++) {
                        int64_t h = (l / gw) * s[0] + kh, w = (l % gw) * s[1] + kw;
                        ((float *)x.data)[((c * 6) + kh * 3 + kw) * gh * gw + l] = (float)(100 * c + 10 * h + w);
                    }
        struct tnode t;
        tn_init(&t, "Col2Im", 0);
        tn_ints(&t, "strides", 2, s);
        struct tensor *in[3] = {&x, &is, &bs}, *o[1] = {&y};
        assert_int_equal_msg_impl(run_node(&t.n, in, 3, o, 1, 1), 0, g_err);
        assert_int_equal(y.ndim, 4);
        assert_int_equal(y.dims[1], C);
        for (int c = 0; c < C; c++)
            for (int h = 0; h < H; h++)
                for (int w = 0; w < W; w++) {
                    int cover = 1;
                    if (overlap) { /* blocks covering (h, w) */
                        int ch = 0, cw = 0;
                        for (int bh = 0; bh < gh; bh++) ch += h >= bh && h < bh + 2;
                        for (int bw = 0; bw < gw; bw++) cw += w >= bw && w < bw + 3;
                        cover = ch * cw;
                    }
                    float want = (float)(cover * (100 * c + 10 * h + w));
                    assert_true(((float *)y.data)[(c * H + h) * W + w] == want);
                }
        free(x.data), free(y.data);
    }
}

/* DeformConv with zero offsets is Conv; a mask scales every tap. */
static void test_deform_conv(void **st) {
    (void)st;
    int64_t xd[4] = {2, 4, 6, 7}, wd[4] = {6, 2, 3, 3}, m = 6, od[4] = {2, 2 * 9 * 2, 4, 5}, mdim[4] = {2, 2 * 9, 4, 5};
    struct tensor x = mk(4, xd, 1), w = mk(4, wd, 1), b = mk(1, &m, 1), off = mk(4, od, 0), mask = mk(4, mdim, 0);
    memset(off.data, 0, tensor_nbytes(&off));
    for (int64_t i = 0; i < tensor_numel(&mask); i++) ((float *)mask.data)[i] = 0.5f;
    int64_t dil[2] = {1, 1}, strides[2] = {1, 1};
    struct tnode t;
    tn_init(&t, "Conv", 0);
    tn_int(&t, "group", 2);
    tn_ints(&t, "strides", 2, strides);
    tn_ints(&t, "dilations", 2, dil);
    struct tensor yc = {0}, yd = {0}, ym = {0}, nob = {0};
    struct tensor *cin[3] = {&x, &w, &b}, *o[1] = {&yc};
    assert_int_equal_msg_impl(run_node(&t.n, cin, 3, o, 1, 1), 0, g_err);
    tn_init(&t, "DeformConv", 0);
    tn_int(&t, "group", 2);
    tn_int(&t, "offset_group", 2);
    struct tensor *din[5] = {&x, &w, &off, &b, NULL}, *o2[1] = {&yd};
    assert_int_equal_msg_impl(run_node(&t.n, din, 4, o2, 1, 1), 0, g_err);
    assert_true(tensor_same_shape(&yc, &yd));
    expect_close(yd.data, yc.data, tensor_numel(&yc), 1e-5f, "DeformConv zero offsets");
    struct tensor *din2[5] = {&x, &w, &off, NULL, &mask}, *din3[3] = {&x, &w, &off}, *o3[1] = {&ym}, *o4[1] = {&nob};
    assert_int_equal_msg_impl(run_node(&t.n, din2, 5, o3, 1, 1), 0, g_err);
    assert_int_equal_msg_impl(run_node(&t.n, din3, 3, o4, 1, 1), 0, g_err);
    for (int64_t i = 0; i < tensor_numel(&ym); i++)
        assert_true(fabsf(((float *)ym.data)[i] - 0.5f * ((float *)nob.data)[i]) < 1e-5f);
    free(yc.data), free(yd.data), free(ym.data), free(nob.data);
    free(x.data), free(w.data), free(b.data), free(off.data), free(mask.data);
}

/* RoiAlign over an image whose value is its column: each bin averages the
 * columns of its samples. */
static void test_roialign(void **st) {
    (void)st;
    int64_t xd[4] = {1, 2, 10, 10}, rd[2] = {1, 4};
    struct tensor x = mk(4, xd, 0), rois = mk(2, rd, 0), bi = {DT_INT64, 1, {1}, (int64_t[]){0}}, y = {0};
    for (int i = 0; i < 200; i++) ((float *)x.data)[i] = (float)(i % 10);
    float r[4] = {2, 2, 6, 6};
    memcpy(rois.data, r, sizeof r);
    struct tnode t;
    tn_init(&t, "RoiAlign", 0);
    t.n.opset = 16;
    tn_int(&t, "output_height", 2);
    tn_int(&t, "output_width", 2);
    tn_int(&t, "sampling_ratio", 2);
    struct tensor *in[3] = {&x, &rois, &bi}, *o[1] = {&y};
    assert_int_equal_msg_impl(run_node(&t.n, in, 3, o, 1, 1), 0, g_err);
    assert_int_equal(y.dims[0], 1);
    assert_int_equal(y.dims[1], 2);
    for (int c = 0; c < 2; c++)
        for (int ph = 0; ph < 2; ph++) {
            assert_true(fabsf(((float *)y.data)[(c * 2 + ph) * 2 + 0] - 2.5f) < 1e-5f);
            assert_true(fabsf(((float *)y.data)[(c * 2 + ph) * 2 + 1] - 4.5f) < 1e-5f);
        }
    free(y.data);
    /* a batch index outside X is refused */
    ((int64_t *)bi.data)[0] = 3;
    y = (struct tensor){0};
    assert_int_not_equal(run_node(&t.n, in, 3, o, 1, 1), 0);
    assert_non_null(strstr(g_err, "batch index"));
    free(y.data), free(x.data), free(rois.data);
}

/* Plans at two batch sizes share one reordered copy of the weights; it
 * outlives the first plan and goes with the last, and new contents at the
 * same address after that are reordered afresh. */
static void test_weights_shared(void **st) {
    (void)st;
    int64_t wd[4] = {32, 16, 3, 3}, m = 32;
    struct tensor w = mk(4, wd, 1), b = mk(1, &m, 1);
    struct tnode t;
    tn_init(&t, "Conv", 0);
    int64_t pads[4] = {1, 1, 1, 1};
    tn_ints(&t, "pads", 4, pads);
    const struct op_def *d = op_find("", "Conv");
    void *state[2];
    struct op_call calls[2];
    struct tensor x[2], y[2];
    for (int i = 0; i < 2; i++) {
        int64_t xd[4] = {i + 1, 16, 10, 10};
        x[i] = mk(4, xd, 1);
        y[i] = (struct tensor){0};
        op_call_init(&calls[i], &t.n, 1, g_err, sizeof g_err);
        calls[i].nin = 3;
        calls[i].nout = 1;
        calls[i].in[0] = &x[i];
        calls[i].in[1] = &w;
        calls[i].in[2] = &b;
        calls[i].out[0] = &y[i];
        assert_int_equal(d->infer(&calls[i]), 0);
        y[i].data = malloc(tensor_nbytes(&y[i]));
        size_t ss = 0;
        assert_int_equal_msg_impl(d->prepare(&calls[i], &state[i], &ss), 0, g_err);
        calls[i].state = state[i];
        calls[i].scratch = aligned_alloc(64, (ss + 64) & ~(size_t)63);
        calls[i].scratch_size = ss;
    }
    d->release(state[0]);
    free(calls[0].scratch);
    assert_int_equal(d->run(&calls[1]), 0);
    /* batch item 1 of plan 2 against a fresh single-image plan */
    struct tensor x1 = {DT_FP32, 4, {1, 16, 10, 10}, (float *)x[1].data + 1600}, y1 = {0};
    struct tensor *in[3] = {&x1, &w, &b}, *o[1] = {&y1};
    assert_int_equal_msg_impl(run_node(&t.n, in, 3, o, 1, 1), 0, g_err);
    expect_close((float *)y[1].data + 3200, y1.data, 3200, 1e-5f, "shared weights");
    free(y1.data);
    d->release(state[1]);
    free(calls[1].scratch);
    /* the same address with new contents after every holder left */
    for (int64_t i = 0; i < tensor_numel(&w); i++) ((float *)w.data)[i] *= -1.0f;
    struct tensor y2 = {0}, y3 = {0};
    o[0] = &y2;
    assert_int_equal_msg_impl(run_node(&t.n, in, 3, o, 1, 1), 0, g_err);
    g_runtime_inputs = 2; /* no reorder at all: reads W as it is now */
    o[0] = &y3;
    assert_int_equal_msg_impl(run_node(&t.n, in, 3, o, 1, 1), 0, g_err);
    g_runtime_inputs = 0;
    expect_close(y2.data, y3.data, 3200, 1e-5f, "weights changed after release");
    free(y2.data), free(y3.data);
    /* the cache API directly: same key, same buffer */
    dnnl_memory_desc_t a, bmd;
    int64_t dims[2] = {64, 64};
    dnnl_util_plain_md(&a, 2, dims);
    dnnl_memory_desc_init_by_tag(&bmd, 2, (dnnl_dims_t){64, 64}, dnnl_f32, dnnl_ba);
    float *src = calloc(64 * 64, sizeof(float));
    struct op_call c;
    op_call_init(&c, &t.n, 1, g_err, sizeof g_err);
    void *p1 = dnnl_util_weights_acquire(&c, &a, src, &bmd), *p2 = dnnl_util_weights_acquire(&c, &a, src, &bmd);
    assert_non_null(p1);
    assert_ptr_equal(p1, p2);
    dnnl_util_weights_release(p1);
    dnnl_util_weights_release(p2);
    free(src);
    free(x[0].data), free(x[1].data), free(y[0].data), free(y[1].data), free(w.data), free(b.data);
}

/* ---- parameters decoded at prepare ------------------------------------------------ */

/* Runs t as a plan does, but with every attribute renamed between prepare
 * and run: a lookup by name in run() would then get the default, so the
 * output equals a plain run's only when run() reads what prepare decoded. */
static void expect_decoded_once(struct tnode *t, struct tensor **in, int nin) {
    struct tensor want = {0}, got = {0}, *o[1] = {&want};
    assert_int_equal_msg_impl(run_node(&t->n, in, nin, o, 1, 1), 0, g_err);
    const struct op_def *d = op_find("", t->n.op_type);
    struct op_call c;
    op_call_init(&c, &t->n, 1, g_err, sizeof g_err);
    c.nin = nin;
    c.nout = 1;
    for (int i = 0; i < nin; i++) c.in[i] = in[i];
    c.out[0] = &got;
    assert_int_equal_msg_impl(d->infer(&c), 0, g_err);
    got.data = calloc(1, tensor_nbytes(&got) + 1);
    void *state = NULL;
    size_t ss = 0;
    assert_int_equal_msg_impl(d->prepare(&c, &state, &ss), 0, g_err);
    char *names[TN_MAX_ATTRS];
    for (int i = 0; i < t->n.nattr; i++) {
        names[i] = t->a[i].name;
        t->a[i].name = "renamed";
    }
    c.state = state;
    c.scratch = ss ? aligned_alloc(64, (ss + 63) & ~(size_t)63) : NULL;
    c.scratch_size = ss;
    int rc = d->run(&c);
    for (int i = 0; i < t->n.nattr; i++) t->a[i].name = names[i];
    assert_int_equal_msg_impl(rc, 0, g_err);
    assert_int_equal(tensor_numel(&got), tensor_numel(&want));
    if (memcmp(got.data, want.data, tensor_nbytes(&want)))
        fail_msg("%s: run() computed another result once the attributes were renamed", t->n.op_type);
    free(c.scratch);
    d->release(state);
    free(got.data), free(want.data);
}

/* Conv, ConvTranspose (oneDNN's and the loop's cases), AveragePool, LRN and
 * GroupNormalization with attributes other than their defaults. */
static void test_decoded_at_prepare(void **st) {
    (void)st;
    int64_t xd[4] = {1, 4, 7, 6}, wd[4] = {6, 2, 3, 3}, twd[4] = {4, 3, 3, 3}, m6 = 6, c4 = 4;
    struct tensor x = mk(4, xd, 1), w = mk(4, wd, 1), tw = mk(4, twd, 1), b = mk(1, &m6, 1);
    struct tensor sc = mk(1, &c4, 1), sb = mk(1, &c4, 1);
    int64_t s2[2] = {2, 2}, s32[2] = {3, 2}, d2[2] = {2, 1}, pads[4] = {1, 0, 1, 2}, k3[2] = {3, 3}, op[2] = {2, 1};
    struct tnode t;
    struct tensor *in[3] = {&x, &w, &b};
    tn_init(&t, "Conv", 0);
    tn_ints(&t, "strides", 2, s2);
    tn_ints(&t, "dilations", 2, d2);
    tn_ints(&t, "pads", 4, pads);
    tn_int(&t, "group", 2);
    expect_decoded_once(&t, in, 3);
    in[1] = &tw;
    for (int loop = 0; loop < 2; loop++) { /* output_padding past the pads: the loop */
        tn_init(&t, "ConvTranspose", 0);
        tn_ints(&t, "strides", 2, loop ? s32 : s2);
        tn_ints(&t, "pads", 4, pads);
        tn_int(&t, "group", 2);
        if (loop) tn_ints(&t, "output_padding", 2, op);
        expect_decoded_once(&t, in, 3);
    }
    tn_init(&t, "AveragePool", 0);
    tn_ints(&t, "kernel_shape", 2, k3);
    tn_ints(&t, "strides", 2, s2);
    tn_ints(&t, "pads", 4, pads);
    tn_int(&t, "count_include_pad", 1);
    expect_decoded_once(&t, in, 1);
    tn_init(&t, "LRN", 0);
    tn_int(&t, "size", 3);
    tn_float(&t, "alpha", 0.01f);
    tn_float(&t, "beta", 0.6f);
    tn_float(&t, "bias", 1.5f);
    expect_decoded_once(&t, in, 1);
    struct tensor *gin[3] = {&x, &sc, &sb};
    tn_init(&t, "GroupNormalization", 0);
    tn_int(&t, "num_groups", 2);
    tn_float(&t, "epsilon", 0.5f);
    expect_decoded_once(&t, gin, 3);
    free(x.data), free(w.data), free(tw.data), free(b.data), free(sc.data), free(sb.data);
}

/* ---- concurrency ------------------------------------------------------------------ */

struct conc_arg {
    const struct op_def *d;
    struct op_call c;
    const float *want;
    int64_t n;
    int ok;
};

static void *conc_main(void *p) {
    struct conc_arg *a = p;
    a->ok = 1;
    for (int r = 0; r < 20 && a->ok; r++) {
        memset(a->c.out[0]->data, 0, sizeof(float) * (size_t)a->n);
        if (a->d->run(&a->c) != 0) a->ok = 0;
        for (int64_t i = 0; i < a->n && a->ok; i++)
            if (fabsf(((float *)a->c.out[0]->data)[i] - a->want[i]) > 1e-4f * (1 + fabsf(a->want[i]))) a->ok = 0;
    }
    return NULL;
}

/* Four threads run one prepared Conv state with their own buffers. */
static void test_concurrent_runs(void **st) {
    (void)st;
    enum { T = 4 };
    int64_t xd[4] = {1, 16, 14, 14}, wd[4] = {32, 16, 3, 3}, m = 32;
    struct tensor w = mk(4, wd, 1), b = mk(1, &m, 1), x[T], y[T];
    struct tnode t;
    tn_init(&t, "Conv", 0);
    int64_t pads[4] = {1, 1, 1, 1};
    tn_ints(&t, "pads", 4, pads);
    t.n.act = ACT_RELU;
    const struct op_def *d = op_find("", "Conv");
    struct conc_arg args[T];
    float *want[T];
    void *state = NULL;
    size_t ss = 0;
    for (int i = 0; i < T; i++) {
        x[i] = mk(4, xd, 1);
        y[i] = (struct tensor){0};
        struct op_call c;
        op_call_init(&c, &t.n, 1, g_err, sizeof g_err);
        c.nin = 3;
        c.nout = 1;
        c.in[0] = &x[i];
        c.in[1] = &w;
        c.in[2] = &b;
        c.out[0] = &y[i];
        assert_int_equal(d->infer(&c), 0);
        y[i].data = malloc(tensor_nbytes(&y[i]));
        if (i == 0) assert_int_equal_msg_impl(d->prepare(&c, &state, &ss), 0, g_err);
        c.state = state;
        c.scratch = aligned_alloc(64, (ss + 64) & ~(size_t)63);
        c.scratch_size = ss;
        assert_int_equal(d->run(&c), 0);
        want[i] = malloc(tensor_nbytes(&y[i]));
        memcpy(want[i], y[i].data, tensor_nbytes(&y[i]));
        args[i] = (struct conc_arg){d, c, want[i], tensor_numel(&y[i]), 0};
    }
    pthread_t th[T];
    for (int i = 0; i < T; i++) pthread_create(&th[i], NULL, conc_main, &args[i]);
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        assert_true(args[i].ok);
        free(args[i].c.scratch);
        free(want[i]);
        free(x[i].data);
        free(y[i].data);
    }
    d->release(state);
    free(w.data);
    free(b.data);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv_cases),      cmocka_unit_test(test_conv_errors),
        cmocka_unit_test(test_conv_identical_filters),
        cmocka_unit_test(test_conv_qdq_tie),
        cmocka_unit_test(test_conv_transpose),  cmocka_unit_test(test_quantized_matmul), cmocka_unit_test(test_matmulinteger_int8_gemm),
        cmocka_unit_test(test_dynamic_quantized_matmul),
        cmocka_unit_test(test_quantized_conv), cmocka_unit_test(test_convinteger_int8_gemm),
        cmocka_unit_test(test_matmul_cases),    cmocka_unit_test(test_gemm_cases),
        cmocka_unit_test(test_maxpool_indices), cmocka_unit_test(test_pool_paths_agree), cmocka_unit_test(test_pool_plain_rows),
        cmocka_unit_test(test_avgpool),         cmocka_unit_test(test_global_pools),
        cmocka_unit_test(test_lp_pools),        cmocka_unit_test(test_maxunpool),
        cmocka_unit_test(test_batchnorm),       cmocka_unit_test(test_instancenorm_lrn),
        cmocka_unit_test(test_groupnorm),       cmocka_unit_test(test_col2im),
        cmocka_unit_test(test_deform_conv),     cmocka_unit_test(test_roialign),
        cmocka_unit_test(test_weights_shared),  cmocka_unit_test(test_concurrent_runs),
        cmocka_unit_test(test_decoded_at_prepare),
        cmocka_unit_test(test_channels_last_kernels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
