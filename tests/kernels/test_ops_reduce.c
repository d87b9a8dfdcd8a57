/* test_ops_reduce.c - the reduce family through its op table entries against
 * a reference written here (a plain walk over every input element): every
 * reduction over every subset of axes of a 4-D tensor with and without
 * keepdims, axes as attribute (old opsets) or input (new ones), negative
 * axes, noop_with_empty_axes, empty reductions, integer and bool data, the
 * threaded path, ArgMax/ArgMin with select_last_index, the losses (weights,
 * ignore_index, log_prob, bad labels), LpNormalization, MeanVarianceNormalization
 * and clear refusals. */
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

static uint64_t g_rng = 0x2545f4914f6cdd1dull;
static float frand(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((g_rng >> 11) % 2000001) / 1000000.0f - 1.0f;
}

static struct tensor mk(enum dtype dt, int ndim, const int64_t *dims) {
    struct tensor t = {dt, ndim, {0}, NULL};
    for (int i = 0; i < ndim; i++) t.dims[i] = dims[i];
    int64_t n = tensor_numel(&t);
    t.data = calloc((size_t)(n > 0 ? n : 1), dtype_size(dt));
    return t;
}
#define F(t) ((float *)(t).data)

static int call(struct tnode *tn, const struct tensor **in, int nin, struct tensor *o, int threads) {
    return tn_call(&tn->n, in, nin, &o, 1, threads);
}

/* ---- reference ----------------------------------------------------------- */

enum { K_SUM, K_MEAN, K_MAX, K_MIN, K_PROD, K_L1, K_L2, K_LOGSUM, K_LOGSUMEXP, K_SUMSQ, K_N };
static const char *k_ops[K_N] = {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
                                 "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"};

/* Reduces x (float, shape dims) over mask into ref (kept dims in order). */
static void ref_reduce(const float *x, const int64_t *dims, int nd, unsigned mask, int k, double *ref, int64_t nout) {
    double acc[4096], aux[4096];
    int64_t cnt[4096];
    for (int64_t o = 0; o < nout; o++) {
        acc[o] = k == K_PROD ? 1 : k == K_MAX ? -INFINITY : k == K_MIN ? INFINITY : 0;
        aux[o] = -INFINITY;
        cnt[o] = 0;
    }
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= dims[i];
    /* pass 1 for the max of logsumexp */
    for (int pass = 0; pass < 2; pass++)
        for (int64_t e = 0; e < n; e++) {
            int64_t r = e, o = 0, mul = 1;
            for (int i = nd - 1; i >= 0; i--) {
                int64_t idx = r % dims[i];
                r /= dims[i];
                if (!(mask >> i & 1)) {
                    o += idx * mul;
                    mul *= dims[i];
                }
            }
            double v = x[e];
            if (pass == 0) {
                aux[o] = fmax(aux[o], v);
                continue;
            }
            cnt[o]++;
            switch (k) {
            case K_SUM: case K_MEAN: case K_LOGSUM: acc[o] += v; break;
            case K_MAX: acc[o] = fmax(acc[o], v); break;
            case K_MIN: acc[o] = fmin(acc[o], v); break;
            case K_PROD: acc[o] *= v; break;
            case K_L1: acc[o] += fabs(v); break;
            case K_L2: case K_SUMSQ: acc[o] += v * v; break;
            case K_LOGSUMEXP: acc[o] += exp(v - aux[o]); break;
            }
        }
    for (int64_t o = 0; o < nout; o++) {
        double v = acc[o];
        if (k == K_MEAN) v /= (double)cnt[o];
        else if (k == K_L2) v = sqrt(v);
        else if (k == K_LOGSUM) v = log(v);
        else if (k == K_LOGSUMEXP) v = aux[o] + log(v);
        ref[o] = v;
    }
}

