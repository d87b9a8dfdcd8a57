/* test_ops_elementwise.c - the elementwise family through its op table entries
 * (infer then run, as a plan calls them), against reference loops written
 * here: broadcasting in every stride pattern (and threaded), integer
 * wrap-around and division by zero, Mod's two sign conventions, half types,
 * the variadic ops, Clip by opset, Where, Cast (saturation, NaN, refusals),
 * Softmax/LogSoftmax before and since opset 13, LayerNormalization with its
 * statistics outputs, Gelu's two forms, (de)quantization per tensor, per
 * axis and blocked, and clear errors for bad input. */
#include <float.h>
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

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
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
static struct tensor mkf(int ndim, const int64_t *dims) {
    struct tensor t = mk(DT_FP32, ndim, dims);
    for (int64_t i = 0; i < tensor_numel(&t); i++) ((float *)t.data)[i] = frand();
    return t;
}
#define F(t) ((float *)(t).data)

/* Runs infer, allocates the outputs, runs; returns the first failing status.
 * nout outputs (NULL entries are absent optional outputs). */
static int call(struct tnode *tn, const struct tensor **in, int nin, struct tensor **out, int nout, int threads) {
    return tn_call(&tn->n, in, nin, out, nout, threads);
}

static int call1(const char *op, int opset, const struct tensor *a, const struct tensor *b, struct tensor *o) {
    struct tnode tn;
    tn_init(&tn, op, opset);
    const struct tensor *in[2] = {a, b};
    struct tensor *out[1] = {o};
    return call(&tn, in, b ? 2 : 1, out, 1, 1);
}

/* Broadcast index of flat output index i into a tensor of shape t. */
static int64_t bidx(const struct tensor *o, const struct tensor *t, int64_t i) {
    int64_t off = 0, st = 1;
    for (int d = o->ndim - 1; d >= 0; d--) {
        int64_t idx = i % o->dims[d];
        i /= o->dims[d];
        int td = t->ndim - o->ndim + d;
        if (td >= 0) {
            if (t->dims[td] != 1) off += idx * st;
            st *= t->dims[td];
        }
    }
    return off;
}

/* ---- broadcasting ----------------------------------------------------- */

static void check_add(int na, const int64_t *da, int nb, const int64_t *db, int threads) {
    struct tensor a = mkf(na, da), b = mkf(nb, db), o = {0};
    struct tnode tn;
    tn_init(&tn, "Add", 14);
    const struct tensor *in[2] = {&a, &b};
    struct tensor *out[1] = {&o};
    assert_int_equal(call(&tn, in, 2, out, 1, threads), 0);
    for (int64_t i = 0; i < tensor_numel(&o); i++)
        assert_float_equal(F(o)[i], F(a)[bidx(&o, &a, i)] + F(b)[bidx(&o, &b, i)], 1e-6);
    free(a.data);
    free(b.data);
    free(o.data);
}

static void test_broadcast_patterns(void **state) {
    (void)state;
    int64_t s23[] = {2, 3}, s3[] = {3}, s21[] = {2, 1}, s13[] = {1, 3}, s1[] = {1};
    check_add(2, s23, 2, s23, 1); /* same shape */
    check_add(2, s23, 1, s3, 1);  /* row */
    check_add(2, s21, 2, s13, 1); /* outer product */
    check_add(2, s23, 0, s1, 1);  /* scalar right */
    check_add(0, s1, 2, s23, 1);  /* scalar left */
    int64_t n4[] = {2, 3, 4, 5}, c4[] = {3, 1, 1}, w4[] = {2, 1, 4, 1};
    check_add(4, n4, 3, c4, 1); /* per-channel bias */
    check_add(4, n4, 4, w4, 1); /* interleaved broadcast dims */
    /* large enough for the threaded paths: many rows, and one long row */
    int64_t big[] = {300, 1000}, row[] = {1000}, col[] = {300, 1}, flat[] = {200000};
    check_add(2, big, 1, row, 4);
    check_add(2, big, 2, col, 4);
    check_add(1, flat, 1, flat, 4);
}

static void test_broadcast_error(void **state) {
    (void)state;
    int64_t s23[] = {2, 3}, s4[] = {4};
    struct tensor a = mkf(2, s23), b = mkf(1, s4), o = {0};
    assert_int_not_equal(call1("Mul", 14, &a, &b, &o), 0);
    assert_non_null(strstr(g_err, "cannot be broadcast"));
    assert_non_null(strstr(g_err, "(Mul)"));
    struct tensor i = mk(DT_INT32, 1, s4);
    assert_int_not_equal(call1("Add", 14, &b, &i, &o), 0);
    assert_non_null(strstr(g_err, "must match"));
    free(a.data);
    free(b.data);
    free(i.data);
}

/* ---- integers ---------------------------------------------------------- */

static void test_int_arith(void **state) {
    (void)state;
    int64_t s4[] = {4};
    struct tensor a = mk(DT_INT32, 1, s4), b = mk(DT_INT32, 1, s4), o = {0};
    int32_t *pa = a.data, *pb = b.data;
    pa[0] = INT32_MAX; pb[0] = 1;
    pa[1] = INT32_MIN; pb[1] = -1;
    pa[2] = 7;         pb[2] = 0;
    pa[3] = -7;        pb[3] = 2;
    assert_int_equal(call1("Add", 14, &a, &b, &o), 0);
    assert_int_equal(((int32_t *)o.data)[0], INT32_MIN); /* wraps */
    free(o.data);
    assert_int_equal(call1("Div", 14, &a, &b, &o), 0);
    int32_t *po = o.data;
    assert_int_equal(po[1], INT32_MIN); /* INT_MIN / -1 wraps instead of trapping */
    assert_int_equal(po[2], 0);         /* division by zero gives 0 */
    assert_int_equal(po[3], -3);        /* truncation toward zero, as C and numpy's int division for ONNX */
    free(o.data);
    free(a.data);
    free(b.data);
}

static void test_mod_signs(void **state) {
    (void)state;
    int64_t s4[] = {4};
    struct tensor a = mk(DT_INT64, 1, s4), b = mk(DT_INT64, 1, s4), o = {0};
    int64_t av[] = {-7, 7, -7, 5}, bv[] = {3, -3, -3, 0};
    memcpy(a.data, av, sizeof av);
    memcpy(b.data, bv, sizeof bv);
    assert_int_equal(call1("Mod", 13, &a, &b, &o), 0);
    int64_t py[] = {2, -2, -1, 0}; /* Python's %: sign of the divisor */
    for (int i = 0; i < 4; i++) assert_int_equal(((int64_t *)o.data)[i], py[i]);
    free(o.data);
    struct tnode tn;
    tn_init(&tn, "Mod", 13);
    tn_int(&tn, "fmod", 1);
    const struct tensor *in[2] = {&a, &b};
    struct tensor *out[1] = {&o};
    assert_int_equal(call(&tn, in, 2, out, 1, 1), 0);
    int64_t cm[] = {-1, 1, -1, 0}; /* C's %: sign of the dividend */
    for (int i = 0; i < 4; i++) assert_int_equal(((int64_t *)o.data)[i], cm[i]);
    free(o.data);
    free(a.data);
    free(b.data);
}

