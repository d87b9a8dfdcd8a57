/* test_ops_einsum.c - Einsum against loops written here: a repeated index
 * (a diagonal, with a batch), a reduction, a batch matmul, a transpose, an
 * implicit output with an ellipsis that broadcasts, integers; the sgemm
 * path against the general loop; clear refusals. */
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

static float *F(const struct tensor *t) { return t->data; }

/* Runs Einsum with the equation on nin operands into y. */
static int einsum(const char *eq, const struct tensor *const *in, int nin, struct tensor *y) {
    struct tnode tn;
    tn_init(&tn, "Einsum", 12);
    tn_str(&tn, "equation", eq);
    struct tensor *out[1] = {y};
    return tn_call(&tn.n, in, nin, out, 1, 2);
}

static void expect_shape(const struct tensor *t, int ndim, const int64_t *dims) {
    assert_int_equal(t->ndim, ndim);
    for (int i = 0; i < ndim; i++) assert_int_equal(t->dims[i], dims[i]);
}

static void expect_near(float got, float want, const char *what, int i) {
    if (!(fabsf(got - want) <= 1e-5f + 1e-5f * fabsf(want)))
        fail_msg("%s: element %d is %.7g, expected %.7g", what, i, got, want);
}

/* "bii->bi": the diagonal of each matrix of a batch. */
static void test_einsum_diagonal(void **st) {
    (void)st;
    struct tensor x = tn_rand_f32(3, (int64_t[]){2, 3, 3}), y = {0};
    const struct tensor *in[1] = {&x};
    assert_int_equal(einsum("bii->bi", in, 1, &y), 0);
    expect_shape(&y, 2, (int64_t[]){2, 3});
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < 3; i++) expect_near(F(&y)[b * 3 + i], F(&x)[(b * 3 + i) * 3 + i], "bii->bi", b * 3 + i);
    free(y.data);
    /* "ii" alone sums the diagonal: the trace */
    y = (struct tensor){0};
    struct tensor m = tn_rand_f32(2, (int64_t[]){4, 4});
    const struct tensor *in2[1] = {&m};
    assert_int_equal(einsum("ii", in2, 1, &y), 0);
    assert_int_equal(y.ndim, 0);
    expect_near(F(&y)[0], F(&m)[0] + F(&m)[5] + F(&m)[10] + F(&m)[15], "trace", 0);
    free(x.data), free(y.data), free(m.data);
}

/* "ij->i": row sums. */
static void test_einsum_reduction(void **st) {
    (void)st;
    struct tensor x = tn_rand_f32(2, (int64_t[]){3, 5}), y = {0};
    const struct tensor *in[1] = {&x};
    assert_int_equal(einsum("ij->i", in, 1, &y), 0);
    expect_shape(&y, 1, (int64_t[]){3});
    for (int i = 0; i < 3; i++) {
        float s = 0;
        for (int j = 0; j < 5; j++) s += F(&x)[i * 5 + j];
        expect_near(F(&y)[i], s, "ij->i", i);
    }
    free(x.data), free(y.data);
}

/* "bij, bjk -> bik" (spaces as ONNX's own test has them). */
static void test_einsum_batch_matmul(void **st) {
    (void)st;
    struct tensor a = tn_rand_f32(3, (int64_t[]){4, 2, 3}), b = tn_rand_f32(3, (int64_t[]){4, 3, 5}), y = {0};
    const struct tensor *in[2] = {&a, &b};
    assert_int_equal(einsum("bij, bjk -> bik", in, 2, &y), 0);
    expect_shape(&y, 3, (int64_t[]){4, 2, 5});
    for (int n = 0; n < 4; n++)
        for (int i = 0; i < 2; i++)
            for (int k = 0; k < 5; k++) {
                float s = 0;
                for (int j = 0; j < 3; j++) s += F(&a)[(n * 2 + i) * 3 + j] * F(&b)[(n * 3 + j) * 5 + k];
                expect_near(F(&y)[(n * 2 + i) * 5 + k], s, "bik", (n * 2 + i) * 5 + k);
            }
    free(a.data), free(b.data), free(y.data);
}

/* "ij->ji", and the implicit "ba" (output letters sorted: "ab"). */
static void test_einsum_transpose(void **st) {
    (void)st;
    struct tensor x = tn_rand_f32(2, (int64_t[]){3, 4}), y = {0}, z = {0};
    const struct tensor *in[1] = {&x};
    assert_int_equal(einsum("ij->ji", in, 1, &y), 0);
    assert_int_equal(einsum("ba", in, 1, &z), 0);
    expect_shape(&y, 2, (int64_t[]){4, 3});
    expect_shape(&z, 2, (int64_t[]){4, 3});
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) {
            expect_near(F(&y)[j * 3 + i], F(&x)[i * 4 + j], "ij->ji", j * 3 + i);
            expect_near(F(&z)[j * 3 + i], F(&x)[i * 4 + j], "ba", j * 3 + i);
        }
    free(x.data), free(y.data), free(z.data);
}

/* "...ij,...jk" (implicit: "...ik") with batch dims [2, 1] against [3]:
 * the ellipses broadcast to [2, 3]. */