/* Every reduction, every axis subset, keepdims 0/1, attribute and input axes. */
static void test_all_axes(void **state) {
    (void)state;
    int64_t dims[] = {2, 3, 4, 5};
    struct tensor x = mk(DT_FP32, 4, dims);
    for (int i = 0; i < 120; i++) F(x)[i] = frand() * 0.5f + 1.0f; /* positive for LogSum, tame for Prod */
    double ref[120];
    for (int k = 0; k < K_N; k++)
        for (unsigned mask = 1; mask < 16; mask++)
            for (int keep = 0; keep < 2; keep++)
                for (int by_input = 0; by_input < 2; by_input++) {
                    int64_t axes[4];
                    int na = 0;
                    for (int i = 0; i < 4; i++)
                        if (mask >> i & 1) {
                            axes[na] = (na % 2) ? i - 4 : i; /* mix negative axes in */
                            na++;
                        }
                    int opset = by_input ? (k == K_SUM ? 13 : 18) : (k == K_SUM ? 11 : 13);
                    struct tnode tn;
                    tn_init(&tn, k_ops[k], opset);
                    tn_int(&tn, "keepdims", keep);
                    struct tensor ax = mk(DT_INT64, 1, (int64_t[]){na}), o = {0};
                    memcpy(ax.data, axes, sizeof(int64_t) * (size_t)na);
                    if (!by_input) tn_ints(&tn, "axes", na, axes);
                    const struct tensor *in[2] = {&x, &ax};
                    assert_int_equal(call(&tn, in, by_input ? 2 : 1, &o, 1), 0);
                    int64_t nout = 1;
                    int expect_nd = 0;
                    for (int i = 0; i < 4; i++) {
                        if (!(mask >> i & 1)) nout *= dims[i], expect_nd++;
                        else if (keep) expect_nd++;
                    }
                    assert_int_equal(o.ndim, expect_nd);
                    assert_int_equal(tensor_numel(&o), nout);
                    ref_reduce(F(x), dims, 4, mask, k, ref, nout);
                    for (int64_t i = 0; i < nout; i++) {
                        double tol = 1e-5 * fmax(1.0, fabs(ref[i]));
                        if (fabs(F(o)[i] - ref[i]) > tol)
                            fail_msg("%s mask %u keep %d: [%lld] got %g expected %g", k_ops[k], mask, keep,
                                     (long long)i, F(o)[i], ref[i]);
                    }
                    free(o.data);
                    free(ax.data);
                }
    free(x.data);
}

static void test_empty_axes(void **state) {
    (void)state;
    int64_t dims[] = {2, 3};
    struct tensor x = mk(DT_FP32, 2, dims), o = {0}, ax = mk(DT_INT64, 1, (int64_t[]){0});
    for (int i = 0; i < 6; i++) F(x)[i] = (float)i;
    struct tnode tn;
    /* empty axes input: reduce everything */
    tn_init(&tn, "ReduceSum", 13);
    const struct tensor *in[2] = {&x, &ax};
    assert_int_equal(call(&tn, in, 2, &o, 1), 0);
    assert_int_equal(tensor_numel(&o), 1);
    assert_int_equal(o.ndim, 2);
    assert_float_equal(F(o)[0], 15, 0);
    free(o.data);
    /* ... unless noop_with_empty_axes */
    tn_int(&tn, "noop_with_empty_axes", 1);
    assert_int_equal(call(&tn, in, 2, &o, 1), 0);
    assert_int_equal(tensor_numel(&o), 6);
    for (int i = 0; i < 6; i++) assert_float_equal(F(o)[i], i, 0);
    free(o.data);
    /* absent axes input */
    tn_init(&tn, "ReduceMean", 18);
    tn_int(&tn, "keepdims", 0);
    assert_int_equal(call(&tn, in, 1, &o, 1), 0);
    assert_int_equal(o.ndim, 0);
    assert_float_equal(F(o)[0], 2.5, 1e-6);
    free(o.data);
    free(x.data);
    free(ax.data);
}

static void test_empty_set(void **state) {
    (void)state;
    int64_t dims[] = {2, 0, 4};
    struct tensor x = mk(DT_FP32, 3, dims), ax = mk(DT_INT64, 1, (int64_t[]){1});
    ((int64_t *)ax.data)[0] = 1;
    double expect[K_N] = {0, NAN, -INFINITY, INFINITY, 1, 0, 0, -INFINITY, -INFINITY, 0};
    for (int k = 0; k < K_N; k++) {
        if (k == K_MEAN) continue;
        struct tnode tn;
        tn_init(&tn, k_ops[k], 18);
        struct tensor o = {0};
        const struct tensor *in[2] = {&x, &ax};
        assert_int_equal(call(&tn, in, 2, &o, 1), 0);
        assert_int_equal(tensor_numel(&o), 8);
        for (int i = 0; i < 8; i++) assert_true(F(o)[i] == expect[k]);
        free(o.data);
    }
    free(x.data);
    free(ax.data);
}