/* ---- half types and variadic ops --------------------------------------- */

static void test_fp16_add_and_max(void **state) {
    (void)state;
    int64_t s3[] = {3};
    struct tensor a = mk(DT_FP16, 1, s3), b = mk(DT_FP16, 1, s3), o = {0};
    float av[] = {1.5f, -2.0f, 0.25f}, bv[] = {2.0f, 8.0f, -0.5f};
    for (int i = 0; i < 3; i++) {
        ((uint16_t *)a.data)[i] = fp32_to_fp16(av[i]);
        ((uint16_t *)b.data)[i] = fp32_to_fp16(bv[i]);
    }
    assert_int_equal(call1("Add", 14, &a, &b, &o), 0);
    assert_int_equal(o.dtype, DT_FP16);
    for (int i = 0; i < 3; i++) assert_float_equal(fp16_to_fp32(((uint16_t *)o.data)[i]), av[i] + bv[i], 1e-3);
    free(o.data);
    assert_int_equal(call1("Max", 13, &a, &b, &o), 0);
    for (int i = 0; i < 3; i++)
        assert_float_equal(fp16_to_fp32(((uint16_t *)o.data)[i]), fmaxf(av[i], bv[i]), 1e-3);
    free(o.data);
    free(a.data);
    free(b.data);
}

static void test_variadic(void **state) {
    (void)state;
    int64_t s1[] = {1}, s23[] = {2, 3}, s3[] = {3};
    struct tensor a = mkf(1, s1), b = mkf(2, s23), c = mkf(1, s3);
    const char *ops[] = {"Sum", "Mean", "Max", "Min"};
    for (int k = 0; k < 4; k++) {
        struct tnode tn;
        tn_init(&tn, ops[k], 13);
        struct tensor o = {0};
        const struct tensor *in[3] = {&a, &b, &c};
        struct tensor *out[1] = {&o};
        assert_int_equal(call(&tn, in, 3, out, 1, 1), 0);
        assert_int_equal(o.ndim, 2);
        for (int64_t i = 0; i < 6; i++) {
            float x = F(a)[0], y = F(b)[i], z = F(c)[i % 3], e;
            if (k == 0) e = x + y + z;
            else if (k == 1) e = (x + y + z) / 3;
            else if (k == 2) e = fmaxf(x, fmaxf(y, z));
            else e = fminf(x, fminf(y, z));
            assert_float_equal(F(o)[i], e, 1e-6);
        }
        free(o.data);
    }
    free(a.data);
    free(b.data);
    free(c.data);
}

/* ---- Clip and Where ---------------------------------------------------- */

static void test_clip_by_opset(void **state) {
    (void)state;
    int64_t s5[] = {5};
    struct tensor x = mk(DT_FP32, 1, s5), o = {0};
    float xv[] = {-3, -1, 0, 1, 3};
    memcpy(x.data, xv, sizeof xv);
    /* opset 6: attributes */
    struct tnode tn;
    tn_init(&tn, "Clip", 6);
    tn_float(&tn, "min", -1.5f);
    tn_float(&tn, "max", 2.0f);
    const struct tensor *in1[1] = {&x};
    struct tensor *out[1] = {&o};
    assert_int_equal(call(&tn, in1, 1, out, 1, 1), 0);
    float e6[] = {-1.5f, -1, 0, 1, 2};
    for (int i = 0; i < 5; i++) assert_float_equal(F(o)[i], e6[i], 0);
    free(o.data);
    /* opset 13: optional inputs, min absent */
    struct tensor mx = mk(DT_FP32, 0, NULL);
    F(mx)[0] = 0.5f;
    tn_init(&tn, "Clip", 13);
    const struct tensor *in3[3] = {&x, NULL, &mx};
    assert_int_equal(call(&tn, in3, 3, out, 1, 1), 0);
    float e13[] = {-3, -1, 0, 0.5f, 0.5f};
    for (int i = 0; i < 5; i++) assert_float_equal(F(o)[i], e13[i], 0);
    free(o.data);
    /* int8 with both bounds */
    struct tensor xi = mk(DT_INT8, 1, s5), lo = mk(DT_INT8, 0, NULL), hi = mk(DT_INT8, 0, NULL);
    int8_t xiv[] = {-100, -5, 0, 5, 100};
    memcpy(xi.data, xiv, sizeof xiv);
    *(int8_t *)lo.data = -10;
    *(int8_t *)hi.data = 10;
    const struct tensor *ini[3] = {&xi, &lo, &hi};
    assert_int_equal(call(&tn, ini, 3, out, 1, 1), 0);
    int8_t ei[] = {-10, -5, 0, 5, 10};
    for (int i = 0; i < 5; i++) assert_int_equal(((int8_t *)o.data)[i], ei[i]);
    free(o.data);
    free(x.data);
    free(mx.data);
    free(xi.data);
    free(lo.data);
    free(hi.data);
}

static void test_where(void **state) {
    (void)state;
    int64_t s21[] = {2, 1}, s3[] = {3}, s1[] = {1};
    struct tensor c = mk(DT_BOOL, 2, s21), x = mk(DT_INT64, 1, s3), y = mk(DT_INT64, 1, s1), o = {0};
    ((uint8_t *)c.data)[0] = 1;
    ((uint8_t *)c.data)[1] = 0;
    for (int i = 0; i < 3; i++) ((int64_t *)x.data)[i] = 10 + i;
    ((int64_t *)y.data)[0] = -1;
    struct tnode tn;
    tn_init(&tn, "Where", 16);
    const struct tensor *in[3] = {&c, &x, &y};
    struct tensor *out[1] = {&o};
    assert_int_equal(call(&tn, in, 3, out, 1, 1), 0);
    int64_t e[] = {10, 11, 12, -1, -1, -1};
    assert_int_equal(o.ndim, 2);
    for (int i = 0; i < 6; i++) assert_int_equal(((int64_t *)o.data)[i], e[i]);
    free(o.data);
    /* a float condition is refused clearly */
    struct tensor fc = mkf(2, s21);
    const struct tensor *bad[3] = {&fc, &x, &y};
    assert_int_not_equal(call(&tn, bad, 3, out, 1, 1), 0);
    assert_non_null(strstr(g_err, "condition must be bool"));
    free(fc.data);
    free(c.data);
    free(x.data);
    free(y.data);
}

/* ---- Cast --------------------------------------------------------------- */

static int cast_to(const struct tensor *x, enum dtype to, struct tensor *o) {
    struct tnode tn;
    tn_init(&tn, "Cast", 19);
    tn_int(&tn, "to", to);
    const struct tensor *in[1] = {x};
    struct tensor *out[1] = {o};
    return call(&tn, in, 1, out, 1, 1);
}