static void test_einsum_ellipsis_broadcast(void **st) {
    (void)st;
    struct tensor a = tn_rand_f32(4, (int64_t[]){2, 1, 2, 3}), b = tn_rand_f32(3, (int64_t[]){3, 3, 2}), y = {0};
    const struct tensor *in[2] = {&a, &b};
    assert_int_equal(einsum("...ij,...jk", in, 2, &y), 0);
    expect_shape(&y, 4, (int64_t[]){2, 3, 2, 2});
    for (int p = 0; p < 2; p++)
        for (int q = 0; q < 3; q++)
            for (int i = 0; i < 2; i++)
                for (int k = 0; k < 2; k++) {
                    float s = 0;
                    for (int j = 0; j < 3; j++) s += F(&a)[(p * 2 + i) * 3 + j] * F(&b)[(q * 3 + j) * 2 + k];
                    int o = ((p * 3 + q) * 2 + i) * 2 + k;
                    expect_near(F(&y)[o], s, "...ik", o);
                }
    free(a.data), free(b.data), free(y.data);
}

/* Three int64 operands, an outer product: exact. */
static void test_einsum_int64_outer(void **st) {
    (void)st;
    int64_t av[2] = {2, -3}, bv[3] = {5, 7, 11}, cv[2] = {1, 1000000007};
    struct tensor a = {DT_INT64, 1, {2}, av}, b = {DT_INT64, 1, {3}, bv}, cc = {DT_INT64, 1, {2}, cv}, y = {0};
    const struct tensor *in[3] = {&a, &b, &cc};
    assert_int_equal(einsum("i,j,k->ijk", in, 3, &y), 0);
    expect_shape(&y, 3, (int64_t[]){2, 3, 2});
    assert_int_equal(y.dtype, DT_INT64);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 2; k++) assert_true(((int64_t *)y.data)[(i * 3 + j) * 2 + k] == av[i] * bv[j] * cv[k]);
    free(y.data);
}

static struct tensor to_f64(const struct tensor *t) {
    struct tensor d = *t;
    d.dtype = DT_FP64;
    d.data = malloc(sizeof(double) * (size_t)(tensor_numel(t) + 1));
    for (int64_t i = 0; i < tensor_numel(t); i++) ((double *)d.data)[i] = F(t)[i];
    return d;
}

/* Two float32 operands go through sgemm; float64 ones through the general
 * loop: both agree where the GEMM's gathers do something unusual (a
 * diagonal, a broadcast ellipsis, the output's groups interleaved, a
 * scalar result, an empty inner dim; a summed label on one operand only
 * keeps float32 on the general loop). */
static void test_einsum_gemm_matches_general(void **st) {
    (void)st;
    static const struct {
        const char *eq;
        int nd[2];
        int64_t a[4], b[4];
    } cases[] = {
        {"iij,jk->ik", {3, 2}, {3, 3, 4}, {4, 5}},        {"ij,k->i", {2, 1}, {3, 4}, {5}},
        {"bij,bjk->kib", {3, 3}, {2, 3, 4}, {2, 4, 5}},   {"...ij,jk->...ki", {4, 2}, {2, 1, 3, 4}, {4, 2}},
        {"ab,ba", {2, 2}, {3, 4}, {4, 3}},                {"ij,jk->ik", {2, 2}, {2, 0}, {0, 3}},
        {"abcd,cdef->abef", {4, 4}, {2, 3, 4, 5}, {4, 5, 2, 3}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct tensor a = tn_rand_f32(cases[i].nd[0], cases[i].a), b = tn_rand_f32(cases[i].nd[1], cases[i].b);
        struct tensor a64 = to_f64(&a), b64 = to_f64(&b), y = {0}, y64 = {0};
        const struct tensor *in[2] = {&a, &b}, *in64[2] = {&a64, &b64};
        assert_int_equal(einsum(cases[i].eq, in, 2, &y), 0);
        assert_int_equal(einsum(cases[i].eq, in64, 2, &y64), 0);
        assert_int_equal(y.ndim, y64.ndim);
        for (int64_t j = 0; j < tensor_numel(&y); j++)
            expect_near(F(&y)[j], (float)((double *)y64.data)[j], cases[i].eq, (int)j);
        free(a.data), free(b.data), free(a64.data), free(b64.data), free(y.data), free(y64.data);
    }
}

static void test_einsum_refusals(void **st) {
    (void)st;
    struct tensor a = tn_rand_f32(2, (int64_t[]){2, 3}), b = tn_rand_f32(2, (int64_t[]){4, 5}), y = {0};
    const struct tensor *in[2] = {&a, &b};
    assert_int_equal(einsum("ij,jk->ik", in, 2, &y), STATUS_INVALID);
    assert_non_null(strstr(g_err, "label sizes disagree: 3 against 4"));
    assert_int_equal(einsum("ij->ik", in, 1, &y), STATUS_INVALID);
    assert_non_null(strstr(g_err, "an output label is on no operand"));
    assert_int_equal(einsum("ij,k", in, 2, &y), STATUS_INVALID);
    assert_non_null(strstr(g_err, "term 1 names 1 dims for an operand of rank 2"));
    assert_int_equal(einsum("i;j", in, 1, &y), STATUS_INVALID);
    assert_non_null(strstr(g_err, "unexpected ';'"));
    assert_int_equal(einsum("ij,jk", in, 1, &y), STATUS_INVALID);
    assert_non_null(strstr(g_err, "2 terms for 1 operands"));
    free(a.data), free(b.data);
}

int main(void) {
    g_run_without_attrs = 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_einsum_diagonal),        cmocka_unit_test(test_einsum_reduction),
        cmocka_unit_test(test_einsum_batch_matmul),    cmocka_unit_test(test_einsum_transpose),
        cmocka_unit_test(test_einsum_ellipsis_broadcast), cmocka_unit_test(test_einsum_int64_outer),
        cmocka_unit_test(test_einsum_gemm_matches_general), cmocka_unit_test(test_einsum_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
