/* test_ops_shape.c - the shape family through its op table entries (infer,
 * prepare, run, as a plan calls them) against reference loops written here:
 * Transpose over random permutations and element sizes (every fast path),
 * Slice with negative steps and clamped/INT64_MAX bounds, Expand and Tile
 * against index arithmetic, Reshape's 0/-1/allowzero and in-place aliasing,
 * Gather's negative and out-of-range indices, Concat/Split round trips by
 * opset, Pad's four modes, TopK ties, Resize on known answers, and the
 * clear refusal when a shape-deciding input is not constant. */
#include <limits.h>
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

static uint64_t g_rng = 0x2545f4914f6cdd1dull;
static uint64_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

static struct tensor mk(enum dtype dt, int ndim, const int64_t *dims) {
    struct tensor t = {dt, ndim, {0}, NULL};
    for (int i = 0; i < ndim; i++) t.dims[i] = dims[i];
    int64_t n = tensor_numel(&t);
    t.data = calloc((size_t)(n > 0 ? n : 1), dtype_size(dt));
    return t;
}

/* A tensor whose bytes are all distinct-ish, so misplaced elements show. */
static struct tensor mk_rand(enum dtype dt, int ndim, const int64_t *dims) {
    struct tensor t = mk(dt, ndim, dims);
    size_t n = tensor_nbytes(&t);
    for (size_t i = 0; i < n; i++) ((uint8_t *)t.data)[i] = (uint8_t)rnd();
    return t;
}

static struct tensor mk_i64(int n, const int64_t *v) {
    int64_t d = n;
    struct tensor t = mk(DT_INT64, 1, &d);
    memcpy(t.data, v, sizeof(int64_t) * (size_t)n);
    return t;
}

static struct tensor mk_f32(int ndim, const int64_t *dims, const float *v) {
    struct tensor t = mk(DT_FP32, ndim, dims);
    memcpy(t.data, v, tensor_nbytes(&t));
    return t;
}

#define F(t) ((float *)(t).data)
#define I64(t) ((int64_t *)(t).data)

static int call(struct tnode *tn, const struct tensor **in, int nin, struct tensor **out, int nout) {
    return tn_call(&tn->n, in, nin, out, nout, 1);
}

static int call1(struct tnode *tn, const struct tensor *a, const struct tensor *b, struct tensor *o) {
    const struct tensor *in[2] = {a, b};
    struct tensor *out[1] = {o};
    return call(tn, in, b ? 2 : 1, out, 1);
}

/* ---- Transpose ---------------------------------------------------------- */

/* Reference: out[o] = in[src(o)] element by element. */
static void check_transpose(enum dtype dt, int r, const int64_t *dims, int64_t *perm) {
    struct tensor x = mk_rand(dt, r, dims), o = {0};
    struct tnode tn;
    tn_init(&tn, "Transpose", 13);
    tn_ints(&tn, "perm", r, perm);
    assert_int_equal(call1(&tn, &x, NULL, &o), 0);
    assert_int_equal(o.ndim, r);
    int64_t xs[8], st = 1;
    for (int k = r - 1; k >= 0; k--) {
        xs[k] = st;
        st *= dims[k];
    }
    size_t es = dtype_size(dt);
    for (int64_t i = 0; i < tensor_numel(&o); i++) {
        int64_t rem = i, src = 0;
        for (int k = r - 1; k >= 0; k--) {
            assert_int_equal(o.dims[k], dims[perm[k]]);
            src += (rem % o.dims[k]) * xs[perm[k]];
            rem /= o.dims[k];
        }
        assert_memory_equal((char *)o.data + i * (int64_t)es, (char *)x.data + src * (int64_t)es, es);
    }
    free(x.data);
    free(o.data);
}