static void test_cast(void **state) {
    (void)state;
    int64_t s6[] = {6};
    struct tensor x = mk(DT_FP32, 1, s6), o = {0};
    float xv[] = {1.75f, -2.5f, NAN, 1e20f, -1e20f, 0.0f};
    memcpy(x.data, xv, sizeof xv);
    assert_int_equal(cast_to(&x, DT_INT32, &o), 0);
    int32_t ei[] = {1, -2, 0, INT32_MAX, INT32_MIN, 0}; /* truncation, NaN 0, saturation */
    for (int i = 0; i < 6; i++) assert_int_equal(((int32_t *)o.data)[i], ei[i]);
    free(o.data);
    assert_int_equal(cast_to(&x, DT_BOOL, &o), 0);
    uint8_t eb[] = {1, 1, 1, 1, 1, 0};
    for (int i = 0; i < 6; i++) assert_int_equal(((uint8_t *)o.data)[i], eb[i]);
    free(o.data);
    /* float -> half -> double keeps exactly representable values */
    struct tensor h = {0}, d = {0};
    assert_int_equal(cast_to(&x, DT_FP16, &h), 0);
    assert_int_equal(cast_to(&h, DT_FP64, &d), 0);
    assert_float_equal(((double *)d.data)[0], 1.75, 0);
    assert_float_equal(((double *)d.data)[1], -2.5, 0);
    assert_true(isnan(((double *)d.data)[2]));
    assert_true(isinf(((double *)d.data)[3])); /* out of half's range */
    free(h.data);
    free(d.data);
    /* int64 -> float and uint8 -> float */
    struct tensor i64 = mk(DT_INT64, 1, s6);
    for (int i = 0; i < 6; i++) ((int64_t *)i64.data)[i] = (int64_t)i * 1000 - 2500;
    assert_int_equal(cast_to(&i64, DT_FP32, &o), 0);
    for (int i = 0; i < 6; i++) assert_float_equal(F(o)[i], i * 1000.0f - 2500, 0);
    free(o.data);
    /* unknown dtypes are refused with a message */
    assert_int_equal(cast_to(&x, (enum dtype)14, &o), STATUS_UNSUPPORTED); /* complex64 */
    assert_non_null(strstr(g_err, "'to'"));
    free(x.data);
    free(i64.data);
}

/* Casts n numbers of dtype dt at v to strings and expects want[i] each. */
static void expect_text(enum dtype dt, const void *v, int n, const char *const *want) {
    int64_t d[] = {n};
    struct tensor x = mk(dt, 1, d), o = {0};
    memcpy(x.data, v, (size_t)n * dtype_size(dt));
    assert_int_equal(cast_to(&x, DT_STRING, &o), 0);
    assert_int_equal(o.dtype, DT_STRING);
    for (int i = 0; i < n; i++)
        if (!tn_str_is(tensor_strs(&o)[i], want[i]))
            fail_msg("%s element %d: \"%.*s\", want \"%s\"", dtype_name(dt), i, (int)tensor_strs(&o)[i].len,
                     tensor_strs(&o)[i].p, want[i]);
    free(x.data);
    free(o.data);
}

/* A string tensor of the n C strings s (borrowed). */
static struct tensor strs_of(int n, const char *const *s, struct tensor_str *e) {
    for (int i = 0; i < n; i++) e[i] = tensor_str_of(s[i]);
    struct tensor t = {DT_STRING, 1, {n}, e};
    return t;
}

/* The text onnxruntime writes and reads (the e2e test compares the two
 * side by side on every dtype; these are the forms, spelled out). */
static void test_cast_strings(void **state) {
    (void)state;
    float f[] = {0.1f, 1e20f, -0.0f, NAN, -NAN, INFINITY, -INFINITY, 1.0f / 3, 123456789.0f, 1e-45f};
    const char *wf[] = {"0.1", "1e+20", "-0", "NaN", "NaN", "INF", "-INF", "0.33333334", "1.2345679e+08",
                        "1.4012985e-45"};
    expect_text(DT_FP32, f, 10, wf);
    double dv[] = {0.1, 5e-324, 1.0 / 3};
    const char *wd[] = {"0.1", "4.9406565e-324", "0.33333333"};
    expect_text(DT_FP64, dv, 3, wd);
    uint16_t h[] = {fp32_to_fp16(0.1f), fp32_to_fp16(65504.0f)}, bh[] = {fp32_to_bf16(0.1f)};
    const char *wh[] = {"0.099975586", "65504"}, *wbh[] = {"0.10009766"};
    expect_text(DT_FP16, h, 2, wh);
    expect_text(DT_BF16, bh, 1, wbh);
    int64_t i64[] = {INT64_MIN, INT64_MAX, 0, -1};
    const char *wi64[] = {"-9223372036854775808", "9223372036854775807", "0", "-1"};
    expect_text(DT_INT64, i64, 4, wi64);
    uint64_t u64[] = {UINT64_MAX};
    const char *wu64[] = {"18446744073709551615"};
    expect_text(DT_UINT64, u64, 1, wu64);
    int8_t i8[] = {-128, 127};
    const char *wi8[] = {"-128", "127"};
    expect_text(DT_INT8, i8, 2, wi8);
    uint8_t b[] = {1, 0}, e4[] = {0x7e}; /* float8e4m3fn 0x7e is 448 */
    const char *wb[] = {"1", "0"}, *we4[] = {"448"};
    expect_text(DT_BOOL, b, 2, wb);
    expect_text(DT_FP8E4M3FN, e4, 1, we4);
    uint8_t e8[] = {0x7f, 0x80, 0x7d, 0xff}; /* float8e8m0: 2^(bits - 127), 0xff NaN */
    const char *we8[] = {"1", "2", "0.25", "NaN"};
    expect_text(DT_FP8E8M0, e8, 4, we8);
    int8_t i4[] = {-8, 7}; /* int4, one byte each in memory */
    const char *wi4[] = {"-8", "7"};
    expect_text(DT_INT4, i4, 2, wi4);

    /* strtoll/strtoull/strtod's reading: white space, signs, trailing bytes
     * ignored, integers through int64 or uint64 keeping the low bits */
    struct tensor_str e[8];
    const char *si[] = {" 12", "+7", "-7", "0x10", "12abc", "3000000000", "-1", "1.9"};
    struct tensor s = strs_of(8, si, e), o = {0};
    assert_int_equal(cast_to(&s, DT_INT32, &o), 0);
    int32_t w32[] = {12, 7, -7, 0, 12, -1294967296, -1, 1};
    assert_memory_equal(o.data, w32, sizeof w32);
    free(o.data);
    assert_int_equal(cast_to(&s, DT_UINT8, &o), 0);
    uint8_t wu8[] = {12, 7, 249, 0, 12, 0, 255, 1};
    assert_memory_equal(o.data, wu8, sizeof wu8);
    free(o.data);
    assert_int_equal(cast_to(&s, DT_BOOL, &o), 0);
    uint8_t wbool[] = {1, 1, 1, 0, 1, 1, 1, 1};
    assert_memory_equal(o.data, wbool, sizeof wbool);
    free(o.data);
    const char *sf[] = {"0x1p-3", "-inf", "NaN", "1e39", "1e-50", "\t2\n", "1,5", "-0"};
    s = strs_of(8, sf, e);
    assert_int_equal(cast_to(&s, DT_FP32, &o), 0);
    float wf32[] = {0.125f, -INFINITY, NAN, INFINITY, 0.0f, 2.0f, 1.0f, -0.0f};
    for (int i = 0; i < 8; i++)
        if (i == 2) assert_true(isnan(F(o)[i]));
        else assert_memory_equal(&F(o)[i], &wf32[i], sizeof(float));
    free(o.data);
    assert_int_equal(cast_to(&s, DT_FP64, &o), 0);
    assert_true(((double *)o.data)[4] == 1e-50); /* a double holds it */
    free(o.data);
    /* float8 from text saturates as the attribute says (default 1) */
    const char *s8[] = {"1e20"};
    s = strs_of(1, s8, e);
    assert_int_equal(cast_to(&s, DT_FP8E4M3FN, &o), 0);
    assert_int_equal(((uint8_t *)o.data)[0], 0x7e);
    free(o.data);
    const char *s4[] = {"0.3", "8", "1000", "-inf"}; /* as from a float (round_mode up for e8m0) */
    s = strs_of(4, s4, e);
    assert_int_equal(cast_to(&s, DT_FP8E8M0, &o), 0);
    uint8_t we8m0[] = {0x7e, 0x82, 0x89, 0xff};
    assert_memory_equal(o.data, we8m0, sizeof we8m0);
    free(o.data);
    assert_int_equal(cast_to(&s, DT_INT4, &o), 0);
    int8_t wi4s[] = {0, -8, -8, 0}; /* 1000 keeps its low four bits: 8, as an int4 -8 */
    assert_memory_equal(o.data, wi4s, sizeof wi4s);
    free(o.data);

    /* what onnxruntime refuses: no number, or beyond int64/uint64/double;
     * the element is named and shown escaped */
    const char *bad[] = {"1", "\x01x\"y"};
    s = strs_of(2, bad, e);
    assert_int_equal(cast_to(&s, DT_INT64, &o), STATUS_INVALID);
    assert_non_null(strstr(g_err, "node 'n0' (Cast): string element 1 \"\\x01x\\\"y\" is not a number"));
    free(o.data);
    const char *big[] = {"99999999999999999999", "", "1e309"};
    s = strs_of(1, big, e);
    assert_int_equal(cast_to(&s, DT_UINT64, &o), STATUS_INVALID);
    assert_non_null(strstr(g_err, "string element 0 \"99999999999999999999\" is out of the range of uint64"));
    free(o.data);
    s = strs_of(1, big + 1, e);
    assert_int_equal(cast_to(&s, DT_FP32, &o), STATUS_INVALID);
    assert_non_null(strstr(g_err, "string element 0 \"\" is not a number"));
    free(o.data);
    s = strs_of(1, big + 2, e);
    assert_int_equal(cast_to(&s, DT_FP16, &o), STATUS_INVALID);
    assert_non_null(strstr(g_err, "is out of the range of double"));
    free(o.data);
    /* a string longer than the stack copy, and one that is not NUL-terminated */
    char longs[300];
    memset(longs, ' ', sizeof longs);
    memcpy(longs + 290, "42", 2);
    struct tensor_str le[2] = {{longs, 292}, {"7123", 1}};
    struct tensor ls = {DT_STRING, 1, {2}, le};
    assert_int_equal(cast_to(&ls, DT_INT16, &o), 0);
    int16_t w16[] = {42, 7};
    assert_memory_equal(o.data, w16, sizeof w16);
    free(o.data);
}