static void test_int_and_bool(void **state) {
    (void)state;
    int64_t dims[] = {2, 3};
    struct tensor x = mk(DT_INT64, 2, dims), o = {0};
    int64_t xv[] = {INT64_MAX, 1, -3, 4, 5, -6};
    memcpy(x.data, xv, sizeof xv);
    struct tnode tn;
    tn_init(&tn, "ReduceMax", 13);
    tn_ints(&tn, "axes", 1, (int64_t[]){1});
    tn_int(&tn, "keepdims", 0);
    const struct tensor *in[1] = {&x};
    assert_int_equal(call(&tn, in, 1, &o, 1), 0);
    assert_int_equal(((int64_t *)o.data)[0], INT64_MAX); /* exact, no trip through double */
    assert_int_equal(((int64_t *)o.data)[1], 5);
    free(o.data);
    tn_init(&tn, "ReduceSum", 11);
    tn_ints(&tn, "axes", 1, (int64_t[]){0});
    assert_int_equal(call(&tn, in, 1, &o, 1), 0);
    assert_int_equal(((int64_t *)o.data)[1], 6);
    assert_int_equal(((int64_t *)o.data)[2], -9);
    free(o.data);

    struct tensor b = mk(DT_BOOL, 2, dims);
    uint8_t bv[] = {0, 1, 0, 0, 0, 0};
    memcpy(b.data, bv, sizeof bv);
    tn_init(&tn, "ReduceMax", 20);
    tn_int(&tn, "keepdims", 0);
    struct tensor ax = mk(DT_INT64, 1, (int64_t[]){1});
    ((int64_t *)ax.data)[0] = 1;
    const struct tensor *inb[2] = {&b, &ax};
    assert_int_equal(call(&tn, inb, 2, &o, 1), 0);
    assert_int_equal(o.dtype, DT_BOOL);
    assert_int_equal(((uint8_t *)o.data)[0], 1);
    assert_int_equal(((uint8_t *)o.data)[1], 0);
    free(o.data);
    /* a sum of bools is refused */
    tn_init(&tn, "ReduceSum", 13);
    assert_int_equal(call(&tn, inb, 2, &o, 1), STATUS_UNSUPPORTED);
    assert_non_null(strstr(g_err, "bool"));
    free(b.data);
    free(ax.data);
    free(x.data);
}

static void test_threaded_matches_serial(void **state) {
    (void)state;
    int64_t dims[] = {64, 96, 33};
    struct tensor x = mk(DT_FP32, 3, dims);
    for (int64_t i = 0; i < 64 * 96 * 33; i++) F(x)[i] = frand();
    int64_t axsets[3][2] = {{2, 0}, {1, 0}, {0, 2}};
    int nax[3] = {1, 1, 2};
    for (int s = 0; s < 3; s++) {
        struct tnode tn;
        tn_init(&tn, "ReduceMean", 13);
        tn_ints(&tn, "axes", nax[s], axsets[s]);
        struct tensor o1 = {0}, o4 = {0};
        const struct tensor *in[1] = {&x};
        assert_int_equal(call(&tn, in, 1, &o1, 1), 0);
        assert_int_equal(call(&tn, in, 1, &o4, 4), 0);
        assert_memory_equal(o1.data, o4.data, sizeof(float) * (size_t)tensor_numel(&o1));
        free(o1.data);
        free(o4.data);
    }
    free(x.data);
}

static void test_errors(void **state) {
    (void)state;
    int64_t dims[] = {2, 3};
    struct tensor x = mk(DT_FP32, 2, dims), o = {0};
    struct tnode tn;
    tn_init(&tn, "ReduceSum", 11);
    tn_ints(&tn, "axes", 1, (int64_t[]){2});
    const struct tensor *in[1] = {&x};
    assert_int_not_equal(call(&tn, in, 1, &o, 1), 0);
    assert_non_null(strstr(g_err, "out of range"));
    tn_init(&tn, "ReduceSum", 11);
    tn_ints(&tn, "axes", 2, (int64_t[]){1, -1});
    assert_int_not_equal(call(&tn, in, 1, &o, 1), 0);
    assert_non_null(strstr(g_err, "twice"));
    /* axes only known at run time */
    struct tensor ax = {DT_INT64, 1, {1}, NULL};
    tn_init(&tn, "ReduceMean", 18);
    const struct tensor *in2[2] = {&x, &ax};
    assert_int_equal(call(&tn, in2, 2, &o, 1), STATUS_DATA_DEPENDENT);
    assert_non_null(strstr(g_err, "axes"));
    free(x.data);
}