static void test_transpose_random(void **st) {
    (void)st;
    const enum dtype dts[] = {DT_UINT8, DT_FP16, DT_FP32, DT_INT64};
    for (int iter = 0; iter < 300; iter++) {
        int r = 1 + (int)(rnd() % 5);
        int64_t dims[8], perm[8];
        for (int k = 0; k < r; k++) {
            dims[k] = 1 + (int64_t)(rnd() % 6);
            if (rnd() % 7 == 0) dims[k] = 33 + (int64_t)(rnd() % 40); /* crosses the 32-wide tile */
            perm[k] = k;
        }
        for (int k = r - 1; k > 0; k--) {
            int j = (int)(rnd() % (uint64_t)(k + 1));
            int64_t t = perm[k];
            perm[k] = perm[j];
            perm[j] = t;
        }
        check_transpose(dts[iter % 4], r, dims, perm);
    }
    /* The transformer and layout permutations by name. */
    int64_t d4[4] = {2, 3, 37, 5}, p0213[4] = {0, 2, 1, 3}, p0231[4] = {0, 2, 3, 1}, p0132[4] = {0, 1, 3, 2};
    check_transpose(DT_FP32, 4, d4, p0213);
    check_transpose(DT_FP32, 4, d4, p0231);
    check_transpose(DT_FP32, 4, d4, p0132);
    /* Bytes in 8x8 blocks, with ragged edges in both directions. */
    int64_t b3[3] = {2, 37, 45}, p021[3] = {0, 2, 1}, b2a[2] = {64, 40}, b2b[2] = {9, 17}, p10[2] = {1, 0};
    check_transpose(DT_UINT8, 3, b3, p021);
    check_transpose(DT_UINT8, 2, b2a, p10);
    check_transpose(DT_UINT8, 2, b2b, p10);
    check_transpose(DT_UINT8, 4, d4, p0231);
}

static void test_transpose_bad_perm(void **st) {
    (void)st;
    int64_t d[2] = {2, 3}, perm[2] = {0, 0};
    struct tensor x = mk_rand(DT_FP32, 2, d), o = {0};
    struct tnode tn;
    tn_init(&tn, "Transpose", 13);
    tn_ints(&tn, "perm", 2, perm);
    assert_int_not_equal(call1(&tn, &x, NULL, &o), 0);
    assert_non_null(strstr(g_err, "permutation"));
    free(x.data);
}

/* NCHW -> NHWC of an input the layout planner stored channels-last
 * (kiln_layout 1): the output is the input's bytes under the new dims. */
static void test_transpose_layout_same_bytes(void **st) {
    (void)st;
    int64_t d[4] = {2, 5, 3, 4}, perm[4] = {0, 2, 3, 1};
    struct tensor x = mk_rand(DT_FP32, 4, d), o = {0};
    struct tnode tn;
    tn_init(&tn, "Transpose", 13);
    tn_ints(&tn, "perm", 4, perm);
    tn_int(&tn, "kiln_layout", 1);
    assert_int_equal(call1(&tn, &x, NULL, &o), 0);
    assert_int_equal(o.dims[1], 3);
    assert_int_equal(o.dims[3], 5);
    assert_memory_equal(o.data, x.data, tensor_nbytes(&x));
    free(x.data);
    free(o.data);
}

/* Node tn's output at two threads equals its output at one, byte for byte:
 * inputs large enough that the kernels split their loops (par_util.h). */
static void same_at_two_threads(struct tnode *tn, const struct tensor **in, int nin) {
    struct tensor o1 = {0}, o2 = {0};
    struct tensor *out1[1] = {&o1}, *out2[1] = {&o2};
    assert_int_equal(tn_call(&tn->n, in, nin, out1, 1, 1), 0);
    assert_int_equal(tn_call(&tn->n, in, nin, out2, 1, 2), 0);
    assert_true(tensor_same_shape(&o1, &o2));
    assert_memory_equal(o1.data, o2.data, tensor_nbytes(&o1));
    free(o1.data);
    free(o2.data);
}

static void test_split_loops_at_two_threads(void **st) {
    (void)st;
    int64_t d[4] = {2, 24, 40, 36}, perm[4] = {0, 2, 3, 1}, gd[2] = {1000, 64}, pads[4] = {1, 3, 2, 5};
    struct tensor x = mk_rand(DT_FP32, 4, d), g = mk_rand(DT_FP32, 2, gd);
    struct tnode tn;
    tn_init(&tn, "Transpose", 13);
    tn_ints(&tn, "perm", 4, perm);
    same_at_two_threads(&tn, (const struct tensor *[]){&x}, 1);
    int64_t idx[600];
    for (int i = 0; i < 600; i++) idx[i] = (i * 37) % 1000 - (i % 3 ? 0 : 1000);
    struct tensor it = mk_i64(600, idx);
    tn_init(&tn, "Gather", 13);
    same_at_two_threads(&tn, (const struct tensor *[]){&g, &it}, 2);
    tn_init(&tn, "Concat", 13);
    tn_int(&tn, "axis", 1);
    same_at_two_threads(&tn, (const struct tensor *[]){&g, &g}, 2);
    struct tensor pt = mk_i64(4, pads);
    tn_init(&tn, "Pad", 13);
    tn_str(&tn, "mode", "reflect");
    same_at_two_threads(&tn, (const struct tensor *[]){&g, &pt}, 2);
    free(x.data);
    free(g.data);
    free(it.data);
    free(pt.data);
}