/* ---- softmax family --------------------------------------------------- */

static void ref_softmax(const float *x, float *y, int64_t outer, int64_t len, int64_t inner, int logs) {
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            double m = -INFINITY, s = 0;
            for (int64_t j = 0; j < len; j++) m = fmax(m, x[(o * len + j) * inner + i]);
            for (int64_t j = 0; j < len; j++) s += exp(x[(o * len + j) * inner + i] - m);
            for (int64_t j = 0; j < len; j++) {
                double v = x[(o * len + j) * inner + i] - m;
                y[(o * len + j) * inner + i] = (float)(logs ? v - log(s) : exp(v) / s);
            }
        }
}

static void test_softmax_opsets(void **state) {
    (void)state;
    int64_t s[] = {2, 3, 4};
    struct tensor x = mkf(3, s), o = {0};
    float ref[24];
    for (int logs = 0; logs < 2; logs++) {
        const char *op = logs ? "LogSoftmax" : "Softmax";
        /* opset 11, axis 1: coerced to [2, 12] */
        struct tnode tn;
        tn_init(&tn, op, 11);
        tn_int(&tn, "axis", 1);
        const struct tensor *in[1] = {&x};
        struct tensor *out[1] = {&o};
        assert_int_equal(call(&tn, in, 1, out, 1, 1), 0);
        ref_softmax(F(x), ref, 2, 12, 1, logs);
        for (int i = 0; i < 24; i++) assert_float_equal(F(o)[i], ref[i], 1e-5);
        free(o.data);
        /* opset 13, axis 1: only that axis */
        tn_init(&tn, op, 13);
        tn_int(&tn, "axis", 1);
        assert_int_equal(call(&tn, in, 1, out, 1, 1), 0);
        ref_softmax(F(x), ref, 2, 3, 4, logs);
        for (int i = 0; i < 24; i++) assert_float_equal(F(o)[i], ref[i], 1e-5);
        free(o.data);
        /* opset 13 default axis -1 */
        tn_init(&tn, op, 13);
        assert_int_equal(call(&tn, in, 1, out, 1, 1), 0);
        ref_softmax(F(x), ref, 6, 4, 1, logs);
        for (int i = 0; i < 24; i++) assert_float_equal(F(o)[i], ref[i], 1e-5);
        free(o.data);
    }
    /* large inputs do not overflow */
    for (int i = 0; i < 24; i++) F(x)[i] = 1000.0f + (float)i;
    assert_int_equal(call1("Softmax", 13, &x, NULL, &o), 0);
    ref_softmax(F(x), ref, 6, 4, 1, 0);
    for (int i = 0; i < 24; i++) assert_float_equal(F(o)[i], ref[i], 1e-5);
    free(o.data);
    free(x.data);
}

/* Over a middle axis with many columns behind it (YOLOv8's DFL: [1, 16, 4,
 * anchors] over 16): the column-block loop, a partial last block, two
 * threads, and values large enough to overflow exp without the max. */