static void test_argmax(void **state) {
    (void)state;
    int64_t dims[] = {2, 4};
    struct tensor x = mk(DT_FP32, 2, dims), o = {0};
    float xv[] = {1, 3, 3, 0, -1, -5, 4, -5};
    memcpy(x.data, xv, sizeof xv);
    struct {
        const char *op;
        int axis, last, keep;
        int64_t expect[4];
        int n;
    } cases[] = {
        {"ArgMax", 1, 0, 1, {1, 2}, 2},       {"ArgMax", 1, 1, 1, {2, 2}, 2},
        {"ArgMin", 1, 0, 0, {3, 1}, 2},       {"ArgMin", -1, 1, 0, {3, 3}, 2},
        {"ArgMax", 0, 0, 1, {0, 0, 1, 0}, 4},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct tnode tn;
        tn_init(&tn, cases[i].op, 13);
        tn_int(&tn, "axis", cases[i].axis);
        tn_int(&tn, "select_last_index", cases[i].last);
        tn_int(&tn, "keepdims", cases[i].keep);
        const struct tensor *in[1] = {&x};
        assert_int_equal(call(&tn, in, 1, &o, 1), 0);
        assert_int_equal(o.dtype, DT_INT64);
        assert_int_equal(o.ndim, cases[i].keep ? 2 : 1);
        assert_int_equal(tensor_numel(&o), cases[i].n);
        for (int j = 0; j < cases[i].n; j++) assert_int_equal(((int64_t *)o.data)[j], cases[i].expect[j]);
        free(o.data);
    }
    free(x.data);
}

/* ---- losses and normalizations -------------------------------------------- */

static int call_n(struct tnode *tn, const struct tensor **in, int nin, struct tensor **out, int nout) {
    return tn_call(&tn->n, in, nin, out, nout, 1);
}

static void test_losses(void **state) {
    (void)state;
    /* scores [N=3, C=4, d=2], labels [3, 2], weights [4] */
    int64_t xd[] = {3, 4, 2}, td[] = {3, 2}, wd[] = {4};
    struct tensor x = mk(DT_FP32, 3, xd), t = mk(DT_INT64, 2, td), w = mk(DT_FP32, 1, wd);
    for (int i = 0; i < 24; i++) F(x)[i] = frand() * 3;
    int64_t labels[] = {0, 3, 2, 2, 1, 0};
    memcpy(t.data, labels, sizeof labels);
    float wv[] = {0.5f, 1.0f, 2.0f, 0.25f};
    memcpy(w.data, wv, sizeof wv);
    /* reference log-softmax over C */
    double logp[24];
    for (int b = 0; b < 3; b++)
        for (int k = 0; k < 2; k++) {
            double m = -INFINITY, s = 0;
            for (int j = 0; j < 4; j++) m = fmax(m, F(x)[(b * 4 + j) * 2 + k]);
            for (int j = 0; j < 4; j++) s += exp(F(x)[(b * 4 + j) * 2 + k] - m);
            for (int j = 0; j < 4; j++) logp[(b * 4 + j) * 2 + k] = F(x)[(b * 4 + j) * 2 + k] - m - log(s);
        }
    /* SoftmaxCrossEntropyLoss, weighted mean with ignore_index 2, and log_prob */
    struct tnode tn;
    tn_init(&tn, "SoftmaxCrossEntropyLoss", 13);
    tn_int(&tn, "ignore_index", 2);
    struct tensor loss = {0}, lp = {0};
    const struct tensor *in[3] = {&x, &t, &w};
    struct tensor *out[2] = {&loss, &lp};
    assert_int_equal(call_n(&tn, in, 3, out, 2), 0);
    assert_int_equal(loss.ndim, 0);
    double num = 0, den = 0;
    for (int b = 0; b < 3; b++)
        for (int k = 0; k < 2; k++) {
            int64_t l = labels[b * 2 + k];
            if (l == 2) continue;
            num += -logp[(b * 4 + l) * 2 + k] * wv[l];
            den += wv[l];
        }
    assert_float_equal(F(loss)[0], num / den, 1e-5);
    for (int i = 0; i < 24; i++) assert_float_equal(F(lp)[i], logp[i], 1e-5);
    free(loss.data);
    free(lp.data);
    /* NegativeLogLikelihoodLoss over the log-probabilities, no reduction */
    struct tensor xl = mk(DT_FP32, 3, xd);
    for (int i = 0; i < 24; i++) F(xl)[i] = (float)logp[i];
    tn_init(&tn, "NegativeLogLikelihoodLoss", 13);
    tn_str(&tn, "reduction", "none");
    const struct tensor *in2[2] = {&xl, &t};
    struct tensor *out1[1] = {&loss};
    assert_int_equal(call_n(&tn, in2, 2, out1, 1), 0);
    assert_int_equal(loss.ndim, 2);
    for (int b = 0; b < 3; b++)
        for (int k = 0; k < 2; k++)
            assert_float_equal(F(loss)[b * 2 + k], -logp[(b * 4 + labels[b * 2 + k]) * 2 + k], 1e-6);
    free(loss.data);
    /* a label out of range is an error, not a wild read */
    ((int64_t *)t.data)[3] = 7;
    assert_int_not_equal(call_n(&tn, in2, 2, out1, 1), 0);
    assert_non_null(strstr(g_err, "label 7"));
    free(loss.data);
    tn_init(&tn, "NegativeLogLikelihoodLoss", 13);
    tn_str(&tn, "reduction", "median");
    assert_int_not_equal(call_n(&tn, in2, 2, out1, 1), 0);
    assert_non_null(strstr(g_err, "reduction"));
    free(x.data);
    free(xl.data);
    free(t.data);
    free(w.data);
}