/* ---- Reshape family ------------------------------------------------------- */

static void test_reshape(void **st) {
    (void)st;
    int64_t d[3] = {2, 3, 4};
    struct tensor x = mk_rand(DT_FP32, 3, d), o = {0};
    struct tnode tn;
    tn_init(&tn, "Reshape", 13);
    int64_t s1[3] = {0, -1, 2};
    struct tensor sh = mk_i64(3, s1);
    assert_int_equal(call1(&tn, &x, &sh, &o), 0);
    assert_int_equal(o.ndim, 3);
    assert_int_equal(o.dims[0], 2);
    assert_int_equal(o.dims[1], 6);
    assert_int_equal(o.dims[2], 2);
    assert_memory_equal(o.data, x.data, tensor_nbytes(&x));
    free(o.data);
    free(sh.data);

    /* allowzero: a 0 is a real zero, so 24 elements cannot become [0, 24]. */
    int64_t s2[2] = {0, 24};
    sh = mk_i64(2, s2);
    tn_init(&tn, "Reshape", 14);
    tn_int(&tn, "allowzero", 1);
    o = (struct tensor){0};
    assert_int_equal(call1(&tn, &x, &sh, &o), STATUS_INVALID);
    assert_non_null(strstr(g_err, "cannot reshape"));
    free(sh.data);

    int64_t s3[2] = {-1, -1};
    sh = mk_i64(2, s3);
    tn_init(&tn, "Reshape", 13);
    assert_int_equal(call1(&tn, &x, &sh, &o), STATUS_INVALID);
    assert_non_null(strstr(g_err, "more than one -1"));

    /* A shape computed at run time is refused with its own status and a
     * message, not guessed (the model then runs with the values known). */
    void *keep = sh.data;
    sh.data = NULL;
    assert_int_equal(call1(&tn, &x, &sh, &o), STATUS_DATA_DEPENDENT);
    assert_non_null(strstr(g_err, "run time"));
    free(keep);
    free(x.data);
}

/* OP_ALIAS_INPUT0 ops must be right when the output is the input. */
static void test_alias_in_place(void **st) {
    (void)st;
    const char *ops[] = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"};
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
        const struct op_def *d = op_find("", ops[k]);
        assert_non_null(d);
        assert_true(d->flags & OP_ALIAS_INPUT0);
    }
    int64_t d[2] = {1, 5};
    struct tensor x = mk_rand(DT_FP32, 2, d), o = {0};
    unsigned char copy[20];
    memcpy(copy, x.data, 20);
    struct tnode tn;
    tn_init(&tn, "Squeeze", 13);
    struct op_call c;
    op_call_init(&c, &tn.n, 1, g_err, sizeof g_err);
    c.nin = 1;
    c.nout = 1;
    c.in[0] = &x;
    c.out[0] = &o;
    const struct op_def *sq = op_find("", "Squeeze");
    assert_int_equal(sq->infer(&c), 0);
    assert_int_equal(o.ndim, 1);
    o.data = x.data;
    assert_int_equal(sq->run(&c), 0);
    assert_memory_equal(x.data, copy, 20);
    free(x.data);
}

static void test_squeeze_unsqueeze_by_opset(void **st) {
    (void)st;
    int64_t d[3] = {1, 3, 1}, axes[1] = {-1};
    struct tensor x = mk_rand(DT_INT32, 3, d), o = {0}, ax = mk_i64(1, axes);
    struct tnode tn;
    tn_init(&tn, "Squeeze", 11);
    tn_ints(&tn, "axes", 1, axes);
    assert_int_equal(call1(&tn, &x, NULL, &o), 0);
    assert_int_equal(o.ndim, 2);
    free(o.data);
    tn_init(&tn, "Squeeze", 13);
    o = (struct tensor){0};
    assert_int_equal(call1(&tn, &x, &ax, &o), 0);
    assert_int_equal(o.ndim, 2);
    assert_int_equal(o.dims[1], 3);
    free(o.data);
    /* squeezing a dimension that is not 1 */
    int64_t a1[1] = {1};
    struct tensor ax1 = mk_i64(1, a1);
    assert_int_equal(call1(&tn, &x, &ax1, &o), STATUS_INVALID);
    assert_non_null(strstr(g_err, "size 3"));
    int64_t ua[2] = {0, -1};
    struct tensor uax = mk_i64(2, ua);
    tn_init(&tn, "Unsqueeze", 13);
    o = (struct tensor){0};
    assert_int_equal(call1(&tn, &x, &uax, &o), 0);
    assert_int_equal(o.ndim, 5);
    assert_int_equal(o.dims[0], 1);
    assert_int_equal(o.dims[2], 3);
    assert_int_equal(o.dims[4], 1);
    free(o.data);
    free(x.data);
    free(ax.data);
    free(ax1.data);
    free(uax.data);
}