static void test_softmax_middle_axis(void **state) {
    (void)state;
    int64_t s[] = {3, 16, 150};
    struct tensor x = mkf(3, s), o = {0};
    int64_t n = 3 * 16 * 150;
    for (int64_t i = 0; i < n; i++) F(x)[i] = (float)((i * 37) % 101) * 0.25f + (i % 7 == 0 ? 400.0f : 0.0f);
    float *ref = malloc(sizeof(float) * (size_t)n);
    for (int logs = 0; logs < 2; logs++)
        for (int nt = 1; nt <= 2; nt++) {
            struct tnode tn;
            tn_init(&tn, logs ? "LogSoftmax" : "Softmax", 13);
            tn_int(&tn, "axis", 1);
            const struct tensor *in[1] = {&x};
            struct tensor *out[1] = {&o};
            assert_int_equal(call(&tn, in, 1, out, 1, nt), 0);
            ref_softmax(F(x), ref, 3, 16, 150, logs);
            for (int64_t i = 0; i < n; i++) assert_float_equal(F(o)[i], ref[i], logs ? 1e-4 : 1e-6);
            free(o.data);
        }
    free(ref);
    free(x.data);
}

/* ---- LayerNormalization ------------------------------------------------ */

static void test_layernorm(void **state) {
    (void)state;
    int64_t s[] = {3, 2, 5}, ss[] = {2, 5};
    struct tensor x = mkf(3, s), sc = mkf(2, ss), b = mkf(2, ss), y = {0}, mean = {0}, inv = {0};
    struct tnode tn;
    tn_init(&tn, "LayerNormalization", 17);
    tn_int(&tn, "axis", 1);
    tn_float(&tn, "epsilon", 1e-3f);
    const struct tensor *in[3] = {&x, &sc, &b};
    struct tensor *out[3] = {&y, &mean, &inv};
    assert_int_equal(call(&tn, in, 3, out, 3, 1), 0);
    assert_int_equal(mean.ndim, 3);
    assert_int_equal(mean.dims[0], 3);
    assert_int_equal(mean.dims[1], 1);
    assert_int_equal(mean.dims[2], 1);
    for (int r = 0; r < 3; r++) {
        double mu = 0, var = 0;
        for (int j = 0; j < 10; j++) mu += F(x)[r * 10 + j];
        mu /= 10;
        for (int j = 0; j < 10; j++) var += (F(x)[r * 10 + j] - mu) * (F(x)[r * 10 + j] - mu);
        var /= 10;
        double is = 1 / sqrt(var + 1e-3);
        assert_float_equal(F(mean)[r], mu, 1e-5);
        assert_float_equal(F(inv)[r], is, 1e-4);
        for (int j = 0; j < 10; j++)
            assert_float_equal(F(y)[r * 10 + j], (F(x)[r * 10 + j] - mu) * is * F(sc)[j] + F(b)[j], 1e-4);
    }
    free(y.data);
    /* without bias and without the optional outputs */
    const struct tensor *in2[2] = {&x, &sc};
    struct tensor *out1[1] = {&y};
    assert_int_equal(call(&tn, in2, 2, out1, 1, 1), 0);
    free(y.data);
    /* a scale of the wrong size is refused */
    int64_t bad[] = {3};
    struct tensor sb = mkf(1, bad);
    const struct tensor *in3[2] = {&x, &sb};
    assert_int_not_equal(call(&tn, in3, 2, out1, 1, 1), 0);
    assert_non_null(strstr(g_err, "elements"));
    free(sb.data);
    free(x.data);
    free(sc.data);
    free(b.data);
    free(mean.data);
    free(inv.data);
}

/* Rows of every length from 1 to 70 (each ISA's vector width and ragged
 * end), with scale and bias, scale alone, and RMSNormalization, against a
 * double reference. */
static void test_norm_row_lengths(void **state) {
    (void)state;
    for (int64_t n = 1; n <= 70; n++) {
        for (int kind = 0; kind < 3; kind++) { /* 0 scale and bias, 1 scale, 2 RMS */
            int64_t s[] = {3, n}, ss[] = {n};
            struct tensor x = mkf(2, s), sc = mkf(1, ss), b = mkf(1, ss), y = {0};
            for (int64_t i = 0; i < 3 * n; i++) F(x)[i] = F(x)[i] * 3 + 0.5f;
            struct tnode tn;
            tn_init(&tn, kind == 2 ? "RMSNormalization" : "LayerNormalization", kind == 2 ? 23 : 17);
            const struct tensor *in[3] = {&x, &sc, &b};
            struct tensor *out[1] = {&y};
            assert_int_equal(call(&tn, in, kind == 0 ? 3 : 2, out, 1, 1), 0);
            for (int r = 0; r < 3; r++) {
                const float *xr = F(x) + r * n;
                double mu = 0, var = 0;
                for (int64_t j = 0; j < n && kind != 2; j++) mu += xr[j];
                mu /= (double)n;
                for (int64_t j = 0; j < n; j++) var += (xr[j] - mu) * (xr[j] - mu);
                double is = 1 / sqrt(var / (double)n + 1e-5);
                for (int64_t j = 0; j < n; j++) {
                    double want = (xr[j] - mu) * is * F(sc)[j] + (kind == 0 ? F(b)[j] : 0);
                    assert_float_equal(F(y)[r * n + j], want, 1e-4 * (1 + fabs(want)));
                }
            }
            free(x.data);
            free(sc.data);
            free(b.data);
            free(y.data);
        }
    }
}

/* ---- activations -------------------------------------------------------- */

static void test_activations(void **state) {
    (void)state;
    int64_t s[] = {64};
    struct tensor x = mkf(1, s), o = {0};
    for (int i = 0; i < 64; i++) F(x)[i] *= 6; /* [-6, 6] */
    struct tnode tn;
    const struct tensor *in[1] = {&x};
    struct tensor *out[1] = {&o};

    tn_init(&tn, "Gelu", 20);
    assert_int_equal(call(&tn, in, 1, out, 1, 1), 0);
    for (int i = 0; i < 64; i++) {
        double v = F(x)[i];
        assert_float_equal(F(o)[i], 0.5 * v * (1 + erf(v / sqrt(2.0))), 1e-5);
    }
    free(o.data);
    tn_str(&tn, "approximate", "tanh");
    assert_int_equal(call(&tn, in, 1, out, 1, 1), 0);
    for (int i = 0; i < 64; i++) {
        double v = F(x)[i];
        assert_float_equal(F(o)[i], 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))), 1e-5);
    }
    free(o.data);
    tn_init(&tn, "Gelu", 20);
    tn_str(&tn, "approximate", "fast");
    assert_int_not_equal(call(&tn, in, 1, out, 1, 1), 0);
    assert_non_null(strstr(g_err, "approximate"));

    tn_init(&tn, "LeakyRelu", 16);
    tn_float(&tn, "alpha", 0.1f);
    assert_int_equal(call(&tn, in, 1, out, 1, 1), 0);
    for (int i = 0; i < 64; i++) assert_float_equal(F(o)[i], F(x)[i] >= 0 ? F(x)[i] : 0.1f * F(x)[i], 1e-6);
    free(o.data);

    tn_init(&tn, "Softplus", 1);
    F(x)[0] = 100.0f; /* no overflow */
    assert_int_equal(call(&tn, in, 1, out, 1, 1), 0);
    assert_float_equal(F(o)[0], 100.0f, 1e-4);
    for (int i = 1; i < 64; i++) assert_float_equal(F(o)[i], log1p(exp(F(x)[i])), 1e-5);
    free(o.data);

    tn_init(&tn, "Sigmoid", 13);
    F(x)[0] = -100.0f;
    assert_int_equal(call(&tn, in, 1, out, 1, 1), 0);
    for (int i = 0; i < 64; i++) assert_float_equal(F(o)[i], 1 / (1 + exp(-(double)F(x)[i])), 1e-6);
    free(o.data);

    tn_init(&tn, "HardSwish", 14);
    assert_int_equal(call(&tn, in, 1, out, 1, 1), 0);
    for (int i = 0; i < 64; i++) {
        double v = F(x)[i];
        assert_float_equal(F(o)[i], v * fmax(0, fmin(1, v / 6 + 0.5)), 1e-6);
    }
    free(o.data);

    /* float-only operators refuse integers clearly */
    struct tensor xi = mk(DT_INT32, 1, s);
    const struct tensor *ini[1] = {&xi};
    tn_init(&tn, "Exp", 13);
    assert_int_equal(call(&tn, ini, 1, out, 1, 1), STATUS_UNSUPPORTED);
    assert_non_null(strstr(g_err, "int32"));
    free(xi.data);
    free(x.data);
}