static void test_lp_and_mvn(void **state) {
    (void)state;
    int64_t d[] = {2, 3};
    struct tensor x = mk(DT_FP32, 2, d), o = {0};
    float xv[] = {3, 0, -1, -4, 0, 2};
    memcpy(x.data, xv, sizeof xv);
    struct tnode tn;
    tn_init(&tn, "LpNormalization", 1);
    tn_int(&tn, "axis", 0);
    tn_int(&tn, "p", 1);
    const struct tensor *in[1] = {&x};
    struct tensor *out[1] = {&o};
    assert_int_equal(call_n(&tn, in, 1, out, 1), 0);
    float e1[] = {3.0f / 7, 0, -1.0f / 3, -4.0f / 7, 0, 2.0f / 3}; /* zero norm gives 0 */
    for (int i = 0; i < 6; i++) assert_float_equal(F(o)[i], e1[i], 1e-6);
    free(o.data);
    tn_init(&tn, "LpNormalization", 1); /* p 2 over the last axis */
    assert_int_equal(call_n(&tn, in, 1, out, 1), 0);
    assert_float_equal(F(o)[0], 3 / sqrt(10.0), 1e-6);
    assert_float_equal(F(o)[5], 2 / sqrt(20.0), 1e-6);
    free(o.data);
    tn_int(&tn, "p", 3);
    assert_int_not_equal(call_n(&tn, in, 1, out, 1), 0);
    assert_non_null(strstr(g_err, "'p'"));

    /* MVN with its default axes [0, 2, 3]: per channel */
    int64_t d4[] = {2, 3, 2, 2};
    struct tensor x4 = mk(DT_FP32, 4, d4);
    for (int i = 0; i < 24; i++) F(x4)[i] = frand() * 2;
    tn_init(&tn, "MeanVarianceNormalization", 13);
    const struct tensor *in4[1] = {&x4};
    assert_int_equal(call_n(&tn, in4, 1, out, 1), 0);
    for (int ch = 0; ch < 3; ch++) {
        double s = 0, s2 = 0;
        for (int b = 0; b < 2; b++)
            for (int k = 0; k < 4; k++) {
                double v = F(x4)[(b * 3 + ch) * 4 + k];
                s += v;
                s2 += v * v;
            }
        double mean = s / 8, sd = sqrt(s2 / 8 - mean * mean);
        for (int b = 0; b < 2; b++)
            for (int k = 0; k < 4; k++) {
                int i = (b * 3 + ch) * 4 + k;
                assert_float_equal(F(o)[i], (F(x4)[i] - mean) / (sd + 1e-9), 1e-5);
            }
    }
    free(o.data);
    free(x4.data);
    free(x.data);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_axes),     cmocka_unit_test(test_empty_axes),
        cmocka_unit_test(test_empty_set),    cmocka_unit_test(test_int_and_bool),
        cmocka_unit_test(test_threaded_matches_serial), cmocka_unit_test(test_errors),
        cmocka_unit_test(test_argmax),       cmocka_unit_test(test_losses),
        cmocka_unit_test(test_lp_and_mvn),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