/* ---- Slice --------------------------------------------------------------- */

static int64_t clampi(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }

static void test_slice_random(void **st) {
    (void)st;
    const int64_t specials[] = {INT64_MAX, INT64_MIN, -1000, 1000};
    for (int iter = 0; iter < 400; iter++) {
        int64_t n = 1 + (int64_t)(rnd() % 12), d[2] = {3, n};
        struct tensor x = mk_rand(DT_INT32, 2, d), o = {0};
        int64_t s = (int64_t)(rnd() % 30) - 15, e = (int64_t)(rnd() % 30) - 15, p = (int64_t)(rnd() % 7) - 3;
        if (p == 0) p = 1;
        if (rnd() % 5 == 0) e = specials[rnd() % 4];
        if (rnd() % 5 == 0) s = specials[rnd() % 4];
        int64_t axes[1] = {-1};
        struct tensor ts = mk_i64(1, &s), te = mk_i64(1, &e), ta = mk_i64(1, axes), tp = mk_i64(1, &p);
        struct tnode tn;
        tn_init(&tn, "Slice", 13);
        const struct tensor *in[5] = {&x, &ts, &te, &ta, &tp};
        struct tensor *out[1] = {&o};
        assert_int_equal(call(&tn, in, 5, out, 1), 0);
        /* numpy's rules, written out */
        int64_t ss = s < 0 ? s + n : s, ee = e < 0 ? e + n : e;
        int64_t idx[64], m = 0;
        if (p > 0) {
            ss = clampi(ss, 0, n);
            ee = clampi(ee, 0, n);
            for (int64_t i = ss; i < ee; i += p) idx[m++] = i;
        } else {
            ss = clampi(ss, 0, n - 1);
            ee = clampi(ee, -1, n - 1);
            for (int64_t i = ss; i > ee; i += p) idx[m++] = i;
        }
        assert_int_equal(o.dims[0], 3);
        assert_int_equal(o.dims[1], m);
        for (int r = 0; r < 3; r++)
            for (int64_t j = 0; j < m; j++)
                assert_int_equal(((int32_t *)o.data)[r * m + j], ((int32_t *)x.data)[r * n + idx[j]]);
        free(x.data);
        free(o.data);
        free(ts.data);
        free(te.data);
        free(ta.data);
        free(tp.data);
    }
}

static void test_slice_opset1_attrs(void **st) {
    (void)st;
    int64_t d[2] = {4, 5}, s[2] = {1, 0}, e[2] = {-1, 1000};
    struct tensor x = mk_rand(DT_FP32, 2, d), o = {0};
    struct tnode tn;
    tn_init(&tn, "Slice", 1);
    tn_ints(&tn, "starts", 2, s);
    tn_ints(&tn, "ends", 2, e);
    assert_int_equal(call1(&tn, &x, NULL, &o), 0);
    assert_int_equal(o.dims[0], 2);
    assert_int_equal(o.dims[1], 5);
    assert_memory_equal(o.data, F(x) + 5, 10 * sizeof(float));
    free(x.data);
    free(o.data);
}

/* ---- Expand, Tile, Concat, Split ------------------------------------------ */

static void test_expand_tile(void **st) {
    (void)st;
    int64_t d[3] = {3, 1, 2}, shp[4] = {2, 1, 4, 2};
    struct tensor x = mk_rand(DT_FP32, 3, d), o = {0}, s = mk_i64(4, shp);
    struct tnode tn;
    tn_init(&tn, "Expand", 13);
    assert_int_equal(call1(&tn, &x, &s, &o), 0);
    assert_int_equal(o.ndim, 4);
    assert_int_equal(o.dims[1], 3);
    for (int64_t i = 0; i < tensor_numel(&o); i++) {
        int64_t k = i % 2, c = (i / 8) % 3; /* [2,3,4,2]: last dim k, dim 1 c */
        assert_memory_equal(&F(o)[i], &F(x)[c * 2 + k], 4);
    }
    free(o.data);
    int64_t rep[3] = {2, 3, 1};
    struct tensor r = mk_i64(3, rep);
    tn_init(&tn, "Tile", 13);
    o = (struct tensor){0};
    assert_int_equal(call1(&tn, &x, &r, &o), 0);
    assert_int_equal(o.dims[0], 6);
    assert_int_equal(o.dims[1], 3);
    assert_int_equal(o.dims[2], 2);
    for (int64_t a = 0; a < 6; a++)
        for (int64_t b = 0; b < 3; b++)
            for (int64_t c = 0; c < 2; c++)
                assert_memory_equal(&F(o)[(a * 3 + b) * 2 + c], &F(x)[(a % 3) * 2 + c], 4);
    free(o.data);
    free(r.data);
    free(s.data);
    free(x.data);
}