/* The logistic family (sigmoid_vec.c with AVX-512 and AVX2, the plain
 * loops below that): Sigmoid, Swish, Gelu's two forms and the same as fused
 * activations, against double over [-110, 110] and the special values;
 * the tails of short rows give the same bits as the middle of a long one. */
static double logistic_want(int k, double v, double alpha) {
    double sig = 1 / (1 + exp(-alpha * v));
    switch (k) {
    case 0: return sig;
    case 1: return v * sig;
    case 2: return v / (1 + exp(-2 * sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))); /* 0.5 v (1 + tanh(u)) */
    default: return 0.5 * v * (1 + erf(v / sqrt(2.0)));
    }
}

static void logistic_run(int k, int fused, float alpha, const struct tensor *x, struct tensor *o) {
    struct tnode tn;
    if (fused) { /* x + 0 with the activation fused */
        int64_t one[] = {1};
        struct tensor z = mk(DT_FP32, 1, one);
        tn_init(&tn, "Add", 14);
        tn.n.act = k == 0 ? ACT_SIGMOID : k == 1 ? ACT_SILU : ACT_GELU;
        const struct tensor *in[2] = {x, &z};
        struct tensor *out[1] = {o};
        assert_int_equal(call(&tn, in, 2, out, 1, 1), 0);
        free(z.data);
        return;
    }
    tn_init(&tn, k == 0 ? "Sigmoid" : k == 1 ? "Swish" : "Gelu", k == 0 ? 13 : k == 1 ? 24 : 20);
    if (k == 1) tn_float(&tn, "alpha", alpha);
    if (k == 2) tn_str(&tn, "approximate", "tanh");
    const struct tensor *in[1] = {x};
    struct tensor *out[1] = {o};
    assert_int_equal(call(&tn, in, 1, out, 1, 1), 0);
}

static void test_logistic_family(void **state) {
    (void)state;
    enum { NLIN = 22001, NGEO = 4000, NSPEC = 9 };
    int64_t n = NLIN + 2 * NGEO + NSPEC;
    struct tensor x = mk(DT_FP32, 1, &n);
    float *xv = F(x);
    int64_t m = 0;
    for (int i = 0; i < NLIN; i++) xv[m++] = -110.0f + 0.01f * (float)i;
    for (int i = 0; i < NGEO; i++) { /* 1e-30 .. 100, both signs */
        float v = (float)pow(10.0, -30.0 + 32.0 * i / (NGEO - 1));
        xv[m++] = v;
        xv[m++] = -v;
    }
    const float spec[NSPEC] = {0.0f, -0.0f, NAN, INFINITY, -INFINITY, 1e-40f, -1e-40f, 88.72f, -88.72f};
    for (int i = 0; i < NSPEC; i++) xv[m++] = spec[i];
    assert_int_equal(m, n);
    for (int k = 0; k < 4; k++)
        for (int fused = 0; fused < 2; fused++) {
            if (fused && k == 2) continue; /* no fused tanh form */
            const float alpha = k == 1 && !fused ? 1.702f : 1.0f;
            struct tensor o = {0};
            logistic_run(k, fused, alpha, &x, &o);
            for (int64_t i = 0; i < n; i++) {
                const double v = xv[i], want = logistic_want(k, v, alpha), got = F(o)[i];
                if (isnan(want)) {
                    assert_true(isnan(got));
                    continue;
                }
                if (isinf(want)) {
                    assert_true(got == want);
                    continue;
                }
                /* 4 ulp of the result and of the exponential's float argument z
                 * (e^z moves by z's rounding), the erf approximation's 5e-7 for
                 * Gelu, and the exponential's results below the normal floats
                 * (0 there) times |v| */
                const double z = k <= 1 ? alpha * v : k == 2 ? 1.6 * (v + 0.044715 * v * v * v) : 0;
                const double tol = 2.4e-7 * fabs(want) * (1 + fabs(z)) + (k == 3 ? 3e-7 * fabs(v) : 0) +
                                   2 * FLT_MIN * (1 + fabs(v));
                if (fabs(got - want) > tol)
                    fail_msg("kind %d fused %d at %.9g: %.9g, want %.9g", k, fused, v, got, want);
            }
            /* rows of 1 to 40 values from two offsets: the same bits as the long row */
            for (int64_t len = 1; len <= 40; len++)
                for (int64_t off = 0; off < 2 * 23; off += 23) {
                    struct tensor xs = mk(DT_FP32, 1, &len), os = {0};
                    int64_t at = NLIN / 2 + off;
                    memcpy(xs.data, xv + at, (size_t)len * sizeof(float));
                    logistic_run(k, fused, alpha, &xs, &os);
                    assert_memory_equal(os.data, F(o) + at, (size_t)len * sizeof(float));
                    free(xs.data);
                    free(os.data);
                }
            free(o.data);
        }
    free(x.data);
}

/* ---- comparisons and logic ---------------------------------------------- */

static void test_compare_logic(void **state) {
    (void)state;
    int64_t s4[] = {4}, s1[] = {1};
    struct tensor a = mk(DT_UINT64, 1, s4), b = mk(DT_UINT64, 1, s1), o = {0};
    uint64_t av[] = {0, 5, UINT64_MAX, 6};
    memcpy(a.data, av, sizeof av);
    *(uint64_t *)b.data = 5;
    const char *ops[] = {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"};
    for (int k = 0; k < 5; k++) {
        assert_int_equal(call1(ops[k], 16, &a, &b, &o), 0);
        assert_int_equal(o.dtype, DT_BOOL);
        for (int i = 0; i < 4; i++) {
            uint64_t x = av[i];
            int e = k == 0 ? x == 5 : k == 1 ? x < 5 : k == 2 ? x > 5 : k == 3 ? x <= 5 : x >= 5;
            assert_int_equal(((uint8_t *)o.data)[i], e);
        }
        free(o.data);
    }
    struct tensor p = mk(DT_BOOL, 1, s4), q = mk(DT_BOOL, 1, s4);
    uint8_t pv[] = {0, 0, 1, 1}, qv[] = {0, 1, 0, 1};
    memcpy(p.data, pv, 4);
    memcpy(q.data, qv, 4);
    const char *lops[] = {"And", "Or", "Xor"};
    for (int k = 0; k < 3; k++) {
        assert_int_equal(call1(lops[k], 7, &p, &q, &o), 0);
        for (int i = 0; i < 4; i++) {
            int e = k == 0 ? pv[i] && qv[i] : k == 1 ? pv[i] || qv[i] : pv[i] != qv[i];
            assert_int_equal(((uint8_t *)o.data)[i], e);
        }
        free(o.data);
    }
    assert_int_equal(call1("Not", 1, &p, NULL, &o), 0);
    for (int i = 0; i < 4; i++) assert_int_equal(((uint8_t *)o.data)[i], !pv[i]);
    free(o.data);
    free(a.data);
    free(b.data);
    free(p.data);
    free(q.data);
}

static void test_pow_mixed(void **state) {
    (void)state;
    int64_t s3[] = {3}, s1[] = {1};
    struct tensor x = mk(DT_INT64, 1, s3), e = mk(DT_FP32, 1, s1), o = {0};
    int64_t xv[] = {2, 3, -4};
    memcpy(x.data, xv, sizeof xv);
    F(e)[0] = 2.0f;
    assert_int_equal(call1("Pow", 15, &x, &e, &o), 0);
    assert_int_equal(o.dtype, DT_INT64);
    int64_t ev[] = {4, 9, 16};
    for (int i = 0; i < 3; i++) assert_int_equal(((int64_t *)o.data)[i], ev[i]);
    free(o.data);
    free(x.data);
    free(e.data);
}

/* ---- quantization -------------------------------------------------------- */

/* DynamicQuantizeLinear's vector loops (every ISA under `make isa`) against
 * ONNX's definition computed here in double, one element at a time: odd
 * lengths for the tails, exact halves that round to even, values past
 * either end, NaN (0), all-zero input (scale 0). */
static void test_dynamic_quantize(void **state) {
    (void)state;
    static const int64_t lens[] = {1, 3, 17, 64, 1001};
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
        for (int kind = 0; kind < 3; kind++) { /* random, halves and specials, zeros */
            int64_t n = lens[li];
            struct tensor x = mk(DT_FP32, 1, &n), y = {0}, ys = {0}, yz = {0};
            float *xv = x.data;
            for (int64_t i = 0; i < n; i++) xv[i] = kind == 2 ? 0.0f : frand() * 3.0f;
            if (kind == 1 && n >= 3) {
                xv[0] = -1.0f;         /* min */
                xv[n - 1] = 1.55f;     /* max: scale 2.55 / 255 */
                for (int64_t i = 1; i + 1 < n; i++) xv[i] = (float)((i % 40) - 20) * 0.005f; /* halves of a step */
                xv[n / 2] = NAN;
            }
            struct tnode tn;
            tn_init(&tn, "DynamicQuantizeLinear", 11);
            const struct tensor *in[1] = {&x};
            struct tensor *out[3] = {&y, &ys, &yz};
            assert_int_equal(call(&tn, in, 1, out, 3, 1), 0);
            float mn = 0, mx = 0;
            for (int64_t i = 0; i < n; i++) {
                mn = xv[i] < mn ? xv[i] : mn;
                mx = xv[i] > mx ? xv[i] : mx;
            }
            float scale = (mx - mn) / 255.0f;
            double zd = scale > 0 ? nearbyint(0.0 - (double)(mn / scale)) : 0;
            zd = zd < 0 ? 0 : zd > 255 ? 255 : zd;
            assert_true(*(float *)ys.data == scale);
            assert_int_equal(*(uint8_t *)yz.data, (int)zd);
            for (int64_t i = 0; i < n; i++) {
                double v = scale > 0 ? nearbyint((double)(xv[i] / scale)) + zd : 0;
                v = v != v ? 0 : v < 0 ? 0 : v > 255 ? 255 : v;
                if (((uint8_t *)y.data)[i] != (uint8_t)v)
                    fail_msg("n %lld kind %d: y[%lld] = %d for x %g, expected %d", (long long)n, kind, (long long)i,
                             ((uint8_t *)y.data)[i], xv[i], (int)v);
            }
            free(x.data), free(y.data), free(ys.data), free(yz.data);
        }
}

static void test_quantize(void **state) {
    (void)state;
    /* per axis (axis 1 of [2, 3]) with zero points; halves round to even; saturation */
    int64_t d[] = {2, 3}, s3[] = {3};
    struct tensor x = mk(DT_FP32, 2, d), sc = mk(DT_FP32, 1, s3), zp = mk(DT_INT8, 1, s3), q = {0}, back = {0};
    float xv[] = {2.5f, 3.5f, -1000.0f, 1.0f, -0.5f, 1000.0f};
    float sv[] = {1.0f, 1.0f, 0.5f};
    int8_t zv[] = {0, 10, -5};
    memcpy(x.data, xv, sizeof xv);
    memcpy(sc.data, sv, sizeof sv);
    memcpy(zp.data, zv, sizeof zv);
    struct tnode tn;
    tn_init(&tn, "QuantizeLinear", 21);
    const struct tensor *in[3] = {&x, &sc, &zp};
    struct tensor *out[1] = {&q};
    assert_int_equal(call(&tn, in, 3, out, 1, 1), 0);
    assert_int_equal(q.dtype, DT_INT8);
    int8_t eq[] = {2, 14, -128, 1, 10, 127};
    for (int i = 0; i < 6; i++) assert_int_equal(((int8_t *)q.data)[i], eq[i]);
    tn_init(&tn, "DequantizeLinear", 21);
    const struct tensor *din[3] = {&q, &sc, &zp};
    struct tensor *dout[1] = {&back};
    assert_int_equal(call(&tn, din, 3, dout, 1, 1), 0);
    assert_int_equal(back.dtype, DT_FP32);
    for (int i = 0; i < 6; i++) assert_float_equal(F(back)[i], (eq[i] - zv[i % 3]) * sv[i % 3], 1e-6);
    free(q.data);
    free(back.data);
    /* blocked along axis 1 with block 2: scales [2, 2] */
    int64_t d4[] = {2, 4}, s22[] = {2, 2};
    struct tensor xb = mk(DT_FP32, 2, d4), sb = mk(DT_FP32, 2, s22);
    for (int i = 0; i < 8; i++) F(xb)[i] = (float)(i * 4);
    float sbv[] = {1, 2, 4, 8};
    memcpy(sb.data, sbv, sizeof sbv);
    tn_init(&tn, "QuantizeLinear", 21);
    tn_int(&tn, "axis", 1);
    tn_int(&tn, "block_size", 2);
    tn_int(&tn, "output_dtype", DT_INT16);
    const struct tensor *bin[2] = {&xb, &sb};
    assert_int_equal(call(&tn, bin, 2, out, 1, 1), 0);
    assert_int_equal(q.dtype, DT_INT16);
    for (int r = 0; r < 2; r++)
        for (int j = 0; j < 4; j++)
            assert_int_equal(((int16_t *)q.data)[r * 4 + j], (int)nearbyint((r * 4 + j) * 4.0 / sbv[r * 2 + j / 2]));
    free(q.data);
    /* a scale that fits neither per-tensor nor per-axis is refused */
    struct tensor bad = mk(DT_FP32, 1, (int64_t[]){5});
    const struct tensor *badin[2] = {&x, &bad};
    tn_init(&tn, "QuantizeLinear", 21);
    assert_int_not_equal(call(&tn, badin, 2, out, 1, 1), 0);
    assert_non_null(strstr(g_err, "scale"));
    free(bad.data);
    free(xb.data);
    free(sb.data);
    free(x.data);
    free(sc.data);
    free(zp.data);
}

/* ---- fused activation (OP_FUSE_ACT) ---------------------------------------- */

static void test_fused_activation(void **state) {
    (void)state;
    const struct op_def *d = op_find("", "Add");
    assert_true(d->flags & OP_FUSE_ACT);
    int64_t big[] = {64, 1024}, row[] = {1024};
    struct tensor a = mkf(2, big), b = mkf(1, row);
    enum act_kind acts[] = {ACT_RELU, ACT_LEAKY_RELU, ACT_CLIP, ACT_SIGMOID, ACT_QDQ};
    for (int k = 0; k < 5; k++)
        for (int threads = 1; threads <= 4; threads += 3) {
            struct tnode tn;
            tn_init(&tn, "Add", 14);
            tn.n.act = acts[k];
            tn.n.act_alpha = acts[k] == ACT_CLIP ? -0.25f : acts[k] == ACT_QDQ ? 0.0125f : 0.1f;
            /* ACT_QDQ: 256 steps of 0.0125 from -1.25 (int8, zero point -28): both clips reached */
            tn.n.act_beta = acts[k] == ACT_QDQ ? -100.0f : 0.5f;
            struct tensor o = {0};
            const struct tensor *in[2] = {&a, &b};
            struct tensor *out[1] = {&o};
            assert_int_equal(call(&tn, in, 2, out, 1, threads), 0);
            for (int64_t i = 0; i < 64 * 1024; i++) {
                float v = F(a)[i] + F(b)[i % 1024];
                assert_float_equal(F(o)[i], act_apply(acts[k], v, tn.n.act_alpha, tn.n.act_beta), 1e-6);
            }
            free(o.data);
        }
    /* an activation fused onto an integer output is refused */
    struct tensor ia = mk(DT_INT32, 1, row), o = {0};
    struct tnode tn;
    tn_init(&tn, "Add", 14);
    tn.n.act = ACT_RELU;
    const struct tensor *in[2] = {&ia, &ia};
    struct tensor *out[1] = {&o};
    assert_int_not_equal(call(&tn, in, 2, out, 1, 1), 0);
    assert_non_null(strstr(g_err, "fused activation"));
    free(o.data);
    free(ia.data);
    free(a.data);
    free(b.data);
}

/* ---- every op, every dtype: runs or refuses with a message ------------------ */

static void sweep_table(const struct op_def *table) {
    static const enum dtype dts[] = {DT_FP32, DT_FP64, DT_FP16, DT_BF16, DT_INT8,  DT_INT16, DT_INT32,
                                     DT_INT64, DT_UINT8, DT_UINT16, DT_UINT32, DT_UINT64, DT_BOOL, DT_STRING};
    static const struct tensor_str strs[6] = {TN_STR("a"), TN_STR("b"), TN_STR(""), TN_STR("abc"), TN_STR("b"), TN_STR("a\0")};
    int64_t d23[] = {2, 3}, d3[] = {3};
    int ran = 0, refused = 0;
    for (const struct op_def *op = table; op->op_type; op++)
        for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++)
            for (int nin = 1; nin <= 3; nin++)
                for (int opset = 11; opset <= 21; opset += 10) {
                    struct tensor in[3];
                    for (int i = 0; i < nin; i++) {
                        in[i] = mk(dts[k], i == 1 ? 1 : 2, i == 1 ? d3 : d23);
                        if (dts[k] == DT_STRING) {
                            memcpy(in[i].data, strs, sizeof strs[0] * (size_t)tensor_numel(&in[i]));
                        } else {
                            unsigned char *b = in[i].data;
                            for (size_t j = 0; j < tensor_nbytes(&in[i]); j++) b[j] = (unsigned char)(frand() * 127);
                            if (dts[k] == DT_BOOL)
                                for (size_t j = 0; j < tensor_nbytes(&in[i]); j++) b[j] &= 1;
                        }
                    }
                    struct tnode tn;
                    tn_init(&tn, op->op_type, opset);
                    struct tensor o[3] = {{0}, {0}, {0}};
                    struct tensor *out[3] = {&o[0], &o[1], &o[2]};
                    const struct tensor *pin[3] = {&in[0], &in[1], &in[2]};
                    int nout = strcmp(op->op_type, "LayerNormalization") == 0 ? 3 : 1;
                    int rc = call(&tn, pin, nin, out, nout, 1);
                    if (rc == 0) {
                        ran++;
                    } else {
                        refused++;
                        /* every refusal names the node and says why */
                        if (!strstr(g_err, "n0") || strlen(g_err) < 20)
                            fail_msg("%s %s x%d: status %d without a message: '%s'", op->op_type,
                                     dtype_name(dts[k]), nin, rc, g_err);
                    }
                    for (int i = 0; i < 3; i++) free(o[i].data);
                    for (int i = 0; i < nin; i++) free(in[i].data);
                }
    assert_true(ran > 100);
    assert_true(refused > 100);
}