static void test_concat_split_roundtrip(void **st) {
    (void)st;
    int64_t da[3] = {2, 3, 4}, db[3] = {2, 5, 4};
    struct tensor a = mk_rand(DT_FP16, 3, da), b = mk_rand(DT_FP16, 3, db), cat = {0};
    struct tnode tn;
    tn_init(&tn, "Concat", 13);
    tn_int(&tn, "axis", -2);
    assert_int_equal(call1(&tn, &a, &b, &cat), 0);
    assert_int_equal(cat.dims[1], 8);
    /* back apart with the split sizes as an attribute (opset 11) and as an input (13) */
    for (int opset = 11; opset <= 13; opset += 2) {
        struct tensor p0 = {0}, p1 = {0};
        int64_t sizes[2] = {3, 5};
        struct tensor sz = mk_i64(2, sizes);
        tn_init(&tn, "Split", opset);
        tn_int(&tn, "axis", 1);
        if (opset < 13) tn_ints(&tn, "split", 2, sizes);
        const struct tensor *in[2] = {&cat, &sz};
        struct tensor *out[2] = {&p0, &p1};
        assert_int_equal(call(&tn, in, opset < 13 ? 1 : 2, out, 2), 0);
        assert_memory_equal(p0.data, a.data, tensor_nbytes(&a));
        assert_memory_equal(p1.data, b.data, tensor_nbytes(&b));
        free(p0.data);
        free(p1.data);
        free(sz.data);
    }
    /* opset 18: num_outputs splits unevenly, the last part smaller */
    struct tensor q[3] = {{0}, {0}, {0}};
    tn_init(&tn, "Split", 18);
    tn_int(&tn, "axis", 1);
    tn_int(&tn, "num_outputs", 3);
    const struct tensor *in1[1] = {&cat};
    struct tensor *out3[3] = {&q[0], &q[1], &q[2]};
    assert_int_equal(call(&tn, in1, 1, out3, 3), 0);
    assert_int_equal(q[0].dims[1], 3);
    assert_int_equal(q[1].dims[1], 3);
    assert_int_equal(q[2].dims[1], 2);
    for (int i = 0; i < 3; i++) free(q[i].data);
    /* mismatched shapes get a message naming both */
    int64_t dc[3] = {3, 3, 4};
    struct tensor cc = mk_rand(DT_FP16, 3, dc), bad = {0};
    tn_init(&tn, "Concat", 13);
    tn_int(&tn, "axis", 1);
    assert_int_equal(call1(&tn, &a, &cc, &bad), STATUS_INVALID);
    assert_non_null(strstr(g_err, "[3,3,4]"));
    free(cc.data);
    free(a.data);
    free(b.data);
    free(cat.data);
}

/* ---- Gather ------------------------------------------------------------------ */

static void test_gather(void **st) {
    (void)st;
    int64_t d[2] = {3, 4};
    struct tensor x = mk_rand(DT_FP32, 2, d), o = {0};
    int64_t iv[3] = {-1, 0, 2};
    struct tensor idx = mk_i64(3, iv);
    struct tnode tn;
    tn_init(&tn, "Gather", 13);
    tn_int(&tn, "axis", 1);
    assert_int_equal(call1(&tn, &x, &idx, &o), 0);
    assert_int_equal(o.dims[0], 3);
    assert_int_equal(o.dims[1], 3);
    for (int r = 0; r < 3; r++) {
        assert_memory_equal(&F(o)[r * 3 + 0], &F(x)[r * 4 + 3], 4);
        assert_memory_equal(&F(o)[r * 3 + 1], &F(x)[r * 4 + 0], 4);
        assert_memory_equal(&F(o)[r * 3 + 2], &F(x)[r * 4 + 2], 4);
    }
    free(o.data);
    ((int64_t *)idx.data)[1] = 4;
    o = (struct tensor){0};
    assert_int_equal(call1(&tn, &x, &idx, &o), STATUS_INVALID);
    assert_non_null(strstr(g_err, "index 4 is out of range [-4, 4) on axis 1"));
    free(o.data);
    free(idx.data);
    free(x.data);
}

/* ---- Pad -------------------------------------------------------------------- */

static void test_pad_modes(void **st) {
    (void)st;
    int64_t d[1] = {4}, pads[2] = {3, 2};
    float v[4] = {1, 2, 3, 4};
    struct tensor x = mk_f32(1, d, v), p = mk_i64(2, pads);
    const char *modes[4] = {"constant", "reflect", "edge", "wrap"};
    const float want[4][9] = {
        {0, 0, 0, 1, 2, 3, 4, 0, 0},
        {4, 3, 2, 1, 2, 3, 4, 3, 2},
        {1, 1, 1, 1, 2, 3, 4, 4, 4},
        {2, 3, 4, 1, 2, 3, 4, 1, 2},
    };
    for (int m = 0; m < 4; m++) {
        struct tensor o = {0};
        struct tnode tn;
        tn_init(&tn, "Pad", 19);
        tn_str(&tn, "mode", modes[m]);
        assert_int_equal(call1(&tn, &x, &p, &o), 0);
        assert_int_equal(o.dims[0], 9);
        for (int i = 0; i < 9; i++) assert_float_equal(F(o)[i], want[m][i], 0);
        free(o.data);
    }
    /* negative pads crop */
    int64_t crop[2] = {-1, -2};
    struct tensor pc = mk_i64(2, crop), o = {0};
    struct tnode tn;
    tn_init(&tn, "Pad", 13);
    assert_int_equal(call1(&tn, &x, &pc, &o), 0);
    assert_int_equal(o.dims[0], 1);
    assert_float_equal(F(o)[0], 2, 0);
    free(o.data);
    free(pc.data);
    free(p.data);
    free(x.data);
}

/* ---- TopK, Resize ---------------------------------------------------------- */

static void test_topk_ties(void **st) {
    (void)st;
    int64_t d[1] = {6}, k = 3;
    float v[6] = {1, 5, 3, 5, 0, 3};
    struct tensor x = mk_f32(1, d, v), kt = mk_i64(1, &k), val = {0}, idx = {0};
    struct tnode tn;
    tn_init(&tn, "TopK", 11);
    const struct tensor *in[2] = {&x, &kt};
    struct tensor *out[2] = {&val, &idx};
    assert_int_equal(call(&tn, in, 2, out, 2), 0);
    /* equal values keep the lower index first */
    assert_float_equal(F(val)[0], 5, 0);
    assert_float_equal(F(val)[2], 3, 0);
    assert_int_equal(I64(idx)[0], 1);
    assert_int_equal(I64(idx)[1], 3);
    assert_int_equal(I64(idx)[2], 2);
    free(val.data);
    free(idx.data);
    tn_init(&tn, "TopK", 11);
    tn_int(&tn, "largest", 0);
    val = (struct tensor){0};
    idx = (struct tensor){0};
    assert_int_equal(call(&tn, in, 2, out, 2), 0);
    assert_int_equal(I64(idx)[0], 4);
    assert_int_equal(I64(idx)[1], 0);
    assert_int_equal(I64(idx)[2], 2);
    free(val.data);
    free(idx.data);
    free(x.data);
    free(kt.data);
}

/* A few of many (the heap path): the same values and indices as a full
 * stable sort by hand, ties (every value appears 7 times) included, for
 * the largest and the smallest. */
static void test_topk_few_of_many(void **st) {
    (void)st;
    enum { N = 1000, K = 12 };
    int64_t d[1] = {N}, k = K;
    float v[N];
    for (int i = 0; i < N; i++) v[i] = (float)((i * 37) % 143);
    struct tensor x = mk_f32(1, d, v), kt = mk_i64(1, &k);
    for (int largest = 0; largest < 2; largest++) {
        struct tensor val = {0}, idx = {0};
        struct tnode tn;
        tn_init(&tn, "TopK", 11);
        tn_int(&tn, "largest", largest);
        const struct tensor *in[2] = {&x, &kt};
        struct tensor *out[2] = {&val, &idx};
        assert_int_equal(call(&tn, in, 2, out, 2), 0);
        /* By hand: walk the values from the best down, indices rising. */
        int got = 0;
        for (int t = 0; t < 143 && got < K; t++) {
            float want = (float)(largest ? 142 - t : t);
            for (int i = 0; i < N && got < K; i++)
                if (v[i] == want) {
                    assert_float_equal(F(val)[got], want, 0);
                    assert_int_equal(I64(idx)[got], i);
                    got++;
                }
        }
        assert_int_equal(got, K);
        free(val.data);
        free(idx.data);
    }
    free(x.data);
    free(kt.data);
}