static void test_sweep_all_ops(void **state) {
    (void)state;
    sweep_table(op_defs_elementwise);
    g_run_without_attrs = 0; /* the reduce family still reads some attributes in run() */
    sweep_table(op_defs_reduce);
    g_run_without_attrs = 1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_broadcast_patterns), cmocka_unit_test(test_broadcast_error),
        cmocka_unit_test(test_int_arith),          cmocka_unit_test(test_mod_signs),
        cmocka_unit_test(test_fp16_add_and_max),   cmocka_unit_test(test_variadic),
        cmocka_unit_test(test_clip_by_opset),      cmocka_unit_test(test_where),
        cmocka_unit_test(test_cast),               cmocka_unit_test(test_cast_strings),
        cmocka_unit_test(test_softmax_opsets), cmocka_unit_test(test_softmax_middle_axis),
        cmocka_unit_test(test_layernorm),          cmocka_unit_test(test_norm_row_lengths),          cmocka_unit_test(test_activations), cmocka_unit_test(test_logistic_family),
        cmocka_unit_test(test_compare_logic),      cmocka_unit_test(test_pow_mixed),
        cmocka_unit_test(test_quantize), cmocka_unit_test(test_dynamic_quantize),           cmocka_unit_test(test_fused_activation),
        cmocka_unit_test(test_sweep_all_ops),
    };
    g_run_without_attrs = 1;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