static void test_resize_known(void **st) {
    (void)st;
    int64_t d[4] = {1, 1, 2, 2};
    float v[4] = {1, 2, 3, 4};
    struct tensor x = mk_f32(4, d, v);
    int64_t sd[1] = {4};
    float sv[4] = {1, 1, 2, 2};
    struct tensor sc = mk_f32(1, sd, sv), o = {0};
    struct tnode tn;
    tn_init(&tn, "Resize", 13);
    tn_str(&tn, "mode", "nearest");
    const struct tensor *in[3] = {&x, NULL, &sc};
    struct tensor *out[1] = {&o};
    assert_int_equal(call(&tn, in, 3, out, 1), 0);
    const float nearest[16] = {1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4};
    for (int i = 0; i < 16; i++) assert_float_equal(F(o)[i], nearest[i], 0);
    free(o.data);
    /* linear with align_corners: the corners stay, the middle is the mean */
    int64_t sz[4] = {1, 1, 3, 3};
    struct tensor szt = mk_i64(4, sz);
    tn_init(&tn, "Resize", 13);
    tn_str(&tn, "mode", "linear");
    tn_str(&tn, "coordinate_transformation_mode", "align_corners");
    const struct tensor *in2[4] = {&x, NULL, NULL, &szt};
    o = (struct tensor){0};
    assert_int_equal(call(&tn, in2, 4, out, 1), 0);
    const float lin[9] = {1, 1.5f, 2, 2, 2.5f, 3, 3, 3.5f, 4};
    for (int i = 0; i < 9; i++) assert_float_equal(F(o)[i], lin[i], 1e-6);
    free(o.data);
    free(szt.data);
    free(sc.data);
    free(x.data);
}

/* Moving ops carry string elements ({pointer, length}); value-making ops refuse them. */
static void test_strings_move(void **st) {
    (void)st;
    struct tensor_str words[6] = {TN_STR("a"), TN_STR("bb"), TN_STR("ccc"), TN_STR("dddd"), TN_STR("eeeee"), TN_STR("ffffff")};
    struct tensor x = {DT_STRING, 2, {2, 3}, words}, o = {0};
    int64_t perm[2] = {1, 0};
    struct tnode tn;
    tn_init(&tn, "Transpose", 13);
    tn_ints(&tn, "perm", 2, perm);
    assert_int_equal(call1(&tn, &x, NULL, &o), 0);
    const struct tensor_str *s = tensor_strs(&o);
    assert_tstr(s[0], "a");
    assert_tstr(s[1], "dddd");
    assert_tstr(s[5], "ffffff");
    free(o.data);
    int64_t iv[2] = {1, -1};
    struct tensor idx = mk_i64(2, iv);
    tn_init(&tn, "Gather", 13);
    tn_int(&tn, "axis", 1);
    o = (struct tensor){0};
    assert_int_equal(call1(&tn, &x, &idx, &o), 0);
    s = tensor_strs(&o);
    assert_tstr(s[0], "bb");
    assert_tstr(s[1], "ccc");
    assert_tstr(s[3], "ffffff");
    free(o.data);
    int64_t pads[4] = {0, 1, 0, 0};
    struct tensor p = mk_i64(4, pads);
    tn_init(&tn, "Pad", 13);
    o = (struct tensor){0};
    assert_int_equal(call1(&tn, &x, &p, &o), STATUS_INVALID);
    assert_non_null(strstr(g_err, "string"));
    free(p.data);
    free(idx.data);
}

/* KV-cache appends: each batch entry writes at its own index; linear mode
 * refuses to run past the cache, circular mode wraps. */
static void test_tensor_scatter(void **st) {
    (void)st;
    int64_t dc[3] = {2, 4, 2}, du[3] = {2, 2, 2};
    struct tensor past = mk(DT_FP32, 3, dc), upd = mk(DT_FP32, 3, du), o = {0};
    for (int i = 0; i < 8; i++) F(upd)[i] = (float)(i + 1);
    int64_t wv[2] = {1, 3};
    struct tensor wi = mk_i64(2, wv);
    struct tnode tn;
    tn_init(&tn, "TensorScatter", 24);
    tn_str(&tn, "mode", "circular");
    const struct tensor *in[3] = {&past, &upd, &wi};
    struct tensor *out[1] = {&o};
    assert_int_equal(call(&tn, in, 3, out, 1), 0);
    /* batch 0 rows 1,2 = 1 2 | 3 4; batch 1 rows 3,0 = 5 6 | 7 8 */
    const float want[16] = {0, 0, 1, 2, 3, 4, 0, 0, 7, 8, 0, 0, 0, 0, 5, 6};
    for (int i = 0; i < 16; i++) assert_float_equal(F(o)[i], want[i], 0);
    free(o.data);
    tn_init(&tn, "TensorScatter", 24);
    o = (struct tensor){0};
    assert_int_equal(call(&tn, in, 3, out, 1), STATUS_INVALID);
    assert_non_null(strstr(g_err, "exceeds the cache length 4"));
    free(o.data);
    free(past.data);
    free(upd.data);
    free(wi.data);
}

static void test_unique_and_nonzero(void **st) {
    (void)st;
    int64_t d[1] = {7};
    float v[7] = {2, 1, 1, 3, 4, 3, 0};
    struct tensor x = mk_f32(1, d, v), y = {0}, idx = {0}, inv = {0}, cnt = {0};
    struct tnode tn;
    tn_init(&tn, "Unique", 11);
    tn_int(&tn, "sorted", 0);
    const struct tensor *in[1] = {&x};
    struct tensor *out[4] = {&y, &idx, &inv, &cnt};
    assert_int_equal(call(&tn, in, 1, out, 4), 0);
    const float wy[5] = {2, 1, 3, 4, 0};
    const int64_t widx[5] = {0, 1, 3, 4, 6}, winv[7] = {0, 1, 1, 2, 3, 2, 4}, wcnt[5] = {1, 2, 2, 1, 1};
    assert_int_equal(y.dims[0], 5);
    for (int i = 0; i < 5; i++) {
        assert_float_equal(F(y)[i], wy[i], 0);
        assert_int_equal(I64(idx)[i], widx[i]);
        assert_int_equal(I64(cnt)[i], wcnt[i]);
    }
    for (int i = 0; i < 7; i++) assert_int_equal(I64(inv)[i], winv[i]);
    free(y.data);
    free(idx.data);
    free(inv.data);
    free(cnt.data);
    /* a run-time input cannot decide a plan's shapes */
    void *keep = x.data;
    x.data = NULL;
    tn_init(&tn, "NonZero", 13);
    struct tensor nz = {0};
    struct tensor *out1[1] = {&nz};
    assert_int_equal(call(&tn, in, 1, out1, 1), STATUS_DATA_DEPENDENT);
    assert_non_null(strstr(g_err, "NonZero"));
    x.data = keep;
    assert_int_equal(call(&tn, in, 1, out1, 1), 0);
    assert_int_equal(nz.dims[0], 1);
    assert_int_equal(nz.dims[1], 6);
    assert_int_equal(I64(nz)[5], 5);
    free(nz.data);
    free(x.data);
}

static void test_shape_and_size(void **st) {
    (void)st;
    struct tensor x = {DT_FP32, 4, {2, 3, 5, 7}, NULL}, o = {0};
    struct tnode tn;
    tn_init(&tn, "Shape", 15);
    tn_int(&tn, "start", 1);
    tn_int(&tn, "end", -1);
    assert_true(op_find("", "Shape")->flags & OP_SHAPE_ONLY);
    assert_int_equal(call1(&tn, &x, NULL, &o), 0);
    assert_int_equal(o.dims[0], 2);
    assert_int_equal(I64(o)[0], 3);
    assert_int_equal(I64(o)[1], 5);
    free(o.data);
    tn_init(&tn, "Size", 13);
    o = (struct tensor){0};
    assert_int_equal(call1(&tn, &x, NULL, &o), 0);
    assert_int_equal(o.ndim, 0);
    assert_int_equal(I64(o)[0], 210);
    free(o.data);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transpose_random),     cmocka_unit_test(test_transpose_bad_perm),
        cmocka_unit_test(test_transpose_layout_same_bytes), cmocka_unit_test(test_split_loops_at_two_threads),
        cmocka_unit_test(test_reshape),              cmocka_unit_test(test_alias_in_place),
        cmocka_unit_test(test_squeeze_unsqueeze_by_opset), cmocka_unit_test(test_slice_random),
        cmocka_unit_test(test_slice_opset1_attrs),   cmocka_unit_test(test_expand_tile),
        cmocka_unit_test(test_concat_split_roundtrip), cmocka_unit_test(test_gather),
        cmocka_unit_test(test_pad_modes),            cmocka_unit_test(test_topk_ties),
        cmocka_unit_test(test_topk_few_of_many),
        cmocka_unit_test(test_resize_known),         cmocka_unit_test(test_shape_and_size),
        cmocka_unit_test(test_strings_move),         cmocka_unit_test(test_tensor_scatter),
        cmocka_unit_test(test_unique_and_nonzero),
    };
    g_run_without_attrs = 1;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
